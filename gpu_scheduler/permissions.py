"""Every Kubernetes API call each component makes, as RBAC rules: the one place they are listed.

`knative/` grants exactly these and tests check both directions: the manifests grant no more,
and the running code needs no more (by impersonating the ServiceAccount on a real API server).
"""
# (apiGroup, resource, verb)
BIND = frozenset({
    ("", "pods", "get"),            # a pod an event names that bind's watch does not hold yet; re-read after a 409
    ("", "pods", "list"),           # the pod watch's listing: our pending pods and the pods on every node
    ("", "pods", "watch"),          # the cluster's pods, kept current: bind's queue, fit and GPU accounting
    ("", "pods/binding", "create"),  # the placement itself
    ("", "pods/status", "patch"),   # PodScheduled=False with the reason, as kube-scheduler does; preemption's
                                    # nominatedNodeName and its victims' DisruptionTarget condition
    ("", "pods/eviction", "create"),  # preemption evicts its victims through the Eviction API (budgets hold)
    ("policy", "poddisruptionbudgets", "list"),   # preemption: the budgets' watch's listing
    ("policy", "poddisruptionbudgets", "watch"),  # a victim a budget protects now is not evicted
    ("", "events", "create"),       # Scheduled / FailedScheduling
    ("", "events", "get"),          # an Event another instance created: read its count
    ("", "events", "patch"),        # count up a repeated FailedScheduling instead of a new Event
    ("", "nodes", "list"),          # the node watch's listing
    ("", "nodes", "watch"),         # labels, taints, conditions and allocatable, kept current
    ("", "nodes/status", "patch"),  # quotas: each node advertises the resources pinned pods request (quota.py)
    ("", "resourcequotas", "list"),   # quotas: the ResourceQuotas' watch's listing
    ("", "resourcequotas", "watch"),  # GPUQuota refuses a pod counted for too few GPUs only where a quota counts them
    # Sink authentication, where Knative's authentication-oidc is on: is this the source's token?
    ("authentication.k8s.io", "tokenreviews", "create"),
    # DRA mode (gpu_scheduler/plugins/dynamicresources/allocator.py): the devices each node publishes, and every claim's
    # allocation (a device allocated in any claim is held).
    ("resource.k8s.io", "resourceslices", "list"),
    ("resource.k8s.io", "resourceslices", "watch"),
    ("resource.k8s.io", "resourceclaims", "list"),
    ("resource.k8s.io", "resourceclaims", "watch"),
    ("resource.k8s.io", "resourceclaims", "get"),            # a claim another writer changed first (409)
    ("resource.k8s.io", "resourceclaims", "create"),         # the pod's claim, <pod>-gpus
    ("resource.k8s.io", "resourceclaims", "update"),         # its finalizer, before allocating
    ("resource.k8s.io", "resourceclaims/status", "update"),  # its allocation and reservation for the pod
    # From 1.36 (DRAResourceClaimGranularStatusAuthorization) that status update's allocation and
    # reservedFor need `update` on this synthetic subresource too, cluster-wide.
    ("resource.k8s.io", "resourceclaims/binding", "update"),
})
# What bind uses only with quotas on (GPU_SCHEDULER_QUOTA; the chart's quota.enabled): the chart grants
# it only then, and mutate (MUTATE_QUOTA) likewise.
BIND_QUOTA = frozenset({
    ("", "nodes/status", "patch"),
    ("", "resourcequotas", "list"),
    ("", "resourcequotas", "watch"),
})
# bind's device records: one Lease per node and device, in bind's own namespace only (a Role).
BIND_RECORDS = frozenset({
    ("coordination.k8s.io", "leases", "get"),     # the record another instance wrote first
    ("coordination.k8s.io", "leases", "list"),    # the record watch's listing
    ("coordination.k8s.io", "leases", "watch"),   # every record, kept current
    ("coordination.k8s.io", "leases", "create"),  # a device given: create-if-absent is the lock
    ("coordination.k8s.io", "leases", "update"),  # a sibling joins, a free record is taken over
    ("coordination.k8s.io", "leases", "delete"),  # a record whose pods are gone is removed
})
# mutate, with quotas on: the GPU type of the node a pod is pinned to (its nvidia.com/gpu.product
# label), for the per-type quota request (functions/mutate/nodeproduct.py).
MUTATE_QUOTA = frozenset({
    ("", "nodes", "get"),
})
MUTATE = MUTATE_QUOTA | frozenset({
    # A JobSet's pod: its Job's completions and its gang's size (gpu_scheduler/workloads.py).
    ("jobset.x-k8s.io", "jobsets", "get"),
})
# The ApiServerSource's own account: it lists and watches pods and sends them on.
EVENT_SOURCE = frozenset({
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
})
# The kubectl plugin (kubectl gpu-scheduler plan --cluster / explain / suggest) only reads: what a user
# running it needs, on top of nothing else.
PLUGIN = frozenset({
    ("", "pods", "get"),            # explain: the pod
    ("", "pods", "list"),           # the pods on a node, for the fit and GPU checks bind makes
    ("", "nodes", "get"),           # the node checks bind makes
    ("", "nodes", "list"),          # suggest: every node is a candidate for a replica
    ("", "events", "list"),         # explain: gpu-scheduler's Events on the pod
    ("policy", "poddisruptionbudgets", "list"),  # explain: the budgets that keep bind from preempting a pod
    ("", "resourcequotas", "list"),  # plan --cluster, explain: the namespace's quota on GPUs and its use
    # bind's device records (Leases in its namespace): GPUsHeld reads them as bind does
    ("coordination.k8s.io", "leases", "list"),
    # DRA mode: the pod's claim, the devices its node publishes, and the devices other claims hold.
    ("resource.k8s.io", "resourceclaims", "get"),
    ("resource.k8s.io", "resourceclaims", "list"),
    ("resource.k8s.io", "resourceslices", "list"),
})
# `kubectl gpu-scheduler gpus --watch` only, besides PLUGIN: it draws again whenever a watch of
# these reports a change, rather than polling (the README names them, with that reason).
PLUGIN_WATCH = frozenset({
    ("", "pods", "watch"),
    ("", "nodes", "watch"),
    ("coordination.k8s.io", "leases", "watch"),  # bind's records, in its namespace
})
# The chart's pre-delete hook (functions/bind/uninstall.py): bind's two bindings revoked first (only
# those, by name: the chart's rules carry resourceNames), so that a bind still running cannot put
# back what follows; then every node's advertised quota resources removed.
UNINSTALL = frozenset({
    ("rbac.authorization.k8s.io", "clusterrolebindings", "delete"),  # bind's ClusterRoleBinding
    ("", "nodes", "list"),           # every node, to find what bind advertised
    ("", "nodes/status", "patch"),   # the gpu-scheduler.io resources removed from capacity and allocatable
})
# ... and in bind's namespace: its records' RoleBinding revoked, then the records deleted.
UNINSTALL_RECORDS = frozenset({
    ("rbac.authorization.k8s.io", "rolebindings", "delete"),  # bind-records
    ("coordination.k8s.io", "leases", "list"),
    ("coordination.k8s.io", "leases", "delete"),
})
