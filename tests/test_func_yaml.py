"""chart/func_yaml.py: a func.yaml edited by hand is held to the chart's rules, each refusal naming
its line, before func deploy (the refusals on the real cluster: tests/test_func_cluster.py)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "chart" / "func_yaml.py"
_spec = importlib.util.spec_from_file_location("chart_func_yaml", SCRIPT)
func_yaml = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = func_yaml
_spec.loader.exec_module(func_yaml)


def edited(tmp_path: Path, name: str, *replacements: tuple[str, str]) -> Path:
    text = (REPO / "functions" / name / "func.yaml").read_text()
    for old, new in replacements:
        assert old in text, old
        text = text.replace(old, new, 1)
    directory = tmp_path / name
    directory.mkdir()
    (directory / "func.yaml").write_text(text)
    return directory


def line_of(directory: Path, needle: str) -> int:
    return next(i for i, line in enumerate((directory / "func.yaml").read_text().splitlines(), 1) if needle in line)


@pytest.mark.parametrize("name", ["bind", "mutate"])
def test_the_generated_func_yamls_pass(name):
    assert func_yaml.check(REPO / "functions" / name) == []


@pytest.mark.parametrize("name, replacements, needle, says", [
    ("bind", [("      min: 1\n", "      min: 4\n")], "min: 4", "deploy.options.scale.min 4 is above max 3"),
    ("bind", [("    value: cuda\n", "    value: gpu\n")], "value: gpu", "DEVICE_ENV_MODE: 'gpu' is not one of cuda, nvidia, dra"),
    ("bind", [("    value: cuda\n", "    value: dra\n"), ("GPU_SCHEDULER_DRA\n    value: 'true'", "GPU_SCHEDULER_DRA\n    value: 'false'")],
     "value: dra", "DEVICE_ENV_MODE dra needs GPU_SCHEDULER_DRA 'true'"),
    ("bind", [("RESYNC_CONCURRENCY\n    value: '8'", "RESYNC_CONCURRENCY\n    value: 'eight'")], "'eight'",
     "RESYNC_CONCURRENCY: 'eight' is not an integer (the chart's bind.resyncConcurrency)"),
    ("mutate", [("      min: 1\n", "      min: 0\n")], "min: 0", "deploy.options.scale.min: 0 is below 1 (the chart's mutate.scale.min)"),
    ("mutate", [("    value: INFO\n", "    value: LOUD\n")], "LOUD", "LOG_LEVEL: 'LOUD' is not one of DEBUG, INFO, WARNING, ERROR"),
])
def test_what_the_chart_refuses_is_refused_naming_the_line(tmp_path, name, replacements, needle, says):
    directory = edited(tmp_path, name, *replacements)
    [refusal] = func_yaml.check(directory)
    assert refusal.line == line_of(directory, needle)
    assert str(refusal).startswith(f"{directory / 'func.yaml'}:{refusal.line}: {says}")


def test_an_autoscaling_annotation_is_refused_because_func_writes_it_where_knative_refuses_it(tmp_path):
    """Found on the real cluster: func v0.44.0 puts deploy.annotations on the Service's metadata too,
    and Knative's webhook refuses autoscaling keys there (tests/test_func_cluster.py shows the rest)."""
    directory = edited(tmp_path, "bind", ("deploy:\n", "deploy:\n  annotations:\n    autoscaling.knative.dev/window: 6s\n"))
    [refusal] = func_yaml.check(directory)
    assert refusal.line == line_of(directory, "autoscaling.knative.dev/window")
    assert "Knative refuses autoscaling annotations: use deploy.options.scale" in refusal.message


def test_bind_at_zero_is_accepted(tmp_path):
    assert func_yaml.check(edited(tmp_path, "bind", ("      min: 1\n", "      min: 0\n"))) == []


def test_a_missing_directory_and_broken_yaml_are_told_apart(tmp_path):
    [missing] = func_yaml.check(tmp_path / "absent")
    assert "cannot read it" in missing.message and "function's directory" in missing.message
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "func.yaml").write_text("name: bind\nrun: [\n")
    [broken] = func_yaml.check(tmp_path / "broken")
    assert broken.message.startswith("not YAML") and broken.line > 0
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "func.yaml").write_text("specVersion: 0.36.0\nname: hello\n")
    [other] = func_yaml.check(tmp_path / "other")
    assert (other.line, other.message) == (2, "name 'hello': this project's functions are bind and mutate")


def test_the_command_exits_2_on_a_refusal_and_says_nothing_was_deployed(tmp_path):
    directory = edited(tmp_path, "bind", ("      min: 1\n", "      min: 4\n"))
    done = subprocess.run([sys.executable, str(SCRIPT), str(REPO / "functions" / "mutate"), str(directory)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "nothing was deployed" in done.stderr and "Traceback" not in done.stderr
    ok = subprocess.run([sys.executable, str(SCRIPT), str(REPO / "functions" / "bind"), str(REPO / "functions" / "mutate")],
                        capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stderr) == (0, "")
    usage = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "func_yaml.py" in usage.stderr
