"""The recrawl state reads of a fresh link, with and without ``recrawl.key_filter_bytes``.

A fresh link (never fetched) costs recrawl two state lookups on the loop: ``validators`` at its
lease and ``record`` at its answer (a first visit). Without the key filter the first is a read of
the overlay and its read cache, a miss, then an ``mdb_get`` (a GIL release and re-take with the
writer thread alive); it caches "absent", so the second is a cache hit. With the filter neither
reads. Set-up as in the crawl: a store of ``--tracked`` URLs (committed, then reopened, so the
filter is built from it), a writer thread attached, a 16 MiB read cache; then ``--fresh`` links,
each looked up at its lease and recorded at its answer, committed every 4,096 as the shard's
group. Reported: loop-thread CPU µs per fresh link (``time.thread_time``), the median of
``--runs`` alternated runs of each way; the filter's build time at open; the state reads made.

Run:  nice -n 10 .venv/bin/python bench/recrawl_filter_bench.py [--tracked 200000] [--fresh 20000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from crawlerd.frontier.recrawl import Recrawl  # noqa: E402
from crawlerd.store.writer import WriteThread  # noqa: E402

T0 = 1_700_000_000.0
MiB = 1 << 20


def _fp(i: int) -> int:
    return (i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF


def _record(rc: Recrawl, i: int, t: float) -> None:
    rc.record(f"http://h{i % 5000}.test/p{i}", _fp(i), f"http://h{i % 5000}.test", fetched_at=t, status=200,
              etag=f'"e{i}"', last_modified=None, digest="sha1:X", changed=None)


def seed(path: str, tracked: int) -> None:
    rc = Recrawl(path, sync=False, map_size_bytes=1 << 32)
    for i in range(tracked):
        _record(rc, i, T0)
    rc.close()


async def one_run(path: str, tracked: int, fresh: int, filter_bytes: int) -> dict:
    t = time.perf_counter()
    rc = Recrawl(path, sync=False, map_size_bytes=1 << 32, read_cache_bytes=16 * MiB,
                 key_filter_bytes=filter_bytes)
    open_s = time.perf_counter() - t
    writer = WriteThread(asyncio.get_running_loop(), group_delay_s=0.002)
    rc.attach_writer(writer)
    reads = 0
    get = rc._w().get

    def counting_get(key, db=None, **kw):
        nonlocal reads
        reads += db is rc._urls
        return get(key, db=db, **kw)
    rc._w().get = counting_get
    cpu = 0.0
    base = tracked + 1_000_000                          # links the store never saw
    for start in range(0, fresh, 4096):
        c = time.thread_time()
        for i in range(base + start, base + min(fresh, start + 4096)):
            rc.validators(_fp(i))                       # the lease
            _record(rc, i, T0 + 100)                    # its answer
        rc.commit(flush=False)
        cpu += time.thread_time() - c
        await asyncio.sleep(0.005)                      # commits land meanwhile, as between steps
    landed = asyncio.get_running_loop().create_future()
    rc.commit(flush=False, then=lambda: landed.set_result(None))
    await landed
    rc.attach_writer(None)
    writer.close()
    rc.close()
    return {"us_per_link": cpu / fresh * 1e6, "reads_per_link": reads / fresh, "open_s": open_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tracked", type=int, default=200_000)
    ap.add_argument("--fresh", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--filter-bytes", type=int, default=8 * MiB)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="recrawl-filter-bench-")
    try:
        seed(os.path.join(d, "r"), a.tracked)
        got: dict[str, list[dict]] = {"no filter": [], "filter": []}
        for r in range(a.runs):
            for name in (("no filter", "filter") if r % 2 == 0 else ("filter", "no filter")):
                src = os.path.join(d, "r")
                run_dir = os.path.join(d, f"run-{r}-{name.replace(' ', '-')}")
                shutil.copytree(src, run_dir)
                size = a.filter_bytes if name == "filter" else 0
                got[name].append(asyncio.run(one_run(run_dir, a.tracked, a.fresh, size)))
                shutil.rmtree(run_dir)
        for name, runs in got.items():
            us = [x["us_per_link"] for x in runs]
            print(f"{name:10s} loop CPU µs per fresh link: median {statistics.median(us):.2f} "
                  f"({', '.join(f'{x:.2f}' for x in us)}); state reads per link "
                  f"{runs[0]['reads_per_link']:.3f}; open {statistics.median(x['open_s'] for x in runs):.3f} s")
    finally:
        shutil.rmtree(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
