"""`kubectl gpu-scheduler plan` on files: every output form, malformed input, several documents,
stdin; exit codes; how explain names a pod; --version and --help; the installed console script,
`python -m`, and kubectl's plugin lookup."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from kubectl_gpu_scheduler.cli import UsageError, main, pod_named
from localcp.cluster import BIN

SEED_FILE = str(REPO / "check" / "statefulset.yaml")
SEED = yaml.safe_load((REPO / "check" / "statefulset.yaml").read_text())
SCRIPT = Path(sys.executable).parent / "kubectl-gpu_scheduler"


def run(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdin=io.BytesIO(stdin.encode()), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, *documents, name="w.yaml") -> str:
    path = tmp_path / name
    path.write_text("---\n".join(d if isinstance(d, str) else yaml.safe_dump(d) for d in documents))
    return str(path)


def with_map(text: str, replicas: int = 5, name: str = "gpu-scheduler-check", **spec) -> dict:
    obj = json.loads(json.dumps(SEED))
    obj["metadata"]["name"] = name
    obj["spec"]["replicas"] = replicas
    obj["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] = text
    obj["spec"].update(spec)
    return obj


def table_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("INDEX"))
    return [line.split() for line in lines[start + 1:] if line and line[0].isdigit()]


SEED_ROWS = [("0", "gpu-scheduler-check-0", "node1", "0,1"), ("1", "gpu-scheduler-check-1", "node2", "2"),
             ("2", "gpu-scheduler-check-2", "node3", "0,1,2"), ("3", "gpu-scheduler-check-3", "node4", "3"),
             ("4", "gpu-scheduler-check-4", "node4", "3")]


def test_the_seed_statefulset_table_fits_100_columns(monkeypatch):
    monkeypatch.chdir(REPO)
    code, out, err = run("plan", "-f", "check/statefulset.yaml")
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == ("StatefulSet default/gpu-scheduler-check (check/statefulset.yaml, document 1;"
                                   " replicas 5)")
    assert out.splitlines()[1].split() == ["INDEX", "POD", "NODE", "CUDA_VISIBLE_DEVICES", "STATUS"]
    assert [tuple(r) for r in table_rows(out)] == [(*r, "ok") for r in SEED_ROWS]
    assert "warning: pod gpu-scheduler-check-3: pod index 3 shares GPUs on node4: device 3 also to index 4" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_wide_adds_the_nvidia_mode_column():
    code, out, _ = run("plan", "-f", SEED_FILE, "-o", "wide")
    assert code == 0
    assert out.splitlines()[1].split() == ["INDEX", "POD", "NODE", "CUDA_VISIBLE_DEVICES", "NVIDIA", "MODE", "STATUS"]
    assert [tuple(r[:4]) for r in table_rows(out)] == SEED_ROWS
    assert table_rows(out)[3][4:] == ["NVIDIA_VISIBLE_DEVICES=3", "CUDA_VISIBLE_DEVICES=0", "ok"]
    narrow = run("plan", "-f", SEED_FILE)[1].splitlines()
    assert [line for line in out.splitlines() if not line[:1].isalnum()] == [
        line for line in narrow if not line[:1].isalnum()], "the notes below the table are the same"


@pytest.mark.parametrize("form,load", [("json", json.loads), ("yaml", yaml.safe_load)])
def test_json_and_yaml_say_the_same(form, load):
    code, out, _ = run("plan", "-f", SEED_FILE, "-o", form)
    answer = load(out)
    assert code == 0 and answer["placeable"] is True
    [work] = answer["workloads"]
    assert (work["kind"], work["namespace"], work["name"], work["document"]) == ("StatefulSet", "default",
                                                                                "gpu-scheduler-check", 1)
    assert (work["replicas"], work["indexed"], work["ordinalsStart"]) == (5, True, 0)
    assert [(p["index"], p["node"], p["devices"], p["placeable"]) for p in work["pods"]] == [
        (0, "node1", ["0", "1"], True), (1, "node2", ["2"], True), (2, "node3", ["0", "1", "2"], True),
        (3, "node4", ["3"], True), (4, "node4", ["3"], True)]
    assert work["pods"][1]["env"] == {"cuda": {"CUDA_VISIBLE_DEVICES": "2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                                      "nvidia": {"NVIDIA_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0",
                                                 "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
    assert work["pods"][3]["warnings"][0]["reason"] == "SharedDevices"
    assert "cluster" not in work["pods"][0], "offline, nothing is said about the cluster"


def sentences(value, key=None):
    """Every string in a JSON answer with a space in it, outside the `message`s."""
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in sentences(v, k)]
    if isinstance(value, list):
        return [s for v in value for s in sentences(v, key)]
    return [value] if isinstance(value, str) and " " in value and key != "message" else []


@pytest.mark.parametrize("form,load", [("json", json.loads), ("yaml", yaml.safe_load)])
def test_json_and_yaml_carry_data_not_sentences(tmp_path, form, load):
    template = SEED["spec"]["template"]
    uuid = "GPU-0a1b2c3d-0000-1111-2222-333344445555"
    docs = [with_map(f"3=node1:0\n4=node2:{uuid}", replicas=3, name="s", ordinals={"start": 3}),
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
             "spec": {"completionMode": "Indexed", "completions": 2, "template": template}},
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "n"}, "spec": {"template": template}},
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p-3", **template["metadata"]},
             "spec": template["spec"]}]
    code, out, _ = run("plan", "-f", write(tmp_path, *docs), "-o", form)
    answer = load(out)
    assert code == 1 and answer["placeable"] is False
    assert [(w["kind"], w["replicas"], w["indexed"], w["ordinalsStart"], w["placeable"])
            for w in answer["workloads"]] == [("StatefulSet", 3, True, 3, False), ("Job", 2, True, None, True),
                                              ("Job", None, False, None, False), ("Pod", 1, False, None, True)]
    statefulset = answer["workloads"][0]["pods"]
    assert [(p["index"], p["node"], p["devices"], p["mode"]) for p in statefulset] == [
        (3, "node1", ["0"], None), (4, "node2", [uuid], None), (5, None, [], None)]
    assert answer["workloads"][2]["pods"][0]["index"] is None
    assert sentences(answer) == []


@pytest.mark.parametrize("form", ["table", "json", "yaml"])
def test_a_malformed_map_exits_2_naming_file_document_and_line(tmp_path, form):
    path = write(tmp_path, {"kind": "ConfigMap", "metadata": {"name": "c"}},
                 with_map("0=node1:0\n1=node2:2,2\n2=node3:x"))
    code, out, err = run("plan", "-f", path, "-o", form)
    assert code == 2 and out == ""
    assert err == (f"error: {path}: document 2 (StatefulSet default/gpu-scheduler-check): invalid gpu-scheduling-map"
                   " annotation: line 2 '1=node2:2,2': device 2 is listed more than once; line 3 '2=node3:x':"
                   " device 'x' is neither a non-negative integer nor a GPU-<uuid>/MIG-<uuid> identifier\n")


def test_multi_document_files_plan_each_workload_and_report_each_error(tmp_path):
    path = write(tmp_path, with_map("0=node1:0\n1=node2:1", replicas=2, name="a"),
                 "kind: Service\nmetadata: {name: s}\nspec: {}\n", "",
                 with_map("0=node1:0\n0=node2:1", name="bad"),
                 with_map("5=node3:1", replicas=1, name="c", ordinals={"start": 5}))
    code, out, err = run("plan", "-f", path, "-o", "json")
    assert code == 2, "one document is malformed"
    assert [(w["name"], w["document"]) for w in json.loads(out)["workloads"]] == [("a", 1), ("c", 5)]
    assert json.loads(out)["workloads"][1]["pods"][0]["pod"] == "c-5"
    assert err.count("\n") == 1 and "document 4 (StatefulSet default/bad)" in err and "line 2" in err


def test_stdin_and_several_files_in_order(tmp_path):
    second = write(tmp_path, with_map("0=node2:3", replicas=1, name="b"))
    code, out, err = run("plan", "-f", "-", "-f", second, "-o", "yaml", stdin=Path(SEED_FILE).read_text())
    answer = yaml.safe_load(out)
    assert code == 0 and err == ""
    assert [(w["source"], w["name"]) for w in answer["workloads"]] == [("-", "gpu-scheduler-check"), (second, "b")]
    code, out, _ = run("plan", "-f", "-", stdin=Path(SEED_FILE).read_text())
    assert out.splitlines()[0].endswith("(stdin, document 1; replicas 5)")


def test_a_directory_reads_its_manifests(tmp_path):
    write(tmp_path, with_map("0=node1:0", replicas=1, name="x"), name="a.yaml")
    write(tmp_path, with_map("0=node2:0", replicas=1, name="y"), name="b.json")
    (tmp_path / "notes.txt").write_text("not a manifest")
    code, out, _ = run("plan", "-f", str(tmp_path), "-o", "json")
    assert code == 0 and [w["name"] for w in json.loads(out)["workloads"]] == ["x", "y"]


def test_exit_1_when_a_replica_would_not_be_placed(tmp_path):
    code, out, err = run("plan", "-f", write(tmp_path, with_map("0=node1:0\n1=node2:1", replicas=3)))
    assert (code, err) == (1, "")
    assert table_rows(out)[2] == ["2", "gpu-scheduler-check-2", "<none>", "<none>", "NoMapEntry"]
    assert "not placed: pod gpu-scheduler-check-2: pod index 2 has no entry" in out
    assert "warning: pod indexes 2 have no map entry: those pods will stay Pending" in out


def test_entries_beyond_the_replicas_are_a_warning_not_a_failure(tmp_path):
    code, out, _ = run("plan", "-f", write(tmp_path, with_map("0=node1:0\n1=node2:1\n7=node3:1", replicas=2)))
    assert code == 0 and "warning: map entries 7 are beyond the pod indexes of replicas 2: no pod uses them" in out


def test_a_selector_contradiction_is_not_placeable(tmp_path):
    obj = with_map("0=node1:0", replicas=1)
    obj["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "node2"}
    code, out, _ = run("plan", "-f", write(tmp_path, obj))
    assert code == 1 and "NodeAffinity" in out
    assert "node(s) didn't match Pod's node affinity/selector: nodeSelector {kubernetes.io/hostname=node2}" in out


def test_jobs_pods_and_lists(tmp_path):
    template = SEED["spec"]["template"]
    docs = [{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
             "spec": {"completionMode": "Indexed", "completions": 2, "template": template}},
            {"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p-3", "namespace": "team", **template["metadata"]},
                 "spec": template["spec"]}]}]
    code, out, _ = run("plan", "-f", write(tmp_path, *docs), "-o", "json")
    work = json.loads(out)["workloads"]
    assert code == 0
    assert [(w["kind"], w["namespace"], [(p["index"], p["pod"], p["node"]) for p in w["pods"]]) for w in work] == [
        ("Job", "default", [(0, "j-0-*", "node1"), (1, "j-1-*", "node2")]), ("Pod", "team", [(3, "p-3", "node4")])]


def test_namespace_flag_defaults_and_must_agree(tmp_path):
    obj = with_map("0=node1:0", replicas=1)
    obj["metadata"].pop("namespace", None)
    code, out, _ = run("plan", "-f", write(tmp_path, obj), "-n", "team", "-o", "json")
    assert code == 0 and json.loads(out)["workloads"][0]["namespace"] == "team"
    code, out, _ = run("plan", "-f", write(tmp_path, obj), "-o", "json")
    assert code == 0 and json.loads(out)["workloads"][0]["namespace"] == "default"
    code, _, err = run("plan", "-f", SEED_FILE, "-n", "team")
    assert code == 2 and "the namespace of the object (default) does not match --namespace team" in err


@pytest.mark.parametrize("content,message", [
    ("kind: StatefulSet\nmetadata: {name: x\n", "document 1: invalid YAML at line 3, column 1"),
    ("a: 1\n---\n- [\n", "document 2: invalid YAML at line 4"),
    ("- 1\n- 2\n", "document 1: expected a Kubernetes object, found a list"),
    ("kind: StatefulSet\nmetadata: {name: x}\nspec: {replicas: -1, template: {spec: {}}}\n",
     "spec.replicas: expected a non-negative integer, found -1"),
    ("kind: Service\nmetadata: {name: s}\n", "no Pod, StatefulSet, Job, JobSet, LeaderWorkerSet or Deployment with the"
                                            " gpu-scheduling-map annotation"),
    ("", "no Pod, StatefulSet, Job, JobSet, LeaderWorkerSet or Deployment with the gpu-scheduling-map annotation"),
])
def test_malformed_manifests_exit_2_with_one_line(tmp_path, content, message):
    path = tmp_path / "m.yaml"
    path.write_text(content)
    code, out, err = run("plan", "-f", str(path))
    assert code == 2 and out == "" and message in err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


def test_unreadable_input_exits_2(tmp_path):
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00")
    for argv, message in [(["plan", "-f", str(tmp_path / "missing.yaml")], "No such file or directory"),
                          (["plan", "-f", str(tmp_path / "bin.yaml")], "not UTF-8 text (byte 0)"),
                          (["plan", "-f", str(tmp_path / "empty-dir")], "No such file or directory")]:
        code, _, err = run(*argv)
        assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv,message", [
    ([], "the following arguments are required: COMMAND"),
    (["plan"], "the following arguments are required: -f/--filename"),
    (["plan", "-f", SEED_FILE, "-o", "name"], "argument -o/--output: invalid choice: 'name'"),
    (["explain", "p", "-o", "wide"], "argument -o/--output: invalid choice: 'wide'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["explain"], "the following arguments are required: POD"),
])
def test_usage_errors_exit_2_with_one_line(argv, message):
    code, out, err = run(*argv)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_cluster_mode_without_a_kubeconfig_exits_2(tmp_path):
    code, _, err = run("plan", "-f", SEED_FILE, "--cluster", "--kubeconfig", str(tmp_path / "none"))
    assert code == 2 and err == f"error: kubeconfig: kubeconfig {tmp_path / 'none'} does not exist\n"


def test_cluster_mode_with_the_api_down_exits_2_in_bounded_time(unreachable_kubeconfig):
    server = json.loads(unreachable_kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    code, _, err = run("plan", "-f", SEED_FILE, "--cluster", "--kubeconfig", str(unreachable_kubeconfig))
    assert (code, err) == (2, f"error: cannot reach the Kubernetes API at {server}: Connection refused\n")


@pytest.mark.parametrize("words", [["p-0"], ["pod/p-0"], ["pods/p-0"], ["po/p-0"], ["Pod/p-0"], ["pod", "p-0"],
                                   ["po", "p-0"]])
def test_explain_names_a_pod_as_kubectl_does(words):
    assert pod_named(words) == "p-0"


@pytest.mark.parametrize("words,message", [
    (["deployment/d"], 'explain shows pods, not "deployment": name one as NAME, pod/NAME or pod NAME'),
    (["svc", "s"], 'explain shows pods, not "svc"'),
    (["pod/"], '"" is not a pod name'),
    (["/p-0"], 'explain shows pods, not ""'),
    (["pod/a/b"], "a pod named in TYPE/NAME form has one slash, as in pod/NAME"),
    (["pod/P-0"], '"P-0" is not a pod name (a DNS-1123 subdomain'),
    (["pod", "a", "b"], "explain takes one pod: NAME, pod/NAME or pod NAME"),
])
def test_explain_refuses_what_is_not_one_pod_before_reading_the_kubeconfig(tmp_path, words, message):
    code, out, err = run("explain", *words, "--kubeconfig", str(tmp_path / "none"))
    assert (code, out) == (2, "") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["explain", "pod/p", "-n", "Team"], ["explain", "--namespace=a_b", "p"],
                                  ["plan", "-f", SEED_FILE, "-nTeam"]])
def test_a_namespace_that_cannot_exist_exits_2(argv):
    code, out, err = run(*argv)
    assert (code, out) == (2, "") and "is not a namespace name (a DNS-1123 label" in err


def test_explain_takes_the_namespace_anywhere_as_kubectl(unreachable_kubeconfig):
    for argv in (["-n", "team", "pod/p-0"], ["pod/p-0", "--namespace=team"], ["-nteam", "pod", "p-0"]):
        code, _, err = run("explain", *argv, "--kubeconfig", str(unreachable_kubeconfig))
        assert code == 2 and err.startswith("error: cannot reach the Kubernetes API"), "past the arguments"


def test_version_is_the_packages():
    code, out, err = run("--version")
    assert (code, out, err) == (0, f"kubectl-gpu_scheduler version v{metadata.version('gpu-scheduler')}\n", "")


@pytest.mark.parametrize("command", ["plan", "explain", "suggest"])
def test_each_command_has_a_description_and_examples(command):
    code, out, err = run(command, "--help")
    assert (code, err) == (0, "")
    usage, description, *_ = out.split("\n\n")
    assert usage.startswith(f"usage: kubectl gpu-scheduler {command} ") and len(description.split()) > 10
    examples = out[out.index("\nexamples:\n"):]
    assert f"  kubectl gpu-scheduler {command} " in examples and "\nexit status:\n  0  " in examples
    assert max(len(line) for line in out.splitlines()) <= 100
    assert f"    {command}  " in run("--help")[1], "the top-level help lists the command"


def test_an_unknown_context_exits_2(unreachable_kubeconfig):
    code, _, err = run("explain", "p", "--kubeconfig", str(unreachable_kubeconfig), "--context", "nope")
    assert code == 2 and "context 'nope' does not exist" in err


# -- the installed command ------------------------------------------------------------------------
def test_the_console_script_and_python_m_print_the_same():
    script = subprocess.run([str(SCRIPT), "plan", "-f", "check/statefulset.yaml"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    module = subprocess.run([sys.executable, "-m", "kubectl_gpu_scheduler", "plan", "-f", "check/statefulset.yaml"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert script.returncode == module.returncode == 0
    assert script.stdout == module.stdout and [r[2] for r in table_rows(script.stdout)] == [
        "node1", "node2", "node3", "node4", "node4"]


def test_the_script_reads_stdin_and_fails_without_traceback():
    bad = (REPO / "check" / "statefulset.yaml").read_text().replace("1=node2:2", "1=node2:")
    done = subprocess.run([str(SCRIPT), "plan", "-f", "-", "-o", "json"], input=bad, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("error: stdin: document 1 (StatefulSet default/gpu-scheduler-check): invalid"
                           " gpu-scheduling-map annotation: line 2 '1=node2:': the device list after ':' is empty\n")


def test_the_script_survives_a_closed_pipe():
    done = subprocess.run(f"'{SCRIPT}' plan -f check/statefulset.yaml -o yaml | head -1", shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout == "workloads:\n" and done.stderr == ""


@pytest.mark.skipif(not (BIN / "kubectl").exists(), reason="kubectl is built by localcp/build.sh (make controlplane)")
def test_kubectl_finds_the_plugin_on_path():
    env = {**os.environ, "PATH": f"{SCRIPT.parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([str(BIN / "kubectl"), "gpu-scheduler", "plan", "-f", "check/statefulset.yaml"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [(r[2], r[3]) for r in table_rows(done.stdout)] == [
        ("node1", "0,1"), ("node2", "2"), ("node3", "0,1,2"), ("node4", "3"), ("node4", "3")]
    listed = subprocess.run([str(BIN / "kubectl"), "plugin", "list"], env=env, capture_output=True, text=True)
    assert str(SCRIPT) in listed.stdout


def test_the_readme_shows_what_the_command_prints(monkeypatch):
    monkeypatch.chdir(REPO)
    _, out, _ = run("plan", "-f", "check/statefulset.yaml")
    assert f"$ kubectl gpu-scheduler plan -f check/statefulset.yaml\n{out}```" in (REPO / "README.md").read_text()


def test_plan_names_each_dra_replicas_claim_and_class(tmp_path):
    """Offline, a DRA-mode workload's rows name the claim bind will create for each replica; the
    class is the pod's annotation, else --dra-device-class (as bind's setting)."""
    obj = json.loads(json.dumps(SEED))
    obj["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler/device-env"] = "dra"
    path = write(tmp_path, obj)
    code, out, err = run("plan", "-f", path, "-o", "json", "--dra-device-class", "test-driver.cdi.k8s.io")
    rows = json.loads(out)["workloads"][0]["pods"]
    assert (code, err) == (0, "")
    assert [r["claim"] for r in rows[:2]] == [
        {"name": "gpu-scheduler-check-0-gpus", "deviceClass": "test-driver.cdi.k8s.io"},
        {"name": "gpu-scheduler-check-1-gpus", "deviceClass": "test-driver.cdi.k8s.io"}]
    code, out, _ = run("plan", "-f", path)
    assert ("claim: pod gpu-scheduler-check-0: ResourceClaim default/gpu-scheduler-check-0-gpus"
            " (DeviceClass gpu.nvidia.com)") in out


def test_bad_dra_device_rules_are_a_usage_error():
    code, out, err = run("plan", "-f", SEED_FILE, "--dra-device-rules", '{"gpu.nvidia.com": {"name": "gpu"}}')
    assert (code, out) == (2, "")
    assert err.startswith("error: --dra-device-rules: ") and "{index}" in err


@pytest.mark.parametrize("argv,message", [
    (["--gpus", "0"], "error: --gpus 0: each replica needs at least 1 GPU; give --gpus 1 or more\n"),
    (["--gpus", "1", "--spread", "--pack"], "argument --pack: not allowed with argument --spread"),
    (["--gpus", "1", "--in-place", "-f", "-"], "error: --in-place edits a file: give -f FILE, not stdin\n"),
])
def test_suggest_refuses_a_bad_request_before_reading_the_cluster(unreachable_kubeconfig, argv, message):
    code, out, err = run("suggest", "-f", SEED_FILE, *argv, "--kubeconfig", str(unreachable_kubeconfig))
    assert (code, out) == (2, "") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("manifest,message", [
    ({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"},
      "spec": {"template": {"spec": {"schedulerName": "gpu-scheduler", "containers": []}}}},
     "DaemonSet default/d: a DaemonSet's pods are named with generateName, so a map cannot name them;"
     " suggest places the replicas of a StatefulSet, a Job with completionMode: Indexed, a JobSet's replicated"
     " jobs, a LeaderWorkerSet or a Deployment (its pool)"),
    ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
      "spec": {"replicas": 0, "template": {"spec": {"schedulerName": "gpu-scheduler", "containers": []}}}},
     "Deployment default/d: spec.replicas is 0, so there is nothing to place; set spec.replicas to 1 or more"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
     "no StatefulSet, Indexed Job, JobSet, LeaderWorkerSet or Deployment to place"),
    (with_map("0=node1:0", replicas=0), "spec.replicas is 0, so there is nothing to place; set spec.replicas to 1"),
])
def test_suggest_names_the_fix_for_a_manifest_it_cannot_place(tmp_path, unreachable_kubeconfig, manifest, message):
    code, out, err = run("suggest", "-f", write(tmp_path, manifest), "--gpus", "1",
                         "--kubeconfig", str(unreachable_kubeconfig))
    assert (code, out) == (2, "") and message in err and err.count("\n") == 1


def test_suggest_prints_the_manifest_as_people_write_it():
    """-o yaml: the map as a literal block, the keys in the manifest's order; -o json: one object,
    or a List of several."""
    from kubectl_gpu_scheduler.output import manifest_text

    obj = with_map("0=node1:0,1\n1=node2:2\n", replicas=2)
    text = manifest_text([obj], "yaml")
    assert "gpu-scheduling-map: |\n          0=node1:0,1\n          1=node2:2\n" in text
    assert text.index("apiVersion") < text.index("kind") < text.index("metadata") < text.index("spec")
    assert yaml.safe_load(text) == obj
    assert json.loads(manifest_text([obj], "json")) == obj
    both = json.loads(manifest_text([obj, obj], "json"))
    assert (both["kind"], both["items"]) == ("List", [obj, obj])
    assert list(yaml.safe_load_all(manifest_text([obj, obj], "yaml"))) == [obj, obj]


# -- gangs (docs/gangs.md) --------------------------------------------------------------------------
ORDERED_READY = ("a StatefulSet with podManagementPolicy: OrderedReady creates one pod at a time and never forms a gang;"
                 " set podManagementPolicy: Parallel")


def gang_manifest(value="true", **spec) -> dict:
    obj = with_map(SEED["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"], **spec)
    obj["spec"]["template"]["metadata"]["annotations"]["gpu-scheduler/gang"] = value
    return obj


def test_plan_shows_the_gang_its_size_and_members(tmp_path):
    code, out, err = run("plan", "-f", write(tmp_path, gang_manifest()))
    assert (code, err) == (0, "")
    assert ("  gang default/gpu-scheduler-check: 5 members, bound together or none:"
            " gpu-scheduler-check-0 ... gpu-scheduler-check-4\n") in out
    assert "OrderedReady" not in out  # the seed's podManagementPolicy is Parallel
    code, out, _ = run("plan", "-f", write(tmp_path, gang_manifest("3")), "-o", "json")
    gang = json.loads(out)["workloads"][0]["gang"]
    assert {k: gang[k] for k in ("name", "size", "bound", "missing", "verdict")} == {
        "name": "default/gpu-scheduler-check", "size": 3, "bound": [], "missing": 0, "verdict": None}
    assert gang["members"][0] == {"name": "default/gpu-scheduler-check-0", "state": "expected", "node": "node1",
                                  "plugin": None, "message": None}
    assert len(gang["members"]) == 5
    code, out, _ = run("plan", "-f", write(tmp_path, with_map("0=node1:0")), "-o", "json")
    assert "gang" not in json.loads(out)["workloads"][0]


@pytest.mark.parametrize("policy", [None, "OrderedReady"])
def test_plan_warns_of_a_statefulset_that_never_forms_a_gang(tmp_path, policy):
    obj = gang_manifest()
    obj["spec"].pop("podManagementPolicy", None)
    if policy:
        obj["spec"]["podManagementPolicy"] = policy
    code, out, _ = run("plan", "-f", write(tmp_path, obj))
    assert code == 0 and f"  warning: {ORDERED_READY}\n" in out
    code, out, _ = run("plan", "-f", write(tmp_path, obj), "-o", "json")
    assert {"reason": "GangOrderedReady", "message": ORDERED_READY} in json.loads(out)["workloads"][0]["warnings"]


def test_plan_refuses_a_malformed_gang_naming_the_fix(tmp_path):
    code, _, err = run("plan", "-f", write(tmp_path, gang_manifest("all")))
    assert code == 2 and "gpu-scheduler/gang: 'all' is not a gang size: set gpu-scheduler/gang to \"true\"" in err


BLOCKED = ("gang ns/w: 3 of 5 members placeable; member w-3: GPU 3 on node4 is held by team-a/x-0 (another"
           " workload; ...)")


def gang_answer() -> dict:
    """explain's answer for a member of a gang that a holder of node4's GPU 3 blocks (as -o json gives it)."""
    members = [{"name": f"ns/w-{i}", "state": "placeable", "node": n, "plugin": None, "message": None}
               for i, n in enumerate(("node1", "node2", "node3"))]
    members += [{"name": f"ns/w-{i}", "state": "refused", "node": "node4", "plugin": "GPUsHeld",
                 "message": "GPU 3 on node4 is held by team-a/x-0"} for i in (3, 4)]
    return {"namespace": "ns", "name": "w-0", "node": None, "index": 0, "entry": "0=node1:0,1", "env": {},
            "podScheduled": None, "events": [],
            "gang": {"name": "ns/w", "size": 5, "bound": [], "missing": 0, "members": members,
                     "verdict": {"plugin": "Gang", "reason": "GangMemberRefused", "message": BLOCKED}},
            "scheduling": {"action": "wait", "node": "node4", "plugin": "Gang", "reason": "GangMemberRefused",
                           "message": BLOCKED, "retriedOn": ["a GPU freed"]},
            "placeable": False}


def test_explain_shows_the_gang_its_members_states_and_its_refusal():
    from kubectl_gpu_scheduler.output import explain_table
    text = explain_table(gang_answer())
    assert "Gang:           ns/w (5 members bound together or none; 0 bound)\n" in text
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("  MEMBER")))
    assert [line.split()[:3] for line in lines[start + 1:start + 6]] == [
        ["ns/w-0", "placeable", "node1"], ["ns/w-1", "placeable", "node2"], ["ns/w-2", "placeable", "node3"],
        ["ns/w-3", "refused", "node4"], ["ns/w-4", "refused", "node4"]]
    assert lines[start + 4].endswith("GPUsHeld: GPU 3 on node4 is held by team-a/x-0")
    assert f"Scheduling:     waits in bind's queue, refused by Gang: {BLOCKED}\n" in text
    assert "the gang waits" not in text  # said once, as the pod's own verdict


def test_explain_of_a_gang_that_binds_and_of_one_missing_members():
    from kubectl_gpu_scheduler.output import explain_table
    answer = gang_answer()
    for member in answer["gang"]["members"]:
        member.update(state="placeable", plugin=None, message=None)
    answer["gang"]["verdict"] = {"plugin": None, "reason": "Bind", "message": "bind 5 members together"}
    answer["scheduling"] = {"action": "bind", "node": "node1", "plugin": None, "reason": "Bind",
                            "message": "bind to node1", "retriedOn": []}
    assert "  the gang: bind 5 members together\n" in explain_table(answer)
    answer["gang"].update(members=answer["gang"]["members"][:3], missing=2, bound=["ns/w-2"])
    assert "Gang:           ns/w (5 members bound together or none; 1 bound, 2 missing)\n" in explain_table(answer)


def test_plan_cluster_table_says_the_gangs_refusal_once():
    from kubectl_gpu_scheduler.output import plan_table
    gang = gang_answer()["gang"]
    pods = [{"index": i, "pod": f"w-{i}", "node": m["node"], "devices": ["0"], "env": {"cuda": {}, "nvidia": {}},
             "placeable": False, "problems": [], "warnings": [],
             "cluster": {"decision": "wait", "plugin": "Gang", "reason": "GangMemberRefused", "message": BLOCKED}}
            for i, m in enumerate(gang["members"])]
    answer = {"workloads": [{"source": "w.yaml", "document": 1, "kind": "StatefulSet", "namespace": "ns", "name": "w",
                             "replicas": 5, "indexed": True, "ordinalsStart": None, "placeable": False, "pods": pods,
                             "warnings": [], "gang": gang}], "placeable": False}
    text = plan_table(answer)
    assert [row[-2:] for row in table_rows(text)] == [["Gang", "now"]] * 5
    assert text.count(BLOCKED) == 1 and f"  gang not placeable now: {BLOCKED}\n" in text
    assert "  member w-3 refused by GPUsHeld: GPU 3 on node4 is held by team-a/x-0\n" in text


# -- JobSet and LeaderWorkerSet ------------------------------------------------------------------------
JOBSET_AND_LWS = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: train, namespace: team}
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 2
        completions: 2
        template:
          metadata:
            annotations: {gpu-scheduler/gang: "true", gpu-scheduling-map: "0=node1:0,1\\n1=node1:2,3\\n2=node2:0,1\\n3=node2:2,3\\n"}
          spec: {schedulerName: gpu-scheduler, restartPolicy: Never, containers: [{name: c, image: i}]}
  - name: driver
    template:
      spec:
        template:
          metadata:
            annotations: {gpu-scheduler/gang: "true", gpu-scheduling-map: "0=node3:0\\n"}
          spec: {schedulerName: gpu-scheduler, restartPolicy: Never, containers: [{name: c, image: i}]}
---
apiVersion: leaderworkerset.x-k8s.io/v1
kind: LeaderWorkerSet
metadata: {name: infer, namespace: team}
spec:
  replicas: 2
  leaderWorkerTemplate:
    size: 3
    workerTemplate:
      metadata:
        annotations: {gpu-scheduler/gang: "true", gpu-scheduling-map: "0=node1:0\\n1=node1:1\\n2=node1:2\\n3=node2:0\\n4=node2:1\\n5=node2:2\\n"}
      spec: {schedulerName: gpu-scheduler, containers: [{name: c, image: i}]}
"""


def test_plan_lists_every_pod_of_a_jobset_and_a_leaderworkerset_with_its_gang(tmp_path):
    code, out, err = run("plan", "-f", write(tmp_path, JOBSET_AND_LWS))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == ("JobSet team/train, replicated job workers (" + str(tmp_path / "w.yaml") + ", document 1;"
                        " replicas 2 × completions 2 = 4 pods; index: JobSet (job-index × completions + completion"
                        " index))")
    assert lines[2].split() == ["0", "train-workers-0-0-*", "node1", "0,1", "ok"]
    assert lines[5].split() == ["3", "train-workers-1-1-*", "node2", "2,3", "ok"]
    assert ("  gang team/train: 5 members, bound together or none: train-workers-0-0-* ... train-driver-0-0-*"
            in lines)
    assert "  Kueue counts gpu-scheduler.io/gpu: 2 per pod (every entry's)" in lines
    driver = lines.index(next(line for line in lines if "replicated job driver" in line))
    assert lines[driver + 2].split() == ["0", "train-driver-0-0-*", "node3", "0", "ok"]
    lws = lines[lines.index(next(l for l in lines if l.startswith("LeaderWorkerSet"))):]
    assert lws[0].endswith("; replicas 2 × size 3 = 6 pods; index: LeaderWorkerSet (group-index × size +"
                           " worker-index, the leader worker 0))")
    assert lws[1].split() == ["INDEX", "POD", "NODE", "CUDA_VISIBLE_DEVICES", "GANG", "STATUS"]
    assert [row.split()[:3] for row in lws[2:8]] == [["0", "infer-0", "node1"], ["1", "infer-0-1", "node1"],
                                                     ["2", "infer-0-2", "node1"], ["3", "infer-1", "node2"],
                                                     ["4", "infer-1-1", "node2"], ["5", "infer-1-2", "node2"]]
    assert lws[8:10] == ["  gang team/infer group 0: 3 members, bound together or none: infer-0 ... infer-0-2",
                         "  gang team/infer group 1: 3 members, bound together or none: infer-1 ... infer-1-2"]
    code, out, _ = run("plan", "-f", write(tmp_path, JOBSET_AND_LWS), "-o", "json")
    workers, driver, infer = json.loads(out)["workloads"]
    assert (workers["replicatedJob"], workers["groups"], workers["groupSize"], workers["indexSource"]) == (
        "workers", 2, 2, "JobSet")
    assert [p["gang"] for p in infer["pods"]] == ["team/infer group 0"] * 3 + ["team/infer group 1"] * 3
    assert [g["name"] for g in infer["gangs"]] == ["team/infer group 0", "team/infer group 1"]
    assert infer["gang"] == infer["gangs"][0] and "gangs" not in workers


def test_plan_names_the_field_of_a_malformed_jobset(tmp_path):
    bad = JOBSET_AND_LWS.replace("replicas: 2\n    template", 'replicas: "2"\n    template')
    code, _, err = run("plan", "-f", write(tmp_path, bad))
    assert code == 2 and ('document 1: spec.replicatedJobs[0].replicas: expected a non-negative integer, found "2"'
                          in err)


# -- Deployments: pools (issue 44) -------------------------------------------------------------------------
POOL_MAP = "0=node1:0,1\n1=node2:0,1\n2=node3:0,1\n3=node4:0,1\n"


def deployment(replicas=4, strategy=None, text=POOL_MAP, annotations=None) -> dict:
    spec = {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"},
                                      "annotations": {**({"gpu-scheduling-map": text} if text else {}),
                                                      **(annotations or {})}},
                         "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "image": "i"}]}}}
    if strategy is not None:
        spec["strategy"] = strategy
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ns"}, "spec": spec}


def test_plan_shows_a_deployments_pool_one_row_per_entry_and_the_rollouts_surge(tmp_path):
    code, out, err = run("plan", "-f", write(tmp_path, deployment()))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (f"Deployment ns/web ({tmp_path / 'w.yaml'}, document 1; a pool: replicas 4, maxSurge 1 (25%),"
                        " maxUnavailable 1 (25%))")
    assert lines[1].split() == ["ENTRY", "NODE", "CUDA_VISIBLE_DEVICES", "STATUS"]
    assert [line.split() for line in lines[2:6]] == [[str(i), f"node{i + 1}", "0,1", "ok"] for i in range(4)]
    assert lines[6] == ("  4 replicas (web-*), 5 pods during a rollout, share these 4 entries: each pod takes the first"
                        " free one when bind binds it")
    assert ("  warning: replicas 4 + maxSurge 1 (25% of 4) = 5 pods at once during a rollout, but the pool has 4"
            " usable entries: the rollout would wait: a new pod gets an entry only when an old one leaves; add entries"
            " or set maxSurge: 0") in lines
    assert max(len(line) for line in lines[1:6]) <= 100
    wide = run("plan", "-f", write(tmp_path, deployment()), "-o", "wide")[1].splitlines()
    assert wide[1].split() == ["ENTRY", "NODE", "CUDA_VISIBLE_DEVICES", "NVIDIA", "MODE", "STATUS"]
    quiet = run("plan", "-f", write(tmp_path, deployment(strategy={"rollingUpdate": {"maxSurge": 0}})))[1]
    assert "warning" not in quiet and "a pool: replicas 4, maxSurge 0, maxUnavailable 1 (25%)" in quiet


def test_plan_of_a_deployment_as_data_and_its_replicas_without_an_entry(tmp_path):
    code, out, _ = run("plan", "-f", write(tmp_path, deployment(5)), "-o", "json")
    [work] = json.loads(out)["workloads"]
    assert code == 1 and work["placeable"] is False and (work["kind"], work["replicas"], work["indexed"]) == (
        "Deployment", 5, False)
    pool = work["pool"]
    assert (pool["replicas"], pool["podsAtOnce"], pool["usableEntries"]) == (5, 7, 4)
    assert pool["workload"] == {"kind": "Deployment", "namespace": "ns", "name": "web"}
    assert pool["rollout"] == {"strategy": "RollingUpdate", "maxSurge": 2, "maxUnavailable": 1,
                               "written": {"maxSurge": "25%", "maxUnavailable": "25%"}}
    assert [(e["entry"], e["node"], e["devices"], e["usable"]) for e in pool["entries"]] == [
        (i, f"node{i + 1}", ["0", "1"], True) for i in range(4)]
    assert pool["entries"][2]["env"]["cuda"] == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert [(p["replica"], p["pod"], p["placeable"]) for p in work["pods"]] == [
        (0, "web-*", True), (1, "web-*", True), (2, "web-*", True), (3, "web-*", True), (4, "web-*", False)]
    assert work["pods"][4]["problems"][0]["reason"] == "NoPoolEntry"
    assert sentences(work) == [], "data, not sentences"
    table = run("plan", "-f", write(tmp_path, deployment(5)))[1]
    assert ("  not placed: replica 4: the pool has 4 usable entries for 5 replicas: the pod finds no entry and stays"
            " Pending") in table


class FakeCluster:
    """What the plugin reads, from pods and Ready nodes given here (no API)."""

    def __init__(self, pods=(), nodes=("node1", "node2", "node3", "node4"), gpus=4):
        self.pods, self.node_names, self.gpus = [json.loads(json.dumps(p)) for p in pods], nodes, gpus

    def pod(self, namespace, name):
        return next((p for p in self.pods if p["metadata"]["name"] == name
                     and p["metadata"]["namespace"] == namespace), None)

    def pods_in(self, namespace):
        return [p for p in self.pods if p["metadata"]["namespace"] == namespace]

    def pdbs(self):
        return []

    def events(self, pod):
        return []

    def nodes(self):
        return list(self.node_names)

    def snapshot(self, name, pod, records_namespace):
        from gpu_scheduler.fit import NodeInfo
        from gpu_scheduler.framework.snapshot import NodeSnapshot
        node = {"metadata": {"name": name, "labels": {}}, "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110", "nvidia.com/gpu": str(self.gpus)},
            "capacity": {"nvidia.com/gpu": str(self.gpus)}}} if name in self.node_names else None
        return NodeSnapshot(name, node, NodeInfo.of([p for p in self.pods if p["spec"].get("nodeName") == name]))

    def gang_snapshot(self, name, pods, records_namespace):
        return self.snapshot(name, pods[0] if pods else {}, records_namespace)


def live_pod(name, node="", entry=None, deleting=False, env=True):
    """A pod of Deployment ns/web's ReplicaSet web-7d9f8, as mutate admitted it (cuda mode)."""
    from gpu_scheduler.devices import pool_device_env
    annotations = {"gpu-scheduling-map": POOL_MAP}
    if entry is not None:
        annotations.update({"gpu-scheduler/entry": str(entry), "gpu-scheduler/devices": "0,1",
                            "gpu-scheduler/device-ordinals": "0,1"})
    pod = {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": annotations,
                        "labels": {"app": "web", "pod-template-hash": "7d9f8"},
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9f8", "controller": True}]},
           "spec": {"schedulerName": "gpu-scheduler", "containers": [{"name": "c", "env": [
               {"name": k, **({"value": v} if isinstance(v, str) else {"valueFrom": v})}
               for k, v in pool_device_env("cuda").items()] if env else []}]},
           "status": {"phase": "Running" if node else "Pending"}}
    if node:
        pod["spec"]["nodeName"] = node
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    return pod


@pytest.fixture
def cluster(monkeypatch):
    """Sets the cluster the plugin reads: cluster(pods, ...)."""
    def use(pods=(), **kwargs):
        fake = FakeCluster(pods, **kwargs)
        monkeypatch.setattr("kubectl_gpu_scheduler.cli.connect", lambda args: (fake, args.namespace or "default"))
        return fake
    return use


def test_plan_cluster_says_which_replica_takes_which_entry_now(tmp_path, cluster):
    cluster([live_pod("web-7d9f8-aaaaa", "node2", 1), live_pod("web-7d9f8-bbbbb", "node4", 3, deleting=True)])
    code, out, err = run("plan", "-f", write(tmp_path, deployment(4)), "--cluster", "--quota", "false")
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert [line.split(None, 3) for line in lines[2:6]] == [
        ["0", "node1", "0,1", "bind now: replica 1"], ["1", "node2", "0,1", "held by ns/web-7d9f8-aaaaa (replica 0)"],
        ["2", "node3", "0,1", "bind now: replica 2"], ["3", "node4", "0,1", "held by ns/web-7d9f8-bbbbb (terminating)"]]
    [waits] = [line for line in lines if line.startswith("  not placed now:")]
    assert waits.startswith("  not placed now: replica 3: no entry of the pool is free (4 refused): entry 0"
                            " (node1:0,1): held by ns/web-replica-1;")
    code, out, _ = run("plan", "-f", write(tmp_path, deployment(4)), "--cluster", "--quota", "false", "-o", "json")
    [work] = json.loads(out)["workloads"]
    assert [(p["replica"], p["cluster"]["decision"], p["cluster"]["node"], p["cluster"]["entry"]) for p in work["pods"]] == [
        (0, "none", "node2", 1), (1, "bind", "node1", 0), (2, "bind", "node3", 2), (3, "wait", "node1", None)]
    assert [e["cluster"]["state"] for e in work["pool"]["entries"]] == ["taken", "held", "taken", "held"]
    # the old pod gone: every replica has an entry
    cluster([live_pod("web-7d9f8-aaaaa", "node2", 1)])
    code, out, _ = run("plan", "-f", write(tmp_path, deployment(4)), "--cluster", "--quota", "false")
    assert code == 0 and "bind now: replica 3" in out


def test_explain_a_pending_pool_pod_names_each_entry_and_a_bound_one_its_entry(cluster):
    holders = [live_pod(f"web-7d9f8-h{i}", f"node{i + 1}", i) for i in range(4)]
    cluster([*holders, live_pod("web-7d9f8-new")])
    code, out, err = run("explain", "web-7d9f8-new", "-n", "ns", "--quota", "false")
    assert (code, err) == (1, "")
    assert ("Pool:           Deployment ns/web's pods share the map's 4 entries; this pod holds none yet: bind gives"
            " it the first free one when it binds it") in out
    assert "  c: CUDA_VISIBLE_DEVICES=<not written yet> (from gpu-scheduler/devices) CUDA_DEVICE_ORDER=PCI_BUS_ID" in out
    assert "  read from the annotations bind's Binding writes (cuda mode)" in out
    assert "Scheduling:     waits in bind's queue, refused by PoolEntry: no entry of the pool is free (4 refused):" in out
    assert "entry 3 (node4:0,1): held by ns/web-7d9f8-h3. Add entries to gpu-scheduling-map" in out
    lines = out.splitlines()
    start = lines.index("Pool entries now:")
    assert [line.split(None, 2) for line in lines[start + 2:start + 6]] == [
        [str(i), "held", f"PoolEntry: held by ns/web-7d9f8-h{i}"] for i in range(4)]
    assert "UnknownIndex" not in out and "PoolUnassigned" not in out
    code, out, _ = run("explain", "web-7d9f8-h2", "-n", "ns", "--quota", "false", "-o", "json")
    answer = json.loads(out)
    assert code == 0 and (answer["index"], answer["entry"], answer["node"]) == (None, "2=node3:0,1", "node3")
    assert answer["pool"] == {"workload": {"kind": "Deployment", "namespace": "ns", "name": "web"}, "entries": 4,
                              "entry": 2}
    assert answer["envCheck"] == {"matches": True, "mode": "cuda"} and "problem" not in answer
    assert answer["env"] == {"c": {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
    assert answer["scheduling"]["entry"] == 2
    # an entry freed: the pending pod takes it
    cluster([*holders[:3], live_pod("web-7d9f8-new", env=False)])
    code, out, _ = run("explain", "web-7d9f8-new", "-n", "ns", "--quota", "false")
    assert code == 0 and "Scheduling:     bind: bind to node4, pool entry 3 (GPUs 0,1)" in out
    assert "  not read from the annotations bind's Binding writes" in out  # admitted without the webhook


def test_suggest_writes_a_deployments_pool_map_of_replicas_and_surge(tmp_path, cluster):
    cluster([live_pod("other-0", "node1", None)], nodes=("node1", "node2"), gpus=4)
    path = write(tmp_path, deployment(3, text=None))
    code, out, err = run("suggest", "-f", path, "--gpus", "2")
    assert (code, err) == (0, "")
    assert out.splitlines()[:7] == [
        "Deployment ns/web (a pool: replicas 3, maxSurge 1 (25%), maxUnavailable 0 (25%); 2 GPUs each)",
        "ENTRY   NODE    DEVICES", "0       node1   0,1", "1       node2   0,1", "2       node1   2,3",
        "3       node2   2,3",
        "4 entries: one for each of the 3 replicas and the 1 more a rollout adds (maxSurge); each pod takes the first"
        " free one when bind binds it"]
    code, out, _ = run("suggest", "-f", path, "--gpus", "2", "-o", "yaml")
    written = yaml.safe_load(out)
    assert written["spec"]["template"]["metadata"]["annotations"]["gpu-scheduling-map"] == (
        "0=node1:0,1\n1=node2:0,1\n2=node1:2,3\n3=node2:2,3\n")
    code, _, err = run("suggest", "-f", path, "--gpus", "3")
    assert code == 1 and "4 entries x 3 GPUs = 12 GPUs do not fit" in err


def test_the_plugin_reads_bind_s_entry_records_with_its_device_records():
    """An entry a bind instance gave moments ago (its Lease), its pod not bound yet: the snapshot
    holds it, so plan and explain see the entry taken, as bind does."""
    import time
    from gpu_scheduler.records import entry_lease_for, workload_key
    from kubectl_gpu_scheduler.cluster import Cluster

    pool = workload_key(("owner", "ns", "Deployment", "web"))
    lease = entry_lease_for("node1", pool, 0, "ns/web-7d9f8-given", "uid-given", time.time())
    lease["metadata"]["resourceVersion"] = "5"

    class Api:
        def list_leases(self, namespace, selector):
            return [([lease], None)]

        def read_node(self, name):
            return FakeCluster().snapshot(name, {}, "").node

        def list_pods(self, selector):
            return []

        pods = [live_pod("web-7d9f8-given")]

        def read_pod(self, namespace, name):
            from kubeapi.errors import APIError
            found = [p for p in self.pods if p["metadata"]["name"] == name]
            if not found:
                raise APIError(404, "not found", "NotFound", "pods", name)
            return {**found[0], "metadata": {**found[0]["metadata"], "uid": "uid-given"}}

    from gpu_scheduler.plugins.registry import new_framework
    api = Api()
    for held, node in ((True, "node2"), (False, "node1")):  # the pod deleted: its record holds nothing
        snapshot = Cluster(api).snapshot("node1", {}, "gpu-scheduler")
        assert list(snapshot.entries) == [(pool, 0)] and (snapshot.gone == frozenset()) == held
        decision = new_framework().decide(live_pod("web-7d9f8-new"), lambda name: snapshot if name == "node1" else
                                          FakeCluster().snapshot(name, {}, ""))
        assert decision.node.name == node
        api.pods = []
