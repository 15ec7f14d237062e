"""gpu-scheduler's scheduling framework, after kube-scheduler's: extension points
(interface.py), a snapshot per attempt (snapshot.py), one profile (profile.py) and its runner
(runtime.py). The plugins are gpu_scheduler/plugins/, one module each."""
