"""CPU scheduling of the crawl family's background work: Linux ``SCHED_BATCH``.

The shard's event loop is the latency-bound stage of a crawl; the rest (the writer, DRUM, the
sync, intake-log and index-merge threads, the stall watch, the processing workers) is throughput
work fed by it. Each hand-over wakes one of them: the writer's kick, a DRUM call, a job frame on a
worker's socket. Under the default policy the woken task often preempts the loop on its CPU
(CFS's wake-up preemption), and the loop waits, runnable, in the middle of its iteration. Under
``SCHED_BATCH`` a task keeps its fair share of CPU time but a wake-up never preempts a running
task: it runs when a CPU is free or at the next tick. No privilege is needed, and nothing is
held back on an idle machine.

Measured on a 2-core box with the server on it (20,000 hosts, bench/RESULTS.md, "Background work
under SCHED_BATCH"): pages/s x1.06-1.07, crawl CPU per request x0.92-0.95, in both orders of two
pairs. ``process.batch_scheduling`` turns it off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

_background_batch = True        # process-wide: set once at start from process.batch_scheduling


def set_background_batch(enabled: bool) -> None:
    """Whether threads made by :func:`background_thread` from now on run under ``SCHED_BATCH``."""
    global _background_batch
    _background_batch = enabled


def batch_this_thread() -> bool:
    """Put the calling thread (a task of its own on Linux) under ``SCHED_BATCH``; False where the
    platform has no such policy or refuses it (the thread then keeps the default policy)."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


def background_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread (not started) that runs ``target`` under ``SCHED_BATCH`` unless turned off."""
    batch = _background_batch

    def run() -> None:
        if batch:
            batch_this_thread()
        target()

    return threading.Thread(target=run, name=name, daemon=True)
