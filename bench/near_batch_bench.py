"""What one worker batch's near-duplicate question costs the crawl process's loop thread, by part.

The real classes at a crawl's index size: a ``NearDuplicates`` store filled with ``--pages``
original pages (through the same batches, so the index has the tail, RAM runs and, with a small
``--index-ram-bytes``, disk tables a crawl that long has), a ``WriteThread`` attached as in the
crawl, and ``Answers.near_duplicates`` asked batches of ``--batch`` pages (a worker's answer
frame holds ~20) over ``--hosts`` hosts: mostly new text, some near duplicates of stored pages
(1-3 bits away) and some recrawls (a stored page's own URL). Then the parts, each alone over the
same pages: the index queries (tail scan, each RAM run, each disk table), the host windows
(``should_demote``), the batch's LMDB read transaction and hand-over, and the answer frame's
encoding (``wire.frame``). Times are the loop thread's CPU time (``time.thread_time``): the box
is shared, and the writer thread's commits are not the loop's cost.

Run:  nice .venv/bin/python bench/near_batch_bench.py [--pages 300000] [--batches 3000]
      [--index-ram-bytes 67108864] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time

import numpy as np

from crawlerd import config
from crawlerd.dedup.near import NearDuplicates
from crawlerd.metrics import Metrics
from crawlerd.process.wire import frame
from crawlerd.shard.answers import Answers
from crawlerd.store.writer import WriteThread


class _Pool:
    on_frame = None


class _Frontier:
    def __init__(self) -> None:
        self.demoted = 0

    def demote_host(self, host_key: str, levels: int = 1) -> None:
        self.demoted += 1


def _pages(rng: random.Random, n: int, hosts: int, stored: list[tuple[int, str]], serial: list[int],
           near_share: float, recrawl_share: float) -> list[tuple[int, str]]:
    out = []
    for _ in range(n):
        r = rng.random()
        if stored and r < near_share:
            fp, _url = rng.choice(stored)
            for b in rng.sample(range(64), rng.randint(1, 3)):
                fp ^= 1 << b
            serial[0] += 1
            out.append((fp, f"http://h{rng.randrange(hosts)}.test/p{serial[0]}"))
        elif stored and r < near_share + recrawl_share:
            out.append(rng.choice(stored))
        else:
            serial[0] += 1
            out.append((rng.getrandbits(64), f"http://h{rng.randrange(hosts)}.test/p{serial[0]}"))
    return out


def _timed(fn, batches) -> float:
    """CPU seconds of this (the loop's) thread: the box is shared, and the writer's work is its own."""
    t0 = time.thread_time()
    for b in batches:
        fn(b)
    return time.thread_time() - t0


async def _run(args, directory: str) -> dict[str, float]:
    rng = random.Random(args.seed)
    cfg = config.load(None, [f"crawl.data_dir={directory!r}", "process.workers=1"])
    near = NearDuplicates(cfg.path("dedup"), index_ram_bytes=args.index_ram_bytes)
    writer = WriteThread(asyncio.get_running_loop())
    near.attach_writer(writer)
    frontier = _Frontier()
    ans = Answers(cfg, pool=_Pool(), digests=None, near=near, recrawl=None, frontier=frontier,
                  intake=None, events=None, metrics=Metrics())
    stored: list[tuple[int, str]] = []
    serial = [0]
    while len(near) < args.pages:                   # fill: the crawl so far
        batch = _pages(rng, 512, args.hosts, [], serial, 0.0, 0.0)
        ans.near_duplicates(batch)
        stored.extend(batch[:4])
        await asyncio.sleep(0)
    await _drain(near)
    near._index.wait_idle()
    batches = [_pages(rng, args.batch, args.hosts, stored, serial, args.near_share, args.recrawl_share)
               for _ in range(args.batches)]
    index = near._index
    ram, disk = index._state
    layout = {"pairs": len(index), "tail": len(index._tail) if hasattr(index, "_tail") else index._tail_n, "ram_runs": [r.n for r in ram],
              "disk_runs": [d.n for d in disk]}
    pages = args.batches * args.batch
    res: dict[str, float] = {}

    # the parts first (nothing added: the index stays as it is)
    k = near.distance_bits
    res["index.query (all parts)"] = _timed(lambda b: [index.query(fp, k) for fp, _ in b], batches)
    if hasattr(near, "check_and_add_many"):
        res["index.query_batch (a batch at once)"] = _timed(
            lambda b: index.query_batch(np.array([fp for fp, _ in b], dtype=np.uint64), k), batches)
    if hasattr(index, "_tail"):                   # hashed by block (this tree)
        tail = index._tail
        res["  tail"] = _timed(lambda b: [tail.query_into(fp, k, []) for fp, _ in b], batches)
    else:                                         # scanned (before)
        from crawlerd._native.blocktables import scan_into
        tf, td, tn = index._tail_fps, index._tail_docs, index._tail_n
        res["  tail"] = _timed(lambda b: [scan_into(tf, td, tn, fp, k, []) for fp, _ in b], batches)
    for i, run in enumerate(ram):
        res[f"  RAM run {i} ({run.n})"] = _timed(lambda b, run=run: [run.query_into(fp, k, []) for fp, _ in b],
                                                  batches)
    for i, d in enumerate(disk):
        t = d.tables
        res[f"  disk run {i} ({d.n})"] = _timed(lambda b, t=t: [t.query_into(fp, k, []) for fp, _ in b], batches)
    hosts = [[u.split("/", 3)[2] for _, u in b] for b in batches]
    res["should_demote (host windows)"] = _timed(lambda hs: [near.should_demote(h) for h in hs], hosts)
    res["frame (answer encoding)"] = _timed(
        lambda b: frame(("near", {i: "" if i % 9 else u for i, (_, u) in enumerate(b)})), batches)

    def empty_batch(_b):
        with near.batch():
            pass
    res["batch() alone (read txn)"] = _timed(empty_batch, batches)

    # the whole question last (it adds the new pages)
    found = 0

    def whole(b):
        nonlocal found
        found += sum(1 for x in ans.near_duplicates(b) if x)
    res["Answers.near_duplicates (whole)"] = _timed(whole, batches)
    await _drain(near)
    near.attach_writer(None)
    writer.close()
    near.close()
    us = {name: 1e6 * s / pages for name, s in res.items()}
    us["_near_found_share"] = found / pages
    us["_demoted"] = frontier.demoted
    return {"layout": layout, "us_per_page": us}


async def _drain(near: NearDuplicates) -> None:
    while (w := near.written()) is not None:
        await w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=300_000, help="original pages stored before measuring")
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=20, help="pages per worker question")
    ap.add_argument("--hosts", type=int, default=20_000)
    ap.add_argument("--near-share", type=float, default=0.10)
    ap.add_argument("--recrawl-share", type=float, default=0.05)
    ap.add_argument("--index-ram-bytes", type=int, default=64 << 20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            runs.append(asyncio.run(_run(args, d)))
    print("index:", runs[0]["layout"])
    label = f"µs per page (median of {len(runs)})"
    print(f"{label:<40} " + " ".join(f"{'run'+str(i):>8}" for i in range(len(runs))))
    for name in runs[0]["us_per_page"]:
        vals = [r["us_per_page"][name] for r in runs]
        print(f"{name:<40} {statistics.median(vals):8.2f}  " + " ".join(f"{v:8.2f}" for v in vals))


if __name__ == "__main__":
    main()
