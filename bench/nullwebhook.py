"""A null mutating webhook, served as mutate is served (functions-framework's app under gunicorn
with mutate's settings, over TLS, on the same webhook configuration): it reads the AdmissionReview
and allows the pod unchanged. Admission through mutate is measured against it (bench/run.py,
issue 53): mutate's own cost, apart from what any webhook costs (the API server's call, TLS,
HTTP, JSON)."""
import json

import functions_framework


@functions_framework.http
def null(request):
    if request.path.startswith("/health/"):
        return "ok\n", 200
    review = json.loads(request.get_data())
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True}}
