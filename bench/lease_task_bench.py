"""What a lease's asyncio machinery costs on the crawl loop, alone (issue 10; twenty-second pass, branch loop22).

A URL lease is a task (``LeaseRunner.start`` through ``Tasks.spawn``) that waits ``--waits``
times on a future another callback resolves (the transfer, the worker's answer, the links'
durability) and then ends (``Tasks``' done callback: the table, the loop's wake-up). Shapes, each
``--leases`` leases started ``LEASES_PER_STEP`` at a time, on uvloop, CPU microseconds per lease
(best of ``--repeats``):

- ``wrapper``: the task runs a wrapper coroutine around the lease's coroutine (as
  ``LeaseRunner._run`` does: ``try/finally`` taking the lease out of the table, then
  ``fetch_url``);
- ``direct``: one coroutine level less: the task runs the lease's coroutine, which takes itself
  out of the table (what dropping ``_run`` would save);
- ``callbacks``: no task and no coroutine, the same future completions drive a plain callback
  per step (what a callback state machine would cost: the floor of a rewrite of the lease path).

The lease's own work is left out (the same in every shape). Run from outside the tree::

    cd /tmp && nice /work/wt/loop22/.venv/bin/python /work/wt/loop22/bench/lease_task_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import time

import uvloop

from crawlerd.shard.leases import LEASES_PER_STEP, LeaseTable
from crawlerd.shard.tasks import Tasks, Wake


class _Lease:
    __slots__ = ("lease_id", "host_key", "kind")

    def __init__(self, lease_id: int):
        self.lease_id, self.host_key, self.kind = lease_id, "h", "url"


def _resolver(loop: asyncio.AbstractEventLoop):
    """A future resolved on the loop's next iteration, like a transfer's or a worker's answer."""
    def future() -> asyncio.Future:
        fut = loop.create_future()
        loop.call_soon(fut.set_result, None)
        return fut
    return future


async def _lease_body(table: LeaseTable, lease: _Lease, future, waits: int) -> None:
    table.started(lease.lease_id)
    try:
        for _ in range(waits):
            await future()
    finally:
        table.discard(lease.lease_id)


async def _wrapped(table: LeaseTable, lease: _Lease, future, waits: int) -> None:
    table.started(lease.lease_id)
    try:
        await _inner(lease, future, waits)
    finally:
        table.discard(lease.lease_id)


async def _inner(lease: _Lease, future, waits: int) -> None:
    for _ in range(waits):
        await future()


def _callbacks(table: LeaseTable, lease: _Lease, future, waits: int, done) -> None:
    table.started(lease.lease_id)
    left = [waits]

    def step(_fut=None) -> None:
        if left[0] == 0:
            table.discard(lease.lease_id)
            done()
            return
        left[0] -= 1
        future().add_done_callback(step)
    step()


async def _run(shape: str, leases: int, waits: int) -> float:
    loop = asyncio.get_running_loop()
    future = _resolver(loop)
    wake = Wake()
    ended = [0]

    def on_done() -> None:
        ended[0] += 1
        wake.set()
    tasks = Tasks(on_done)
    table = LeaseTable()
    next_id = 0
    t0 = time.process_time()
    while ended[0] < leases:
        while next_id < leases and len(table) < 4 * LEASES_PER_STEP:
            for _ in range(min(LEASES_PER_STEP, leases - next_id)):
                next_id += 1
                lease = _Lease(next_id)
                table.add(lease)
                if shape == "wrapper":
                    tasks.spawn(_wrapped(table, lease, future, waits))
                elif shape == "direct":
                    tasks.spawn(_lease_body(table, lease, future, waits))
                else:
                    _callbacks(table, lease, future, waits, on_done)
        await wake.sleep(1.0)
    cpu_us = (time.process_time() - t0) / leases * 1e6
    await asyncio.sleep(0)                  # the last tasks' done callbacks
    if len(table) or len(tasks):
        raise RuntimeError(f"{shape}: {len(table)} leases, {len(tasks)} tasks left")
    return cpu_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leases", type=int, default=50_000)
    ap.add_argument("--waits", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    shapes = ("wrapper", "direct", "callbacks")
    best = {s: float("inf") for s in shapes}
    for _ in range(args.repeats):
        for s in shapes:                    # interleaved: a noisy box moves every shape alike
            best[s] = min(best[s], uvloop.run(_run(s, args.leases, args.waits)))
    for s in shapes:
        print(f"{s:10s} {best[s]:6.2f} us CPU per lease ({args.waits} waits)")


if __name__ == "__main__":
    main()
