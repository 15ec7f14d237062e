"""The pure core of gpu-scheduler: no I/O, no Kubernetes client, no HTTP.

Data flows map text -> `parse_map` -> `Placement`; pod -> `pod_index`; both -> `placement.resolve`;
then `admission` turns a placement into a JSONPatch and `binding` into a Binding body.
"""
ANNOTATION = "gpu-scheduling-map"
SCHEDULER_NAME = "gpu-scheduler"
# Added by the webhook to every pod it places, so an ApiServerSource can select only our pods.
MANAGED_LABEL = "gpu-scheduler/managed"
MANAGED_VALUE = "true"
