"""What ``LoopLag``'s schedstat read costs the loop thread: ``os.pread`` (releases the GIL) against
``crawlerd._native.schedstat.read_schedstat`` (one C call holding it), with threads beside it that
want the GIL as the daemon's do (short Python bursts between waits).

    .venv/bin/python bench/schedstat_bench.py [--reads 2000] [--threads 2] [--runs 3]

The reading thread reads every 1 ms (``time.sleep``) like a sampling timer, not back to back.
Per read: its wall time, its CPU time (``time.thread_time``) and the context switches it made
(``getrusage(RUSAGE_THREAD)``, voluntary + involuntary). Ways alternate within each run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import threading
import time

from crawlerd._native.schedstat import read_schedstat


def _old(fd: int) -> tuple[float, float]:
    fields = os.pread(fd, 96, 0).split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


def _new(fd: int) -> tuple[float, float]:
    cpu_ns, wait_ns = read_schedstat(fd)
    return cpu_ns / 1e9, wait_ns / 1e9


def _switches() -> int:
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_nvcsw + r.ru_nivcsw


def measure(read, fd: int, reads: int) -> tuple[float, float, float]:
    wall = cpu = 0.0
    sw = 0
    for _ in range(reads):
        time.sleep(0.001)
        s0, c0, w0 = _switches(), time.thread_time(), time.perf_counter()
        read(fd)
        w1, c1, s1 = time.perf_counter(), time.thread_time(), _switches()
        wall += w1 - w0
        cpu += c1 - c0
        sw += s1 - s0
    return wall * 1e6 / reads, cpu * 1e6 / reads, sw / reads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reads", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args(argv)
    stop = threading.Event()

    def busy():                     # a Python burst, then a short wait (the GIL let go)
        while not stop.is_set():
            sum(range(2000))
            time.sleep(0.0002)
    threads = [threading.Thread(target=busy, daemon=True) for _ in range(a.threads)]
    for t in threads:
        t.start()
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    got: dict[str, list[tuple[float, float, float]]] = {"os.pread": [], "native": []}
    try:
        for r in range(a.runs):
            order = (("os.pread", _old), ("native", _new))
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                got[name].append(measure(fn, fd, a.reads))
    finally:
        stop.set()
        os.close(fd)
        for t in threads:
            t.join()
    print(f"{a.reads} reads a run, {a.runs} runs, {a.threads} threads wanting the GIL; medians (runs)")
    print("way        wall µs/read            CPU µs/read             switches/read")
    for name, rows in got.items():
        cols = []
        for k in range(3):
            v = [row[k] for row in rows]
            cols.append(f"{statistics.median(v):6.2f} ({', '.join(f'{x:.2f}' for x in v)})")
        print(f"{name:10} " + "   ".join(cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
