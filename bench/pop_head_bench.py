"""The lease path's queue pop (``FrontierStore.pop_head``) and an add's queue puts (``put_sorted``)
with a writer attached, CPU per call, for an A/B of two trees (branch head16: the queue heads).

A store of ``--hosts`` hosts with ``--depth`` URLs queued each (two levels) is committed, then a
``WriteThread`` is attached as the shard attaches it. Each round pops the head of every host of a
working set of ``--working`` hosts (each host's level 0, then 1 when 0 runs dry), adds ``--adds``
new URLs (hosts drawn at random, half of them in the working set), and every ``--commit-every``
rounds commits (the landing runs on the loop between rounds); the working set moves on by a
quarter every ``--session`` rounds. Prints the median over ``--runs`` of the loop's
``time.perf_counter`` per pop and per added URL (the loop is the only thread doing Python work
between landings).

    .venv/bin/python bench/pop_head_bench.py [--tree DIR] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default=None, help="import crawlerd from this tree (the base)")
    ap.add_argument("--hosts", type=int, default=20_000)
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--working", type=int, default=1000)
    ap.add_argument("--session", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--adds", type=int, default=1500)
    ap.add_argument("--commit-every", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if a.tree:
        sys.path.insert(0, os.path.abspath(a.tree))
    from crawlerd.frontier.items import qkey, qprefix
    from crawlerd.frontier.queues import FrontierStore
    from crawlerd.store.writer import WriteThread

    async def one(seed: int) -> tuple[float, float]:
        rng = random.Random(seed)
        with tempfile.TemporaryDirectory() as d:
            st = FrontierStore(d, map_size_bytes=1 << 32, sync=False)
            seq = 0
            items = []
            for h in range(a.hosts):
                for _ in range(a.depth):
                    seq += 1
                    items.append((qkey(h, rng.randrange(2), seq), os.urandom(40) + b"http://h%d.sim/p%d" % (h, seq)))
            st.put_sorted(items)
            st.commit()
            writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.002)
            st.attach_writer(writer)
            pop_s = add_s = 0.0
            pops = adds = 0
            first = 0
            for r in range(a.rounds):
                if r and r % a.session == 0:
                    first += a.working // 4
                members = [(first + i) % a.hosts for i in range(a.working)]
                t0 = time.perf_counter()
                for h in members:
                    if st.pop_head(qprefix(h, 0)) is None:
                        st.pop_head(qprefix(h, 1))
                    pops += 1
                t1 = time.perf_counter()
                batch = []
                for _ in range(a.adds):
                    h = rng.choice(members) if rng.random() < 0.5 else rng.randrange(a.hosts)
                    seq += 1
                    batch.append((qkey(h, rng.randrange(2), seq), os.urandom(40) + b"http://h%d.sim/q%d" % (h, seq)))
                t2 = time.perf_counter()
                st.put_sorted(batch)
                t3 = time.perf_counter()
                pop_s += t1 - t0
                add_s += t3 - t2
                adds += a.adds
                if r % a.commit_every == 0:
                    st.commit()
                await asyncio.sleep(0.003)          # landings run on the loop meanwhile
            done = asyncio.get_running_loop().create_future()
            st.commit(lambda: done.set_result(None))
            await done
            st.attach_writer(None)
            writer.close()
            st.close()
        return 1e6 * pop_s / pops, 1e6 * add_s / adds

    res = [asyncio.run(one(r + 1)) for r in range(a.runs)]
    out = {"us_per_pop": round(statistics.median(p for p, _ in res), 3),
           "us_per_added_url": round(statistics.median(q for _, q in res), 3),
           "runs_pop": [round(p, 3) for p, _ in res], "runs_add": [round(q, 3) for _, q in res]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
