"""The seen-set's hand-over cost per submit, as the crawl loop pays it: CPU of the whole process
(the loop, the DRUM thread, the intake writer thread) per submitted key.

A page's links arrive as one ``submit`` of ~40 keys about every millisecond (a crawl at ~1,000
pages/s); every DRUM job costs a trip to the DRUM thread and back and an intake segment created
and deleted. ``--gap`` sets ``job_gap_s`` (0 = a job per loop iteration that has keys, as before
the gap was added). ``--inline-intake``: the intake log written on the loop, as the budget
stage's edge DRUM does (a page's few domain edges per submit: ``--keys 3``).

    .venv/bin/python bench/seen_pump_bench.py --gap 0 --gap 0.02 --seconds 5 --runs 3
    .venv/bin/python bench/seen_pump_bench.py --inline-intake --keys 3 --gap 0.02 --gap 0.25
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import tempfile
import time

import numpy as np
import uvloop

from crawlerd.seen import AsyncSeenSet


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _switches() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw + r.ru_nivcsw


async def _one(path: str, gap: float, seconds: float, keys_per_submit: int, period_s: float,
               threaded: bool = True) -> dict:
    loop = asyncio.get_running_loop()
    kw = {} if gap < 0 else {"job_gap_s": gap}
    s = AsyncSeenSet(path, buckets=64, cache_entries=1 << 16, threaded_intake=threaded, **kw)
    got = [0]

    def on(results):
        got[0] += len(results)
        s.ack()

    s.start(loop, on)
    rng = np.random.default_rng(1)
    await asyncio.sleep(0.2)
    c0, w0, j0, x0 = _cpu(), time.perf_counter(), s.stats()["jobs"], _switches()
    n = 0
    end = loop.time() + seconds
    while loop.time() < end:
        s.submit(rng.integers(0, 1 << 62, keys_per_submit, dtype=np.uint64))
        n += keys_per_submit
        await asyncio.sleep(period_s)
    cpu, wall, jobs, sw = _cpu() - c0, time.perf_counter() - w0, s.stats()["jobs"] - j0, _switches() - x0
    await s.close()
    return {"keys": n, "cpu_s": cpu, "wall_s": wall, "jobs": jobs, "switches": sw}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gap", type=float, action="append",
                   help="job_gap_s to run (repeatable; -1: the seen-set's default, for a tree without the knob)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--keys", type=int, default=40, help="keys per submit")
    p.add_argument("--period-ms", type=float, default=1.0, help="time between submits")
    p.add_argument("--inline-intake", action="store_true", help="the intake log written on the loop (edge DRUM)")
    a = p.parse_args()
    gaps = a.gap or [0.0, 0.02]
    for r in range(a.runs):
        for gap in gaps:
            d = tempfile.mkdtemp(prefix="seen-pump-")
            try:
                o = uvloop.run(_one(d, gap, a.seconds, a.keys, a.period_ms / 1000, not a.inline_intake))
            finally:
                shutil.rmtree(d, ignore_errors=True)
            label = "default" if gap < 0 else f"{gap * 1000:5.1f} ms"
            print(f"run {r} gap {label}: {o['jobs'] / o['wall_s']:7.1f} jobs/s, "
                  f"{1e6 * o['cpu_s'] / o['keys']:6.2f} us CPU/key, {1e6 * o['cpu_s'] / (o['keys'] / a.keys):6.1f} us "
                  f"CPU/submit, {o['switches'] / o['wall_s']:7.1f} context switches/s", flush=True)


if __name__ == "__main__":
    main()
