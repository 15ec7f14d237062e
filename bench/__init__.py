import itertools

# One counter of bench namespaces for the whole process: `python -m bench.run` runs as __main__,
# and the modules that import bench.run (gang, quota, framework) get a second copy of it, whose own
# counter named namespaces that the first had made and that were still being deleted (409).
_numbers = itertools.count()


def namespace_name() -> str:
    return f"bench-{next(_numbers)}"
