"""`kubectl gpu-scheduler`: the kubectl plugin, a third shell over the pure core beside bind and
mutate. It reads files and the Kubernetes API (with bind's client, kubeapi/) and formats what
gpu_scheduler.plan returns; every decision is the core's."""
