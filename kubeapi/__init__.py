"""The Kubernetes API reads and writes of gpu-scheduler's shells (bind, the kubectl plugin): one
thin client with its own configuration loader (kubeapi/kubeconfig.py) and transport. Not part of the
pure core (gpu_scheduler/), which does no I/O."""
