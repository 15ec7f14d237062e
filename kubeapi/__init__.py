"""The Kubernetes API reads and writes of gpu-scheduler's shells (bind, the kubectl plugin): one
thin client over the kubernetes package's configuration, TLS and token handling. Not part of the
pure core (gpu_scheduler/), which does no I/O."""
