"""The plugins of gpu-scheduler's one profile, a module each, after kube-scheduler's
(pkg/scheduler/framework/plugins): each has its name, its pure filter over a NodeSnapshot, its
messages, and the cluster events that can undo its refusal. The profile that orders them is
registry.py (the registry, and the default profile as data); the framework builds it and
imports none of them."""
