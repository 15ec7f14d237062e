"""bench/gang.py's rows, offline: the table `make bench` prints at the end of its run."""
from __future__ import annotations

from bench import gang


def run(create_to_bound: float) -> dict:
    return {"create_to_bound_s": create_to_bound, "tail_s": 0.4, "created_s": 2.0, "bindings_s": 0.9}


def test_rows_give_the_ratio_the_tail_and_every_run():
    figures = {"replicas": 100, "reps": 2, "ratio": 1.25,
               "gang": {**run(3.5), "runs": [run(3.0), run(4.0)]},
               "non-gang": {**run(2.8), "runs": [run(2.6), run(3.0)]}}
    rows = gang.rows(figures)
    assert "gang of 100" in rows[0] and "1.25 (3.50/2.80s)" in rows[0] and rows[0].endswith("MISS")
    assert "400" in rows[1] and rows[-1].endswith("3.00, 4.00; 2.60, 3.00")
