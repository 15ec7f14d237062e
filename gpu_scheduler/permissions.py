"""Every Kubernetes API call each component makes, as RBAC rules: the one place they are listed.

`knative/` grants exactly these and tests check both directions: the manifests grant no more,
and the running code needs no more (by impersonating the ServiceAccount on a real API server).
"""
# (apiGroup, resource, verb)
BIND = frozenset({
    ("", "pods", "get"),            # re-read a pod after a 409 from pods/binding
    ("", "pods", "list"),           # resync: pending pods of ours in all namespaces; a node's pods
    ("", "pods", "watch"),          # the pods on the nodes bind places on, kept current (fit, GPUs)
    ("", "pods/binding", "create"),  # the placement itself
    ("", "pods/status", "patch"),   # PodScheduled=False with the reason, as kube-scheduler does
    ("", "events", "create"),       # Scheduled / FailedScheduling
    ("", "events", "get"),          # an Event another instance created: read its count
    ("", "events", "patch"),        # count up a repeated FailedScheduling instead of a new Event
    ("", "nodes", "get"),           # node checks before binding
    # Sink authentication, where Knative's authentication-oidc is on: is this the source's token?
    ("authentication.k8s.io", "tokenreviews", "create"),
})
# The ApiServerSource's own account: it lists and watches pods and sends them on.
EVENT_SOURCE = frozenset({
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
})
# The kubectl plugin (kubectl gpu-scheduler plan --cluster / explain) only reads: what a user
# running it needs, on top of nothing else.
PLUGIN = frozenset({
    ("", "pods", "get"),            # explain: the pod
    ("", "pods", "list"),           # the pods on a node, for the fit and GPU checks bind makes
    ("", "nodes", "get"),           # the node checks bind makes
    ("", "events", "list"),         # explain: gpu-scheduler's Events on the pod
})
