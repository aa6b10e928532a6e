"""The loop's per-URL and per-page admission pieces alone, CPU per call, for an A/B of two trees.

- ``lru``: ``ByteLRU.get`` of keys it holds and of keys it does not (the overlays' read caches, the
  robots cache and the near-duplicate host windows all ask it; a miss raises ``KeyError`` inside).
- ``offer``: ``Budgets.offer_many`` as the intake calls it: slices of a crawl-shaped stream (``--hosts``
  hosts, each its own registered domain like simweb's ``h{i}.sim``; runs of one or two URLs per host,
  as a page's unique links are after the seen-set), committed every 16 slices; most URLs are
  deferred (the shipped budget rule), so the FIFO entry and host turns are on the path.
- ``edges``: ``Budgets.record_pages_links`` for a worker batch of pages (20 pages, 3 linked hosts
  each, the page given by its host key), the edge DRUM's intake record included.
- ``answers``: a DRUM delivery's answers made into objects as the intake reads them (slices of 512
  of a delivery of 8,192; crawl-shaped aux records, about half of the keys seen before), per answer.

Runs on whichever crawlerd the interpreter imports, so a tree is compared with another by running
this file with each tree's interpreter, alternated, inside the bench lock:

    .venv/bin/python bench/adm_bench.py --runs 5
    /work/wt/base-s10/.venv/bin/python bench/adm_bench.py --runs 5

Prints the median over ``--runs`` of each part's CPU (process time) per call. Without a clock,
instructions per URL: two runs of one part under callgrind with different sizes, the difference
of their totals over the difference of their URLs (the start-up cancels out):

    valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python bench/adm_bench.py \
        --only offer --runs 1 --slices 10     # and --slices 40
"""

from __future__ import annotations

import argparse
import gc
import random
import shutil
import statistics
import tempfile
import time

from crawlerd.bytecache import ByteLRU
from crawlerd.frontier.budgets import Budgets


def bench_lru(n: int, hits: bool) -> float:
    lru = ByteLRU(1 << 30)
    keys = [b"turns-key-%08d" % i for i in range(n)]
    for k in keys[::2]:
        lru.put(k, k, 64)
    probe = (keys[::2] if hits else keys[1::2]) * 8
    random.Random(1).shuffle(probe)
    get = lru.get
    t0 = time.process_time()
    for k in probe:
        get(k)
    return (time.process_time() - t0) / len(probe)


def _stream(hosts: int, slices: int, per_slice: int, seed: int) -> list[tuple[list[bytes], list[int], list[str]]]:
    rng = random.Random(seed)
    out, serial = [], 0
    for _ in range(slices):
        records, fps, hks = [], [], []
        while len(hks) < per_slice:
            hk = f"http://h{rng.randrange(hosts)}.sim"
            for _ in range(rng.choice((1, 1, 2))):
                serial += 1
                hks.append(hk)
                fps.append(serial)
                records.append(b"1 0 5 " + f"{hk}/p/{serial}".encode())
        out.append((records, fps, hks))
    return out


def bench_offer(hosts: int, slices: int, per_slice: int) -> float:
    d = tempfile.mkdtemp(prefix="adm-bench-")
    try:
        b = Budgets(d, base_budget=4, per_inlink=2, max_budget=1000, map_size_bytes=1 << 30, sync=False)
        warm = _stream(hosts, slices, per_slice, 7)
        for i, (records, fps, hks) in enumerate(warm):
            b.offer_many(records, fps, hks)
            if i % 16 == 15:
                b.commit()
        stream = _stream(hosts, slices, per_slice, 8)
        n = sum(len(s[0]) for s in stream)
        t0 = time.process_time()
        for i, (records, fps, hks) in enumerate(stream):
            b.offer_many(records, fps, hks)
            if i % 16 == 15:
                b.commit()
        cpu = time.process_time() - t0
        b.store.close()
        return cpu / n
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bench_edges(hosts: int, batches: int) -> float:
    d = tempfile.mkdtemp(prefix="adm-bench-")
    rng = random.Random(3)
    try:
        b = Budgets(d, base_budget=4, per_inlink=2, max_budget=1000, map_size_bytes=1 << 30, sync=False)
        pages = [[(f"http://h{rng.randrange(hosts)}.sim",
                   {f"http://h{rng.randrange(hosts)}.sim" for _ in range(3)}) for _ in range(20)]
                 for _ in range(batches)]
        t0 = time.process_time()
        for batch in pages:
            b.record_pages_links(batch)
        cpu = time.process_time() - t0
        b.store.close()
        return cpu / (20 * batches)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bench_answers(deliveries: int) -> float:
    from crawlerd.seen.drum import Drum

    d = tempfile.mkdtemp(prefix="adm-bench-")
    rng = random.Random(4)
    try:
        with Drum(d, buckets=4) as dr:
            keys = [rng.getrandbits(63) for _ in range(8192 * deliveries // 2)]
            for i in range(0, len(keys) * 2, 32):       # a page's links per call, half of them repeats
                ks = [keys[(i + j) % len(keys)] for j in range(32)]
                dr.check_update(ks, [b"2 1 1 http://h%d.sim/p/%d.html" % (k % 20000, k) for k in ks])
            dr.flush()
            cpu = 0.0
            for _ in range(deliveries):
                dv = dr.delivery(8192)
                t0 = time.process_time()
                for start in range(0, len(dv), 512):
                    dv[start:start + 512]
                cpu += time.process_time() - t0
            return cpu / (8192 * deliveries)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--hosts", type=int, default=20_000)
    p.add_argument("--slices", type=int, default=400, help="offer: slices timed (and as many for warm-up)")
    p.add_argument("--per-slice", type=int, default=256, help="offer: unique URLs per slice")
    p.add_argument("--batches", type=int, default=300, help="edges: worker batches of 20 pages")
    p.add_argument("--deliveries", type=int, default=8, help="answers: deliveries of 8,192 answers read")
    p.add_argument("--only", choices=("lru", "offer", "edges", "answers"), help="one part (e.g. under callgrind)")
    a = p.parse_args()
    gc.disable()            # the collector's passes are the pacer's business, not the pieces'
    res: dict[str, list[float]] = {"lru get, hit": [], "lru get, miss": [], "offer_many per URL": [],
                                   "record_pages_links per page": [], "delivery's answers per answer": []}
    for _ in range(a.runs):
        if a.only in (None, "lru"):
            res["lru get, hit"].append(bench_lru(20_000, True))
            res["lru get, miss"].append(bench_lru(20_000, False))
        if a.only in (None, "offer"):
            res["offer_many per URL"].append(bench_offer(a.hosts, a.slices, a.per_slice))
        if a.only in (None, "edges"):
            res["record_pages_links per page"].append(bench_edges(a.hosts, a.batches))
        if a.only in (None, "answers"):
            res["delivery's answers per answer"].append(bench_answers(a.deliveries))
        gc.collect()
    for name, xs in res.items():
        if not xs:
            continue
        print(f"{name:30s} {statistics.median(xs) * 1e6:8.3f} us  (runs: {' '.join(f'{x * 1e6:.3f}' for x in xs)})")


if __name__ == "__main__":
    main()
