"""The crawl process's cost of the per-request machinery alone: lease task, fetch wait, worker slot,
answer, task end, the shard loop's sleep and wake (issue 10, branch loop7-path).

Each "lease" is a task started through the shard's ``Tasks``; it awaits a stand-in fetch (a
future the loop resolves a moment later, as curl's answer would be), then ``WorkerPool.process``
with a small page (real worker processes; their CPU is not counted), then ends. A loop like
``Shard.run`` keeps ``--window`` leases going, sleeping between steps until a lease ends (the
shard's wake-up: ``Wake`` where the code has it, else the ``asyncio.Event`` + ``wait_for`` the
shard used before). The pool holds ``workers x jobs_per_worker`` jobs; a window beyond that makes
leases wait for a slot, as in a crawl whose workers are the bottleneck.

Reported: CPU seconds of this process (all its threads; not the workers) per lease, min of
``--repeats``. Run it with each tree's Python to compare (the same script):

    .venv/bin/python bench/loop_path_bench.py
    /work/wt/base-main/.venv/bin/python bench/loop_path_bench.py

Under ``valgrind --tool=callgrind`` (``--leases`` small) the instruction counts do not move with
the box's load, as CPU time does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time

import uvloop

from crawlerd.outcome import Outcome
from crawlerd.process.pool import WorkerPool
from crawlerd.records import FetchResult
from crawlerd.shard.tasks import Tasks

try:
    from crawlerd.shard.tasks import Wake
except ImportError:         # a tree from before Wake: the shard's Event + wait_for
    Wake = None

BODY = (b"<!DOCTYPE html><html><head><title>t</title></head><body><p>"
        + b"crawler politeness frontier " * 20 + b"</p></body></html>")
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: "
        + str(len(BODY)).encode() + b"\r\n\r\n")


def result(i: int) -> FetchResult:
    url = f"http://h{i % 997}.test/p/{i}.html"
    return FetchResult(url=url, outcome=Outcome.OK, status=200, ip="127.0.0.1", started_at=1.7e9 + i,
                       elapsed_s=0.01, request_head=f"GET /p/{i}.html HTTP/1.1\r\n\r\n".encode(),
                       response_head=HEAD, body=BODY,
                       headers=[("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(BODY)))])


class EventWake:
    """The shard's sleep before ``Wake``: clear, then ``wait_for(event.wait(), timeout)``."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.set = self.event.set

    async def sleep(self, timeout_s: float) -> None:
        self.event.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout=timeout_s)


async def crawl(pool: WorkerPool, leases: int, window: int) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    wake = Wake() if Wake is not None else EventWake()
    tasks = Tasks(wake.set)
    started = 0
    steps = 0

    async def lease(i: int) -> None:
        fut = loop.create_future()
        loop.call_soon(fut.set_result, result(i))       # the fetch's answer, a moment later
        res = await fut
        pr = await pool.process(res, None, lookup=False)
        if pr.outcome is not Outcome.OK:
            raise RuntimeError(f"{pr.outcome} {pr.error}")

    cpu0 = time.process_time()
    while started < leases or len(tasks):
        steps += 1
        free = min(window - len(tasks), leases - started, 32)      # LEASES_PER_STEP
        for _ in range(max(free, 0)):
            tasks.spawn(lease(started))
            started += 1
        await wake.sleep(0.05)
    cpu = time.process_time() - cpu0
    if tasks.recent_errors:
        raise RuntimeError(list(tasks.recent_errors)[-1])
    return cpu, steps


async def one(args, work: str) -> dict:
    init = {"warc_dir": os.path.join(work, "warc"), "index_dir": os.path.join(work, "index"), "prefix": "b",
            "segment_max_bytes": 1 << 30, "shard": "0", "user_agent": "crawlerd-bench/0.1",
            "agent_token": "crawlerd", "max_decoded_bytes": 1 << 20, "max_links": 5000}
    pool = WorkerPool(args.workers, init, jobs_per_worker=args.jobs_per_worker)
    await pool.start()
    try:
        await crawl(pool, min(args.leases, 500), args.window)         # warm-up: imports, caches
        cpu, steps = await crawl(pool, args.leases, args.window)
    finally:
        await pool.close()
    return {"cpu_us_per_lease": 1e6 * cpu / args.leases, "steps": steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--leases", type=int, default=20000)
    p.add_argument("--window", type=int, default=256, help="leases going at once")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--jobs-per-worker", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args()
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="crawlerd-loop-path-") as work:
            runs.append(uvloop.run(one(args, work)))
    best = min(r["cpu_us_per_lease"] for r in runs)
    out = {"python": sys.executable, "wake": "Wake" if Wake is not None else "Event+wait_for",
           "leases": args.leases, "window": args.window, "capacity": args.workers * args.jobs_per_worker,
           "cpu_us_per_lease_min": round(best, 2), "runs": runs}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
