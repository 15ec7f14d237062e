"""Checks a function's func.yaml, edited by hand, against what the chart accepts, before `func
deploy` puts it on a cluster: each refusal names the file's line and the fix.

    python chart/func_yaml.py functions/bind [functions/mutate ...]    exit 2 on a refusal

functions/*/func.yaml are rendered from the chart's values (chart/manifests.py). A func user who
edits one instead of the values sets the same settings in func's words; this maps each one back to
the chart value it comes from (FIELDS) and holds it to that value's rules in the chart's own
values.schema.json (types, enums, minimums), and to the chart's two rules across values that a
schema cannot say (templates/_helpers.tpl: a scale's min at most its max; deviceEnvMode dra needs
dra.enabled). func itself refuses only some of these (a max below min, without a line), and a
function deployed with the rest fails at its start or places nothing. localcp/func.deploy runs
this before every `func deploy` of the local stack.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "chart" / "gpu-scheduler" / "values.schema.json"

# func.yaml's env variables of each function: the chart value each comes from (templates/_helpers.tpl,
# bindEnv and mutateEnv), and how the chart writes it (every env value is a string).
ENV_VALUES = {
    "bind": {"LOG_LEVEL": "logLevel", "RESYNC_CONCURRENCY": "bind.resyncConcurrency", "THREADS": "bind.threads",
             "GPU_SCHEDULER_QUOTA": "quota.enabled", "GPU_SCHEDULER_DRA": "dra.enabled",
             "DEVICE_ENV_MODE": "deviceEnvMode", "GPU_SCHEDULER_DRA_DEVICE_CLASS": "dra.deviceClass",
             "GPU_SCHEDULER_DRA_DEVICE_RULES": "dra.deviceRules"},
    "mutate": {"LOG_LEVEL": "logLevel", "DEVICE_ENV_MODE": "deviceEnvMode", "GPU_SCHEDULER_QUOTA": "quota.enabled",
               "WORKERS": "mutate.workers", "THREADS": "mutate.threads"},
}


@dataclass(frozen=True)
class Refusal:
    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _schema_at(schema: dict, dotted: str) -> dict:
    """The schema of a value (e.g. mutate.scale.min), its $refs and allOfs merged in."""
    definitions = schema.get("definitions", {})

    def resolved(node: dict) -> dict:
        merged: dict = {}
        if "$ref" in node:
            merged.update(resolved(definitions[node["$ref"].rsplit("/", 1)[1]]))
        for part in node.get("allOf", []):
            for key, value in resolved(part).items():
                if key == "properties":
                    merged.setdefault("properties", {})
                    for name, sub in value.items():
                        merged["properties"][name] = {**merged["properties"].get(name, {}), **sub}
                else:
                    merged[key] = value
        merged.update({k: v for k, v in node.items() if k not in ("$ref", "allOf", "properties")})
        if "properties" in node:
            merged.setdefault("properties", {})
            for name, sub in node["properties"].items():
                merged["properties"][name] = {**merged["properties"].get(name, {}), **sub}
        return merged
    node = resolved(schema)
    for key in dotted.split("."):
        node = resolved(node.get("properties", {}).get(key, {}))
    return node


def _typed(value, rule: dict):
    """A func.yaml value (env values are strings) as the chart value it stands for, or None if it
    cannot be one."""
    kind = rule.get("type")
    text = str(value)
    if kind == "boolean":
        return {"true": True, "false": False}.get(text)
    if kind == "integer":
        return int(text) if text.lstrip("-").isdigit() else None
    return text


def _against(rule: dict, value, value_path: str) -> str | None:
    """What the chart's schema says against this value of value_path, or None."""
    typed = _typed(value, rule)
    if typed is None:
        return f"{value!r} is not a{'n' if rule['type'] == 'integer' else ''} {rule['type']} (the chart's {value_path})"
    if "enum" in rule and typed not in rule["enum"]:
        return f"{value!r} is not one of {', '.join(map(str, rule['enum']))} (the chart's {value_path})"
    if "minimum" in rule and typed < rule["minimum"]:
        why = f": {rule['description']}" if "description" in rule else ""
        return f"{typed} is below {rule['minimum']} (the chart's {value_path}){why}"
    if "maximum" in rule and typed > rule["maximum"]:
        return f"{typed} is above {rule['maximum']} (the chart's {value_path})"
    return None


def _lines(root: yaml.Node) -> dict[tuple, int]:
    """Each node's path (keys and list indexes) in the document: its 1-based line."""
    out: dict[tuple, int] = {}

    def walk(node: yaml.Node, path: tuple) -> None:
        out[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                out[(*path, key.value)] = key.start_mark.line + 1
                walk(value, (*path, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, (*path, index))
    walk(root, ())
    return out


def check(directory: Path, schema: dict | None = None) -> list[Refusal]:
    """Every refusal of <directory>/func.yaml; empty when the chart accepts what it says."""
    schema = schema or json.loads(SCHEMA.read_text())
    path = directory / "func.yaml"
    try:
        text = path.read_text()
        root = yaml.compose(text)
        document = yaml.safe_load(text)
    except OSError as error:
        return [Refusal(path, 0, f"cannot read it ({error.strerror}): is {directory} a function's directory?")]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        return [Refusal(path, mark.line + 1 if mark else 0, f"not YAML: {getattr(error, 'problem', error)}")]
    if not isinstance(document, dict):
        return [Refusal(path, 1, "not a func.yaml: a mapping of name, runtime, run, deploy, ...")]
    lines = _lines(root)
    name = document.get("name")
    if name not in ENV_VALUES:
        return [Refusal(path, lines.get(("name",), 1),
                        f"name {name!r}: this project's functions are {' and '.join(ENV_VALUES)}")]
    refusals = []

    def refuse(at: tuple, message: str) -> None:
        refusals.append(Refusal(path, lines.get(at, lines.get(at[:-1], 1)), message))

    scale = ((document.get("deploy") or {}).get("options") or {}).get("scale") or {}
    at_scale = ("deploy", "options", "scale")
    typed_scale = {}
    for bound in ("min", "max"):
        if bound in scale:
            rule = _schema_at(schema, f"{name}.scale.{bound}")
            problem = _against(rule, scale[bound], f"{name}.scale.{bound}")
            why = _schema_at(schema, f"{name}.scale").get("description")
            if problem:
                refuse((*at_scale, bound), f"deploy.options.scale.{bound}: {problem}" + (f": {why}" if why else ""))
            else:
                typed_scale[bound] = int(scale[bound])
    # templates/_helpers.tpl ("gpu-scheduler.scale"): a min above the max is refused.
    if len(typed_scale) == 2 and typed_scale["min"] > typed_scale["max"]:
        refuse((*at_scale, "min"), f"deploy.options.scale.min {typed_scale['min']} is above max {typed_scale['max']} "
                                   f"(line {lines.get((*at_scale, 'max'))}): make min at most max")
    # func writes deploy.annotations on the Knative Service's metadata as well as its template's
    # (knative.dev/func v0.44.0, pkg/knative/deployer.go), and Knative refuses autoscaling keys there.
    annotations = (document.get("deploy") or {}).get("annotations") or {}
    for key in annotations if isinstance(annotations, dict) else ():
        if str(key).startswith("autoscaling.knative.dev/"):
            refuse(("deploy", "annotations", key),
                   f"deploy.annotations {key}: func writes it on the Knative Service too, where Knative refuses "
                   f"autoscaling annotations: use deploy.options.scale (min, max, metric, target, utilization); "
                   f"a window cannot be set through func.yaml (Knative's default: 60s)")
    envs = (document.get("run") or {}).get("envs") or []
    values = {}
    for index, env in enumerate(envs):
        if not isinstance(env, dict) or env.get("name") not in ENV_VALUES[name] or "value" not in env:
            continue
        value_path = ENV_VALUES[name][env["name"]]
        problem = _against(_schema_at(schema, value_path), env["value"], value_path)
        if problem:
            refuse(("run", "envs", index, "value"), f"{env['name']}: {problem}")
        values[env["name"]] = (index, str(env["value"]))
    # templates/_helpers.tpl ("gpu-scheduler.bindEnv"): deviceEnvMode dra needs dra.enabled.
    if name == "bind" and values.get("DEVICE_ENV_MODE", (0, ""))[1] == "dra" and values.get("GPU_SCHEDULER_DRA", (0, ""))[1] != "true":
        refuse(("run", "envs", values["DEVICE_ENV_MODE"][0], "value"),
               "DEVICE_ENV_MODE dra needs GPU_SCHEDULER_DRA 'true' (bind watches ResourceClaims and ResourceSlices "
               "only then): set it, or DEVICE_ENV_MODE cuda or nvidia")
    return sorted(refusals, key=lambda r: r.line)


def main(argv: list[str]) -> int:
    if not argv or any(a.startswith("-") for a in argv):
        print("usage: python chart/func_yaml.py FUNCTION_DIRECTORY ...   (e.g. functions/bind functions/mutate)",
              file=sys.stderr)
        return 2
    refusals = [r for directory in argv for r in check(Path(directory))]
    for refusal in refusals:
        print(refusal, file=sys.stderr)
    if refusals:
        print(f"{len(refusals)} refused: fix the lines above (or the chart's values, then `make manifests`), "
              f"and nothing was deployed", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
