"""The plugins of gpu-scheduler's one profile, a module each, after kube-scheduler's
(pkg/scheduler/framework/plugins): each has its name, its pure filter over a NodeSnapshot, its
messages, and the cluster events that can undo its refusal. The profile that orders them is
gpu_scheduler/framework/profile.py."""
