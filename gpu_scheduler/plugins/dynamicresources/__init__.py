"""DRA mode: the DynamicResources plugin (plugin.py) and the allocator it uses (allocator.py: the
matching of map devices to published devices, and the claims' bodies, as
k8s.io/dynamic-resource-allocation/structured is kube-scheduler's). Nothing is imported here, so
that mutate, whose image has no API client, can use the allocator alone."""
