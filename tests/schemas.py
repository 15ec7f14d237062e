"""Offline validation of the deployment manifests against the published schemas.

- Custom resources (Knative Serving/Eventing, cert-manager): the CRDs in tests/fixtures/k8s-schemas/,
  `spec.versions[name == version].schema.openAPIV3Schema`, with unknown fields as errors wherever
  a schema lists `properties` and does not set `x-kubernetes-preserve-unknown-fields: true`
  (the API server would prune them silently: that is how typos go unnoticed). `metadata` is
  checked as a Kubernetes ObjectMeta.
- Core kinds: kubernetes-validate, strict, for the Kubernetes version kind/cluster.yaml pins.
- func.yaml: knative/func's JSON schema.
"""
from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import jsonschema
import kubernetes_validate
import yaml

from tests.fixtures import SCHEMAS

REPO = Path(__file__).resolve().parent.parent
KIND_CONFIG = REPO / "kind" / "cluster.yaml"
# Core objects are validated for the oldest and the newest minor the project is tested on
# (localcp/compat.py VERSIONS, the chart's kubeVersion): a field one of them lacks is an error.
SUPPORTED_MINORS = ("1.33", "1.37")
CORE_GROUPS = {"", "apps", "rbac.authorization.k8s.io", "admissionregistration.k8s.io", "batch", "policy"}


class _StringTimestampLoader(yaml.SafeLoader):
    """YAML as Go's yaml reads it into these schemas: a timestamp stays a string."""


_StringTimestampLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_documents(path: Path) -> list[dict]:
    """Every non-empty YAML document in `path`."""
    return [doc for doc in yaml.load_all(path.read_text(), Loader=_StringTimestampLoader) if doc]


def group_version(doc: dict) -> tuple[str, str]:
    api_version = doc.get("apiVersion", "")
    group, _, version = api_version.rpartition("/")
    return group, version


# -- custom resources ------------------------------------------------------------------------
@lru_cache(maxsize=None)
def crd_schemas() -> dict[tuple[str, str, str], dict]:
    """(group, version, kind) -> openAPIV3Schema, from every CRD under SCHEMAS."""
    found = {}
    for path in sorted(SCHEMAS.glob("*/*.yaml")):
        for doc in load_documents(path):
            if doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                found[(spec["group"], version["name"], spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return found


def _to_json_schema(node: Any, strict_preserved: bool) -> Any:
    """An OpenAPI v3 (structural) schema as a JSON Schema that rejects unknown fields.

    Unknown fields are refused wherever `properties` are listed and unknown fields are not
    preserved; with strict_preserved, also where they are preserved (the API server keeps them
    there, and the controller ignores them just as silently).
    """
    if isinstance(node, list):
        return [_to_json_schema(item, strict_preserved) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _to_json_schema(value, strict_preserved) for key, value in node.items()
           if key not in ("description", "example")}
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    preserved = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in node and "additionalProperties" not in node and (not preserved or strict_preserved):
        out["additionalProperties"] = False
    for key in [k for k in out if k.startswith("x-kubernetes-")]:
        del out[key]
    return out


def _errors(validator: jsonschema.protocols.Validator, doc: Any, where: str = "") -> list[str]:
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{where}{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def custom_resource_errors(doc: dict, strict_preserved: bool = False) -> list[str]:
    """Schema violations of a custom resource, unknown fields included; [] when valid."""
    group, version = group_version(doc)
    schema = crd_schemas().get((group, version, doc.get("kind")))
    if schema is None:
        return [f"no CRD schema for {doc.get('apiVersion')} {doc.get('kind')} under {SCHEMAS}"]
    schema = _to_json_schema(copy.deepcopy(schema), strict_preserved)
    # metadata is validated as an ObjectMeta below; the CRD only says `type: object`.
    schema.setdefault("properties", {})
    for field in ("apiVersion", "kind"):
        schema["properties"].setdefault(field, {"type": "string"})
    schema["properties"]["metadata"] = {"type": "object"}
    schema["additionalProperties"] = False
    return (_errors(jsonschema.Draft7Validator(schema), doc)
            + metadata_errors(doc.get("metadata", {})))


def metadata_errors(metadata: dict) -> list[str]:
    """`metadata` checked as a strict Kubernetes ObjectMeta (misspelled keys are errors)."""
    carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
    try:
        kubernetes_validate.validate(carrier, kubernetes_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{'.'.join(map(str, error.path))}: {error.message}"]
    return []


# -- core kinds ------------------------------------------------------------------------------
def kind_node_image() -> str:
    nodes = yaml.safe_load(KIND_CONFIG.read_text())["nodes"]
    images = {node["image"] for node in nodes}
    assert len(images) == 1, f"kind/cluster.yaml: all nodes must run one image, found {images}"
    return images.pop()


def kubernetes_version() -> str:
    """The Kubernetes minor version the kind node image pins, e.g. '1.34'."""
    match = re.fullmatch(r"kindest/node:v(\d+)\.(\d+)\.\d+@sha256:[0-9a-f]{64}", kind_node_image())
    assert match, f"kind/cluster.yaml: node image {kind_node_image()!r} is not kindest/node:vX.Y.Z@sha256:<digest>"
    return f"{match[1]}.{match[2]}"


def core_errors(doc: dict, version: str | None = None) -> list[str]:
    """kubernetes-validate, strict (unknown fields are errors), for `version`, or else for each of
    SUPPORTED_MINORS and the kind node's version (each error names its version)."""
    errors = []
    for minor in [version] if version else sorted({*SUPPORTED_MINORS, kubernetes_version()}):
        try:
            kubernetes_validate.validate(doc, minor, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"Kubernetes {minor}: {'.'.join(map(str, error.path)) or '<root>'}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError as error:
            errors.append(error.message)
    return errors


def manifest_errors(doc: dict, strict_preserved: bool = False) -> list[str]:
    """Errors of any Kubernetes object: core kinds or custom resources."""
    group, _ = group_version(doc)
    if group in CORE_GROUPS:
        return core_errors(doc)
    return custom_resource_errors(doc, strict_preserved)


# -- func.yaml -------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _func_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / "func" / "func_yaml-schema.json").read_text())
    return jsonschema.Draft4Validator(schema)


def func_errors(doc: dict) -> list[str]:
    return _errors(_func_validator(), doc)


# -- RBAC ------------------------------------------------------------------------------------
def granted(rules: Iterable[dict]) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) triples a list of PolicyRules grants."""
    return {(group, resource, verb)
            for rule in rules
            for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", [])
            for verb in rule.get("verbs", [])}
