"""gpu-scheduler's scheduling framework, after kube-scheduler's: extension points (interface.py),
a snapshot per attempt (snapshot.py), profiles as data (profile.py) and their runner (runtime.py).
It imports no plugin: the plugins and the registry that names them are gpu_scheduler/plugins/.
docs/framework.md draws the phases."""
