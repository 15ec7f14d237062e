import itertools

# One counter of bench namespaces for the whole process: `python -m bench.run` runs as __main__,
# and the modules that import bench.run (gang, quota, framework) get a second copy of it, whose own
# counter named namespaces that the first had made and that were still being deleted (409).
_numbers = itertools.count()


def namespace_name() -> str:
    return f"bench-{next(_numbers)}"


def figure_line(name: str, value: str, goal: str = "(report)", ok: bool | None = None) -> str:
    """One printed figure: its name, its value, its goal and, where it has one, PASS or MISS."""
    verdict = "" if ok is None else ("PASS" if ok else "MISS")
    return f"{name:<62} {value:>20} {goal:>12}  {verdict}"
