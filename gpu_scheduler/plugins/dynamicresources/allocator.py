"""DRA mode (resource.k8s.io/v1, GA in Kubernetes 1.34): each replica gets a ResourceClaim for
exactly its map entry's devices on its node, which bind allocates and reserves for the pod before
binding it. The kubelet then hands exactly those devices to the container (CDI), and every other
scheduler sees them as allocated. Pure: ResourceSlices, ResourceClaims and pods in, claim bodies
and decisions out, for the DynamicResources plugin (plugin.py beside this file); the API calls are
functions/bind's.

From a map index to a device: a rule per driver (or per DeviceClass), one of
  {"name": "gpu-{index}"}                    the device whose name is the pattern with the index
                                             ({index:02d}: zero-padded to 2 digits)
  {"attribute": "index"}                     the device whose attribute `index` is the map's index
  {"attribute": "uuid", "table": {node: {index: value}}}
                                             the device whose attribute is the table's value for
                                             the node and index (a UUID, a PCI bus id)
A rule keyed by a DeviceClass name may say which "driver" the class's devices come from; else a
class's driver is the rule's key when the class is named after its driver (NVIDIA's
`gpu.nvidia.com`), else the one driver with a rule that publishes devices on the node.

Only a node's own ResourceSlices count (spec.nodeName), and of each pool only the slices of its
newest generation, as kube-scheduler's allocator takes them (structured.GatherPools). A device
allocated in any ResourceClaim other than the pod's own is held: by kube-scheduler or anyone.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ...shapes import as_map as _map, as_maps as _maps
from ...placement import metadata, spec
from ...podindex import is_pool
from ...schedmap import Placement, is_dns_subdomain, shown

API_VERSION = "resource.k8s.io/v1"
# The pod's entry in spec.resourceClaims and in each container's resources.claims.
POD_CLAIM = "gpu-scheduler"
CLAIM_SUFFIX = "-gpus"
DEVICE_CLASS_ANNOTATION = "gpu-scheduler/device-class"
DEFAULT_DEVICE_CLASS = "gpu.nvidia.com"
# kube-scheduler's (k8s.io/api/resource/v1.Finalizer): the resourceclaim controller clears the
# allocation and removes it once no pod uses the claim, as for claims kube-scheduler allocated.
FINALIZER = "resource.kubernetes.io/delete-protection"

DEFAULT_RULES_TEXT = '{"gpu.nvidia.com": {"name": "gpu-{index}"}, "test-driver.cdi.k8s.io": {"name": "device-{index:02d}"}}'
# Linux's limit on one environment string (MAX_ARG_STRLEN): no longer value can reach bind. It
# bounds the tables too: some 2,000 UUIDs.
MAX_RULES_BYTES = 128 * 1024
MAX_RULES = 64
MAX_VALUE = 256  # an attribute value (string attributes: at most 64 characters in the API)
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[a-zA-Z_][a-zA-Z0-9_]{0,31}$")
_PLACEHOLDER = re.compile(r"\{index(?::0([1-9])d)?\}")
_DEVICE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DIGITS = re.compile(r"^[0-9]{1,9}$")
SHOWN = 5


class RuleError(ValueError):
    """GPU_SCHEDULER_DRA_DEVICE_RULES is not usable; the message names the key."""


@dataclass(frozen=True)
class Rule:
    """How a map's device index names one device of a driver."""

    name: str = ""  # a pattern with one {index} or {index:0Nd}
    attribute: str = ""  # an attribute name (the driver's domain may be given: "gpu.nvidia.com/index")
    table: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # node -> index -> value
    driver: str = ""  # for a rule keyed by a DeviceClass: the driver its devices come from

    def device_name(self, index: str) -> str | None:
        """The device name for a map device (None: the pattern wants a number, the map has none)."""
        match = _PLACEHOLDER.search(self.name)
        if match is None or not _DIGITS.match(index):
            return None
        width = int(match.group(1) or 0)
        return self.name[:match.start()] + str(int(index)).zfill(width) + self.name[match.end():]

    def looked_for(self, node: str, index: str) -> str:
        """What this rule looks for, in words, for a refusal."""
        if self.name:
            name = self.device_name(index)
            return f"a device named {name!r}" if name else f"a device named by {self.name!r} (the map's device {shown(index)} is no number)"
        if self.table:
            value = self.table.get(node, {}).get(index)
            if value is None:
                return f"an entry for node {node} and index {shown(index)} in the rule's table of {self.attribute!r}"
            return f"a device whose attribute {self.attribute!r} is {value!r}"
        return f"a device whose attribute {self.attribute!r} is {shown(index)}"


def _rule(key: str, value: Any) -> Rule:
    where = f"GPU_SCHEDULER_DRA_DEVICE_RULES[{key!r}]"
    if not isinstance(value, dict):
        raise RuleError(f"{where}: expected an object such as {{\"name\": \"gpu-{{index}}\"}} or {{\"attribute\": \"index\"}}")
    unknown = sorted(set(value) - {"name", "attribute", "table", "driver"})
    if unknown:
        raise RuleError(f"{where}: unknown key {unknown[0]!r} (expected name, attribute, table, driver)")
    name, attribute, table, driver = value.get("name", ""), value.get("attribute", ""), value.get("table"), value.get("driver", "")
    if not isinstance(driver, str) or (driver and not is_dns_subdomain(driver)):
        raise RuleError(f"{where}.driver: expected a driver name (a DNS subdomain), found {shown(driver)}")
    if bool(name) == bool(attribute):
        raise RuleError(f"{where}: give exactly one of name (a pattern) and attribute")
    if name:
        if not isinstance(name, str) or len(_PLACEHOLDER.findall(name)) != 1:
            raise RuleError(f"{where}.name: expected a pattern with exactly one {{index}} or {{index:0Nd}}, found {shown(name)}")
        if table is not None:
            raise RuleError(f"{where}: a table goes with an attribute, not a name pattern")
        sample = _PLACEHOLDER.sub("0", name)
        if not _DEVICE_NAME.match(sample):
            raise RuleError(f"{where}.name: {shown(name)} cannot give a device name (a DNS label: lowercase letters, digits, '-')")
        return Rule(name=name, driver=driver)
    if not isinstance(attribute, str) or not _QUALIFIED.match(attribute):
        raise RuleError(f"{where}.attribute: {shown(attribute)} is not an attribute name (a C identifier, optionally after a domain and '/')")
    if table is None:
        return Rule(attribute=attribute, driver=driver)
    if not isinstance(table, dict) or not table:
        raise RuleError(f"{where}.table: expected an object {{node: {{index: value}}}}")
    parsed: dict[str, dict[str, str]] = {}
    for node, entries in table.items():
        if not is_dns_subdomain(node) or not isinstance(entries, dict):
            raise RuleError(f"{where}.table[{shown(node)}]: expected a node name and an object {{index: value}}")
        for index, entry in entries.items():
            if not _DIGITS.match(index) or not isinstance(entry, str) or not 0 < len(entry) <= MAX_VALUE:
                raise RuleError(f"{where}.table[{node!r}][{shown(index)}]: expected a device index and a non-empty"
                                f" string of at most {MAX_VALUE} characters")
        parsed[node] = {str(int(i)): v for i, v in entries.items()}
    return Rule(attribute=attribute, table=parsed, driver=driver)


def parse_rules(text: str | None) -> dict[str, Rule]:
    """The rules, keyed by driver or DeviceClass name, from JSON; RuleError saying what is wrong.
    None or empty: the defaults."""
    if not text:
        text = DEFAULT_RULES_TEXT
    if len(text.encode()) > MAX_RULES_BYTES:
        raise RuleError(f"GPU_SCHEDULER_DRA_DEVICE_RULES: larger than {MAX_RULES_BYTES} bytes")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise RuleError(f"GPU_SCHEDULER_DRA_DEVICE_RULES: not JSON: {str(error)[:200]}") from None
    if not isinstance(value, dict) or not value:
        raise RuleError("GPU_SCHEDULER_DRA_DEVICE_RULES: expected a non-empty object {driver: rule}")
    if len(value) > MAX_RULES:
        raise RuleError(f"GPU_SCHEDULER_DRA_DEVICE_RULES: {len(value)} rules; at most {MAX_RULES}")
    rules = {}
    for key, rule in value.items():
        if not is_dns_subdomain(key):
            raise RuleError(f"GPU_SCHEDULER_DRA_DEVICE_RULES: key {shown(key)} is not a driver or DeviceClass name")
        rules[key] = _rule(key, rule)
    return rules


# -- the pod -------------------------------------------------------------------------------------
def claim_name(pod_name: str) -> str:
    return pod_name + CLAIM_SUFFIX


def pool_claim_name(generate_name: str, request_uid: str) -> str:
    """The claim of a pool pod, which has no name at admission (generateName): named by mutate from
    its generateName and the admission request's UID (unique per pod creation)."""
    return f"{generate_name}{request_uid.replace('-', '')[:10]}{CLAIM_SUFFIX}"


def pod_claim(pod: Mapping[str, Any]) -> str:
    """The name of the claim bind makes for the pod: `<name>-gpus`; for a pool pod, which had no
    name at admission, the one mutate referenced (pool_claim_name). Any other pod that references
    another claim is refused for it (DynamicResources), as before pools."""
    refs = claim_refs(pod)
    if refs and is_pool(metadata(pod)):
        return refs[0]
    return claim_name(str(metadata(pod).get("name") or ""))


def uses_dra(pod: Mapping[str, Any]) -> bool:
    """Admitted in DRA mode: mutate gave it the pod-level claim named gpu-scheduler."""
    return any(c.get("name") == POD_CLAIM for c in _maps(spec(pod).get("resourceClaims")))


def device_class(pod: Mapping[str, Any], default: str = DEFAULT_DEVICE_CLASS) -> str:
    annotations = _map(metadata(pod).get("annotations"))
    value = annotations.get(DEVICE_CLASS_ANNOTATION)
    return value if isinstance(value, str) and value else default


# -- ResourceSlices --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """One device as a claim's allocation names it."""

    driver: str
    pool: str
    name: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


def node_devices(slices: Iterable[Mapping[str, Any]], node: str, driver: str) -> list[tuple[Device, Mapping[str, Any]]]:
    """The devices `driver` publishes on `node`: from slices with spec.nodeName == node, of each
    pool only the slices of its newest generation (older ones are being replaced)."""
    pools: dict[str, tuple[int, list[Mapping[str, Any]]]] = {}
    for item in slices:
        slice_spec = _map(item.get("spec"))
        if slice_spec.get("driver") != driver or slice_spec.get("nodeName") != node:
            continue
        pool = _map(slice_spec.get("pool"))
        name, generation = pool.get("name"), pool.get("generation")
        if not isinstance(name, str) or not isinstance(generation, int) or isinstance(generation, bool):
            continue
        newest, kept = pools.get(name, (generation, []))
        if generation > newest:
            newest, kept = generation, []
        if generation == newest:
            kept.append(slice_spec)
        pools[name] = (newest, kept)
    return [(Device(driver, pool, str(device.get("name"))), device)
            for pool, (_, kept) in sorted(pools.items()) for slice_spec in kept
            for device in _maps(slice_spec.get("devices")) if isinstance(device.get("name"), str)]


def drivers_on(slices: Iterable[Mapping[str, Any]], node: str) -> set[str]:
    return {str(_map(s.get("spec")).get("driver")) for s in slices if _map(s.get("spec")).get("nodeName") == node}


def _attribute(device: Mapping[str, Any], name: str, driver: str) -> Any:
    """The attribute's value (int, string, bool or version), by its name or its name qualified
    with the driver's domain, as the API treats the two as one."""
    attributes = _map(device.get("attributes"))
    value = attributes.get(name)
    if value is None and "/" not in name:
        value = attributes.get(f"{driver}/{name}")
    if value is None and name.startswith(driver + "/"):
        value = attributes.get(name[len(driver) + 1:])
    value = _map(value)
    for kind in ("int", "string", "version", "bool"):
        if kind in value:
            return value[kind]
    return None


def _matches(rule: Rule, node: str, index: str, device: Device, body: Mapping[str, Any]) -> bool:
    if rule.name:
        return device.name == rule.device_name(index)
    have = _attribute(body, rule.attribute, device.driver)
    if rule.table:
        wanted = rule.table.get(node, {}).get(str(int(index)) if _DIGITS.match(index) else index)
        return wanted is not None and isinstance(have, (str, int)) and not isinstance(have, bool) and str(have) == wanted
    if isinstance(have, bool):
        return False
    if isinstance(have, int):
        return bool(_DIGITS.match(index)) and have == int(index)
    return isinstance(have, str) and have == index


PCIE_ROOT = "resource.kubernetes.io/pcieRoot"  # the standard attribute: devices under one PCIe root complex


def pcie_root(device: Device, body: Mapping[str, Any]) -> str | None:
    """The device's PCIe root as its driver publishes it (resource.kubernetes.io/pcieRoot), or None."""
    value = _attribute(body, PCIE_ROOT, device.driver)
    return value if isinstance(value, str) and value else None


def map_device(rule: Rule, node: str, device: Device, body: Mapping[str, Any]) -> str | None:
    """The map device (a GPU index, or a UUID for an attribute rule on UUIDs) that `rule` turns
    into `device` on `node`: the inverse of _matches, checked against it; None when no map device
    names it."""
    candidate: str | None = None
    if rule.name:
        match = _PLACEHOLDER.search(rule.name)
        width = int(match.group(1) or 0) if match else 0
        if match:
            pattern = re.escape(rule.name[:match.start()]) + "([0-9]{1,9})" + re.escape(rule.name[match.end():])
            found = re.fullmatch(pattern, device.name)
            if found and (not width or len(found.group(1)) == max(width, len(str(int(found.group(1)))))):
                candidate = str(int(found.group(1)))
    elif rule.table:
        have = _attribute(body, rule.attribute, device.driver)
        if isinstance(have, (str, int)) and not isinstance(have, bool):
            candidate = next((index for index, value in rule.table.get(node, {}).items() if value == str(have)), None)
    else:
        have = _attribute(body, rule.attribute, device.driver)
        if isinstance(have, int) and not isinstance(have, bool) and have >= 0:
            candidate = str(have)
        elif isinstance(have, str):
            candidate = have
    if candidate is None or not _matches(rule, node, candidate, device, body):
        return None
    return candidate


def rule_for(device_class_name: str, rules: Mapping[str, Rule], slices: Iterable[Mapping[str, Any]],
             node: str) -> tuple[str, Rule] | str:
    """(driver, rule) for a DeviceClass on a node, or why there is none."""
    rule = rules.get(device_class_name)
    if rule is not None:
        return (rule.driver or device_class_name), rule
    candidates = sorted(d for d in drivers_on(slices, node) if d in rules)
    if len(candidates) == 1:
        return candidates[0], rules[candidates[0]]
    if not candidates:
        return (f"no ResourceSlice on node {node} is of a driver with a device rule ({', '.join(sorted(rules)[:SHOWN])});"
                f" is the DRA driver running there, and is DeviceClass {device_class_name!r} its class?")
    return (f"ResourceSlices on node {node} are of several drivers with device rules ({', '.join(candidates[:SHOWN])});"
            f" give DeviceClass {device_class_name!r} a rule naming its driver")


@dataclass(frozen=True)
class Wanted:
    """What the pod's claim must hold: one request per map device, each one device."""

    namespace: str
    claim: str
    device_class: str
    node: str
    requests: tuple[tuple[str, Device], ...]  # (request name, device)
    selectors: Mapping[str, str] = field(default_factory=dict)  # request name -> CEL expression

    def results(self) -> list[dict[str, str]]:
        return [{"request": request, "driver": d.driver, "pool": d.pool, "device": d.name} for request, d in self.requests]


def request_name(device: str) -> str:
    """`gpu-<index>`; a device that is no number (a UUID in the map) by position instead."""
    return f"gpu-{int(device)}" if _DIGITS.match(device) else ""


def _cel(rule: Rule, driver: str, node: str, index: str) -> str:
    name = rule.attribute if "/" in rule.attribute else f"{driver}/{rule.attribute}"
    domain, _, attribute = name.rpartition("/")
    if rule.table:
        return f'device.attributes["{domain}"].{attribute} == {json.dumps(rule.table[node][str(int(index))])}'
    return f'device.attributes["{domain}"].{attribute} == {int(index) if _DIGITS.match(index) else json.dumps(index)}'


def allocated(claims: Iterable[Mapping[str, Any]]) -> dict[Device, str]:
    """{device: "namespace/name" of the claim it is allocated in}, over every claim."""
    held: dict[Device, str] = {}
    for claim in claims:
        meta = metadata(claim)
        results = _maps(_map(_map(_map(claim.get("status")).get("allocation")).get("devices")).get("results"))
        for result in results:
            device = Device(str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            held.setdefault(device, f"{meta.get('namespace')}/{meta.get('name')}")
    return held


def wanted_devices(namespace: str, claim: str, index: int, placement: Placement, device_class_name: str,
                   rules: Mapping[str, Rule], slices: Iterable[Mapping[str, Any]],
                   held: Mapping[Device, str]) -> Wanted | str:
    """The devices of the pod's map entry as its node's ResourceSlices publish them, or why they
    cannot be given: a map device matching no device or two, or one allocated in another claim
    (`held`, from allocated(): the pod's own claim does not count)."""
    slices = list(slices)
    node = placement.node
    entry = f"map entry {index}={node}:{','.join(placement.devices)}"
    chosen = rule_for(device_class_name, rules, slices, node)
    if isinstance(chosen, str):
        return f"{entry}: {chosen}"
    driver, rule = chosen
    published = node_devices(slices, node, driver)
    mine = f"{namespace}/{claim}"
    requests, selectors = [], {}
    for position, device in enumerate(placement.devices):
        found = [d for d, body in published if _matches(rule, node, device, d, body)]
        looked = rule.looked_for(node, device)
        if not found:
            pools = sorted({d.pool for d, _ in published})
            return (f"{entry}: device {device} matches no device of driver {driver} on node {node} (looked for"
                    f" {looked} among {len(published)} devices" + (f" of pool(s) {', '.join(pools[:SHOWN])}" if pools else "")
                    + ")")
        if len(found) > 1:
            return (f"{entry}: device {device} matches {len(found)} devices of driver {driver} on node {node}"
                    f" ({', '.join(str(d) for d in found[:SHOWN])}; looked for {looked}): the rule must name one")
        holder = held.get(found[0])
        if holder is not None and holder != mine:
            return f"{entry}: device {device} ({found[0]}) is allocated in ResourceClaim {holder}"
        name = request_name(device) or f"gpu-{position}"
        if any(name == r for r, _ in requests):
            name = f"gpu-{position}"
        requests.append((name, found[0]))
        if rule.attribute:
            selectors[name] = _cel(rule, driver, node, device)
    return Wanted(namespace, claim, device_class_name, node, tuple(requests), selectors)


# -- the claim -------------------------------------------------------------------------------------
def claim_for(pod: Mapping[str, Any], wanted: Wanted) -> dict[str, Any]:
    """The ResourceClaim bind creates for a pod: owned by the pod (deleted with it), one request
    per map device for exactly one device of the class."""
    meta = metadata(pod)
    requests = []
    for name, _ in wanted.requests:
        exactly: dict[str, Any] = {"deviceClassName": wanted.device_class, "allocationMode": "ExactCount", "count": 1}
        if name in wanted.selectors:
            exactly["selectors"] = [{"cel": {"expression": wanted.selectors[name]}}]
        requests.append({"name": name, "exactly": exactly})
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim",
            "metadata": {"name": wanted.claim, "namespace": wanted.namespace,
                         "labels": {"app.kubernetes.io/managed-by": "gpu-scheduler"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                              "uid": meta.get("uid"), "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"devices": {"requests": requests}}}


def allocation_for(wanted: Wanted) -> dict[str, Any]:
    return {"devices": {"results": wanted.results()},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [wanted.node]}]}]}}


@dataclass(frozen=True)
class Create:
    """No claim: create claim_for()'s body (409: another writer was first; read it, decide again)."""


@dataclass(frozen=True)
class Update:
    """Write `body` (the claim with the finalizer added) with its resourceVersion as precondition."""

    body: dict[str, Any]


@dataclass(frozen=True)
class UpdateStatus:
    """Write `body` to the status subresource (allocation and reservation) at its resourceVersion."""

    body: dict[str, Any]


@dataclass(frozen=True)
class Ready:
    """Allocated as wanted and reserved for the pod: nothing to write."""


@dataclass(frozen=True)
class Blocked:
    """The claim cannot be made to hold the wanted devices for this pod; `wait`: it is going away
    (deleted, its old owner gone), so a later try may succeed."""

    message: str
    wait: bool = False


def _spec_requests(claim: Mapping[str, Any]) -> list[tuple[Any, Any, Any]]:
    requests = _maps(_map(_map(claim.get("spec")).get("devices")).get("requests"))
    return [(r.get("name"), _map(r.get("exactly")).get("deviceClassName"),
             json.dumps(_map(r.get("exactly")).get("selectors"), sort_keys=True)) for r in requests]


def claim_step(claim: Mapping[str, Any] | None, pod: Mapping[str, Any], wanted: Wanted):
    """What making `claim` (as read; None: absent) hold `wanted` for `pod` takes next:
    Create, Update (the finalizer), UpdateStatus (allocation and reservedFor), Ready or Blocked."""
    if claim is None:
        return Create()
    meta, pod_meta = metadata(claim), metadata(pod)
    name = f"ResourceClaim {wanted.namespace}/{wanted.claim}"
    if meta.get("deletionTimestamp"):
        return Blocked(f"{name} is being deleted; a new one is made once it is gone", wait=True)
    owners = [o for o in _maps(meta.get("ownerReferences")) if o.get("controller") is True]
    if not any(o.get("uid") == pod_meta.get("uid") for o in owners):
        owner = f"{owners[0].get('kind')} {owners[0].get('name')} (uid {owners[0].get('uid')})" if owners else "no pod"
        return Blocked(f"{name} exists but belongs to {owner}, not to this pod; it is deleted with its owner", wait=True)
    status = _map(claim.get("status"))
    allocation = _map(status.get("allocation"))
    reserved = _maps(status.get("reservedFor"))
    want_reserved = {"resource": "pods", "name": pod_meta.get("name"), "uid": pod_meta.get("uid")}
    if allocation:
        have = sorted(json.dumps(r, sort_keys=True) for r in
                      ({k: x.get(k) for k in ("request", "driver", "pool", "device")} for x in _maps(_map(allocation.get("devices")).get("results"))))
        want = sorted(json.dumps(r, sort_keys=True) for r in wanted.results())
        if have != want or _map(allocation.get("nodeSelector")) != allocation_for(wanted)["nodeSelector"]:
            shown_have = ", ".join(f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
                                   for r in _maps(_map(allocation.get("devices")).get("results"))[:SHOWN])
            return Blocked(f"{name} is allocated to other devices or another node ({shown_have or 'none'}) than its map"
                           f" entry wants ({', '.join(str(d) for _, d in wanted.requests[:SHOWN])} on {wanted.node});"
                           " delete the claim to place the pod again")
        if any(r.get("uid") == pod_meta.get("uid") for r in reserved):
            return Ready()
        others = [r for r in reserved if r.get("uid") != pod_meta.get("uid")]
        if others:
            return Blocked(f"{name} is reserved for {others[0].get('resource')} {others[0].get('name')}, not this pod",
                           wait=True)
        body = _copy(claim)
        body["status"]["reservedFor"] = [want_reserved]
        return UpdateStatus(body)
    if sorted(_spec_requests(claim)) != sorted(_spec_requests(claim_for(pod, wanted))):
        return Blocked(f"{name} requests other devices than map entry's ({len(wanted.requests)} of class"
                       f" {wanted.device_class}); its spec cannot change: delete the claim to place the pod again")
    if reserved:
        return Blocked(f"{name} is reserved but not allocated; it is left alone", wait=True)
    if FINALIZER not in (meta.get("finalizers") or []):
        body = _copy(claim)
        body["metadata"]["finalizers"] = [*(meta.get("finalizers") or []), FINALIZER]
        return Update(body)
    body = _copy(claim)
    body["status"] = {**_map(claim.get("status")), "allocation": allocation_for(wanted), "reservedFor": [want_reserved]}
    return UpdateStatus(body)


def deallocated(claim: Mapping[str, Any]) -> dict[str, Any]:
    """The status update that takes back an allocation bind wrote: no allocation, reserved for
    nobody, at the claim's resourceVersion."""
    body = _copy(claim)
    body["status"] = {k: v for k, v in body["status"].items() if k not in ("allocation", "reservedFor")}
    return body


def _copy(claim: Mapping[str, Any]) -> dict[str, Any]:
    """The claim as written back: what it was read as, its resourceVersion the precondition."""
    body = json.loads(json.dumps(claim))
    body.setdefault("status", {})
    body["metadata"].pop("managedFields", None)
    return body


def claim_refs(pod: Mapping[str, Any]) -> list[str]:
    """The claim names mutate referenced in spec.resourceClaims for our entry."""
    return [c.get("resourceClaimName") for c in _maps(spec(pod).get("resourceClaims"))
            if c.get("name") == POD_CLAIM and isinstance(c.get("resourceClaimName"), str)]


# -- what plan and explain show --------------------------------------------------------------------
ABSENT, PENDING, ALLOCATED, RESERVED, RESERVED_ELSEWHERE, DELETING = (
    "NotCreated", "NotAllocated", "Allocated", "Reserved", "ReservedForAnother", "Deleting")


def claim_state(claim: Mapping[str, Any] | None, pod: Mapping[str, Any]) -> dict[str, Any]:
    """A pod's claim as people read it: its state (NotCreated, NotAllocated, Allocated, Reserved
    for this pod, ReservedForAnother, Deleting), the node and devices of its allocation, and whom
    it is reserved for."""
    if claim is None:
        return {"state": ABSENT, "node": None, "devices": [], "reservedFor": []}
    status = _map(claim.get("status"))
    allocation = _map(status.get("allocation"))
    devices = [f"{r.get('driver')}/{r.get('pool')}/{r.get('device')}"
               for r in _maps(_map(allocation.get("devices")).get("results"))]
    nodes = [value for term in _maps(_map(allocation.get("nodeSelector")).get("nodeSelectorTerms"))
             for field_ in _maps(term.get("matchFields")) if field_.get("key") == "metadata.name"
             for value in (field_.get("values") or []) if isinstance(value, str)]
    reserved = [r for r in _maps(status.get("reservedFor"))]
    uid = metadata(pod).get("uid")
    if metadata(claim).get("deletionTimestamp"):
        state = DELETING
    elif any(r.get("uid") == uid for r in reserved):
        state = RESERVED
    elif reserved:
        state = RESERVED_ELSEWHERE
    else:
        state = ALLOCATED if allocation else PENDING
    return {"state": state, "node": nodes[0] if len(nodes) == 1 else None, "devices": devices,
            "reservedFor": [f"{r.get('resource')}/{r.get('name')}" for r in reserved]}
