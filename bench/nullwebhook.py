"""A null mutating webhook, served as mutate is served (functions-framework's app under gunicorn
with mutate's settings, over TLS, on the same webhook configuration): it reads the AdmissionReview
and allows the pod unchanged. Admission through mutate is measured against it (bench/run.py,
issue 53): mutate's own cost, apart from what any webhook costs (the API server's call, TLS,
HTTP, JSON).

At /patch it answers with the patch mutate gives the bench's pods (bench/run.py: pod, index 0),
fixed: what the API server does with a mutating webhook's patch (apply it, decode the pod again,
admit its extended resource, store a larger pod), apart from mutate's own work. Admission through
mutate is measured against that too (issue 62: where the rest of mutate's cost over the null
webhook goes)."""
import base64
import json

import functions_framework


@functions_framework.http
def null(request):
    if request.path.startswith("/health/"):
        return "ok\n", 200
    review = json.loads(request.get_data())
    response = {"uid": review["request"]["uid"], "allowed": True}
    if request.path == "/patch":
        response.update(patchType="JSONPatch", patch=MUTATES_PATCH)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


# mutate's patch for bench/run.py's pod(namespace, 0, map_for(n)); tests/test_bench_references.py
# checks it still is
MUTATES_PATCH_OPS = [
    {"op": "add", "path": "/spec/containers/0/resources", "value": {}},
    {"op": "add", "path": "/spec/containers/0/resources/requests", "value": {"gpu-scheduler.io/gpu": "1"}},
    {"op": "add", "path": "/spec/containers/0/resources/limits", "value": {"gpu-scheduler.io/gpu": "1"}},
    {"op": "add", "path": "/spec/containers/0/env",
     "value": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}, {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}]},
    {"op": "add", "path": "/metadata/labels", "value": {"gpu-scheduler/managed": "true"}},
]
MUTATES_PATCH = base64.b64encode(json.dumps(MUTATES_PATCH_OPS).encode()).decode()
