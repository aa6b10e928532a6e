"""bench/lease_task_bench.py: every shape ends every lease, leaving no lease and no task behind."""

import uvloop

from tests.bench.scripts import load_bench


def test_every_shape_ends_every_lease():
    bench = load_bench("lease_task_bench.py")
    for shape in ("wrapper", "direct", "callbacks"):
        for waits in (0, 1, 3):
            assert uvloop.run(bench._run(shape, 300, waits)) > 0.0, (shape, waits)
