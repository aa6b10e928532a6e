"""GIL hand-offs between the loop and its helper threads, alone (issue 10, bench/RESULTS.md "tenth pass").

A *loop* thread runs units of Python work, each with ``--gets`` LMDB reads (py-lmdb drops the GIL
around each); a *writer* thread applies a group of ``--puts`` sorted puts every ``--delay`` s (one
write transaction, as the store's writer thread does: py-lmdb drops the GIL around each put); a
*python* thread runs ``--busy-ms`` of pure Python every 30 ms (the DRUM thread's journal code).
Reported per run: loop units a second, the process's CPU per unit (all threads), the loop's unit
latency p99.9 and worst (a unit is delayed when the loop waits for the GIL), voluntary context
switches per unit (all threads). Variants: ``--switch-ms`` (``sys.setswitchinterval``) and
``--puts`` (0: no writer). Timing: run it under the shared bench lock, as the e2e bench.

    .venv/bin/python bench/gil_handoff_bench.py --seconds 5 --switch-ms 1 --switch-ms 5 --switch-ms 20
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def _switches() -> int:
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            st = open(f"/proc/self/task/{t}/status").read()
        except OSError:
            continue
        n += int(st.split("voluntary_ctxt_switches:")[1].split()[0])
    return n


def run_one(a) -> str:
    import lmdb
    sys.setswitchinterval(a.switch_ms / 1000)
    d = tempfile.mkdtemp(prefix="gilbench-")
    try:
        env = lmdb.open(d, map_size=1 << 30, sync=False, metasync=False)
        rnd = random.Random(7)
        keys = [rnd.randbytes(16) for _ in range(100_000)]
        with env.begin(write=True) as t:
            t.cursor().putmulti(sorted((k, rnd.randbytes(60)) for k in keys[:50_000]))
        stop = threading.Event()
        groups = [0]

        def writer() -> None:
            r = random.Random(1)
            while not stop.wait(a.delay):
                items = sorted((keys[r.randrange(len(keys))], b"v" * 60) for _ in range(a.puts))
                with env.begin(write=True) as t:
                    t.cursor().putmulti(items)
                groups[0] += 1

        def python() -> None:
            while not stop.wait(0.03):
                end = time.perf_counter() + a.busy_ms / 1000
                x = {}
                while time.perf_counter() < end:
                    for i in range(200):
                        x[i] = i * 2
        helpers = []
        if a.puts:
            helpers.append(threading.Thread(target=writer, daemon=True))
        if a.busy_ms:
            helpers.append(threading.Thread(target=python, daemon=True))
        for t in helpers:
            t.start()
        lat: list[float] = []
        units = [0]

        def loop() -> None:
            r = random.Random(2)
            txn = env.begin()
            d: dict = {}
            end = time.monotonic() + a.seconds
            pc = time.perf_counter
            while time.monotonic() < end:
                t0 = pc()
                for i in range(a.work):
                    d[i & 1023] = i
                for _ in range(a.gets):
                    txn.get(keys[r.randrange(len(keys))])
                lat.append(pc() - t0)
                units[0] += 1
                if units[0] % 500 == 0:
                    txn.abort()
                    txn = env.begin()
            txn.abort()
        time.sleep(0.2)
        s0, r0, w0 = _switches(), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        lt = threading.Thread(target=loop)
        lt.start()
        lt.join()
        r1, w1, s1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic(), _switches()
        stop.set()
        for t in helpers:
            t.join()
        env.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    n = units[0]
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    lat.sort()
    p999 = lat[min(len(lat) - 1, int(len(lat) * 0.999))]
    return (f"switch {a.switch_ms:g} ms, puts {a.puts}/group, busy {a.busy_ms:g} ms: {n / (w1 - w0):9.0f} units/s  "
            f"cpu {1e6 * cpu / n:6.2f} µs/unit  latency p99.9 {1e3 * p999:6.2f} ms  worst {1e3 * lat[-1]:6.2f} ms  "
            f"switches {(s1 - s0) / n:5.3f}/unit  groups {groups[0]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--switch-ms", type=float, action="append", help="sys.setswitchinterval in ms (repeat)")
    ap.add_argument("--puts", type=int, action="append", help="writer puts per group (repeat; 0: no writer)")
    ap.add_argument("--delay", type=float, default=0.05, help="s between writer groups")
    ap.add_argument("--busy-ms", type=float, default=2.0, help="pure-Python ms per 30 ms on a third thread")
    ap.add_argument("--gets", type=int, default=2, help="LMDB reads per loop unit")
    ap.add_argument("--work", type=int, default=300, help="dict stores per loop unit (~10 µs)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        a.switch_ms = a.switch_ms[0]
        a.puts = a.puts[0]
        print(run_one(a), flush=True)
        return
    for _ in range(a.runs):
        for sw in a.switch_ms or [5.0]:
            for puts in a.puts or [2000]:
                # each variant in a fresh process (the interval and the allocator start clean)
                subprocess.run([sys.executable, __file__, "--one", "--seconds", str(a.seconds), "--switch-ms", str(sw),
                                "--puts", str(puts), "--delay", str(a.delay), "--busy-ms", str(a.busy_ms),
                                "--gets", str(a.gets), "--work", str(a.work)], check=True)


if __name__ == "__main__":
    main()
