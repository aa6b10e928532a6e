"""The frontier's loop-side CPU with its commits on the loop or on the writer thread (branch fq15).

A Frontier of ``--hosts`` hosts and ``--urls`` queued URLs is driven as the shard drives it: every
tick (``--tick-ms`` of real time, 1/20 s of the frontier's virtual clock) it completes the leases of
the tick before, leases up to ``--leases`` due hosts, and adds ``--adds`` new URLs (made before the
clock starts; one ``add``:
a DRUM delivery's commit, with a seen-set mark); every 2 s of virtual time the shard's periodic
commit. A ``WriteThread`` is attached as the shard attaches it: in a tree where the frontier's
store commits on the loop (main) it takes only the journal's end lines; in one where it is
written there (fq15) it takes the store's commits too, which the loop then reads through an overlay
until they land. Prints the loop thread's CPU (``time.thread_time``) per tick and per lease, the
worst tick, and the writer's time, per run.

    .venv/bin/python bench/frontier_writer_bench.py [--tree DIR] [--ticks 1500] [--runs 3]

``--tree DIR`` imports crawlerd from another tree (the base), so one script times both; run both
back to back, alternated, on a box as quiet as it gets (the CPU figures are per thread).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default=None)
    ap.add_argument("--hosts", type=int, default=5000)
    ap.add_argument("--urls", type=int, default=100_000)
    ap.add_argument("--ticks", type=int, default=1500)
    ap.add_argument("--tick-ms", type=float, default=10.0)
    ap.add_argument("--leases", type=int, default=40)
    ap.add_argument("--adds", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.tree:
        sys.path.insert(0, os.path.abspath(a.tree))
    from crawlerd.frontier import Frontier, QueuedURL
    from crawlerd.outcome import Outcome
    from crawlerd.store.writer import WriteThread

    class Clock:
        t = 1000.0

        def __call__(self) -> float:
            return self.t

    async def one(seed: int) -> dict:
        rng = random.Random(seed)
        clock = Clock()
        with tempfile.TemporaryDirectory() as d:
            f = Frontier(d, clock=clock, wall=clock, rng=random.Random(seed), map_size_bytes=1 << 32, sync=False,
                         min_delay_s=1.0, delay_factor=2.0, max_active_hosts=a.hosts * 2,
                         write_buffer_bytes=8 << 20)
            hosts = [f"http://h{i}.bench" for i in range(a.hosts)]
            n = 0

            def batch(k: int) -> list:
                nonlocal n
                out = []
                for _ in range(k):
                    h = hosts[int(rng.paretovariate(1.2)) % a.hosts]
                    out.append(QueuedURL(f"{h}/p{n}", h, priority=rng.randrange(3), fp=n))
                    n += 1
                return out
            for _ in range(a.urls // 5000):
                f.add(batch(5000))
            for hk in f.hosts_needing_dns():
                f.set_host_ip(hk, f"127.1.{(hash(hk) >> 8) & 255}.{hash(hk) & 255}")
            for hk in hosts:
                f.set_robots(hk, expires_at=clock.t + 1e6, crawl_delay_s=None)
            f.commit(flush=False)
            writer = WriteThread(asyncio.get_running_loop())
            f.attach_writer(writer)
            out: list = []
            mark = 1
            batches = [batch(a.adds) for _ in range(a.ticks)]      # made before the clock starts
            tick_cpu = []
            cpu0 = time.thread_time()
            leased = 0
            last_commit = clock.t
            for tick in range(a.ticks):
                t0 = time.thread_time()
                for x in out:
                    f.complete(x.lease_id, outcome=Outcome.OK, status=200, response_time_s=0.1 * rng.random())
                out = f.lease(clock.t, a.leases)
                leased += len(out)
                mark += a.adds
                f.add(batches[tick], seen_mark=mark)
                for hk in f.hosts_needing_dns():
                    f.set_host_ip(hk, "127.2.0.1")
                if clock.t - last_commit >= 2.0:
                    last_commit = clock.t
                    f.expire_leases(clock.t)
                    f.commit(flush=False)
                tick_cpu.append(time.thread_time() - t0)
                clock.t += 0.05
                await asyncio.sleep(a.tick_ms / 1000)       # landings run on the loop meanwhile
            done = asyncio.get_running_loop().create_future()
            f.commit(flush=False)
            writer.barrier(lambda: done.set_result(None))
            await done
            cpu = time.thread_time() - cpu0
            f.attach_writer(None)
            writer.close()
            st = writer.stats()
            f.close()
        tick_cpu.sort()
        return {"loop_cpu_s": round(cpu, 3), "us_per_tick": round(1e6 * cpu / a.ticks, 1),
                "us_per_lease": round(1e6 * cpu / max(1, leased), 1), "leases": leased,
                "p99_tick_ms": round(1000 * tick_cpu[int(0.99 * len(tick_cpu))], 2),
                "max_tick_ms": round(1000 * tick_cpu[-1], 2), "writer_s": st["write_s"],
                "writer_groups": st["groups"]}

    results = []
    for r in range(a.runs):
        res = asyncio.run(one(r + 1))
        print(json.dumps(res), flush=True)
        results.append(res)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh)


if __name__ == "__main__":
    main()
