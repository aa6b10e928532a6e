"""Near-duplicate index: on-disk NearIndex (bounded RAM) beside the in-RAM SimhashIndex, same run.

Random 64-bit fingerprints are stored (doc id = position); queries are stored fingerprints with
1-3 bits flipped (every one must find its source) and random ones (almost never a match), half
each, k = 3, Hamming-ball queries answered exactly (Manku, Jain, Das Sarma, WWW 2007 §3).

For each index and size checkpoint (10^6, 10^7, ... up to --n) this prints:

- insert rate: pairs per second through ``add_many`` in chunks of 65,536 (for NearIndex this
  is the tail -> run -> background-merge path a crawl takes, stalls included), and the rate of
  single ``add`` calls on the first 200,000 pairs;
- query latency: median and p99 of single queries, visited in sorted order as ``query_batch``
  does, with the run files' pages in the page cache (warm), and cold: the index closed (its
  RAM part moved to disk, the files unmapped), the run files' pages dropped with
  posix_fadvise(DONTNEED) (those files alone; nothing else on the box is touched), reopened;
- RAM: the index's own account against its budget, and the process's RssAnon growth;
- disk bytes per fingerprint (NearIndex run files).

    .venv/bin/python bench/memory_bench.py --n 100000000 --inram-n 10000000
    .venv/bin/python bench/memory_bench.py --n 2000000 --inram-n 2000000     # a quick look

The in-RAM index is built only up to --inram-n (it costs 40 B per pair of private memory plus a
transient copy while merging: 10^8 pairs would take 4-8 GB of a shared 24 GB box).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from crawlerd.dedup.near_index import NearIndex  # noqa: E402
from crawlerd.dedup.simhash_index import SimhashIndex  # noqa: E402
from crawlerd.metrics import proc_rss_kinds  # noqa: E402

CHUNK = 65_536
SINGLE = 200_000


def fingerprints(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)


def make_queries(rng: np.random.Generator, stored: np.ndarray, n_stored: int, q: int) -> tuple[np.ndarray, np.ndarray]:
    """q/2 stored fingerprints with 1-3 bits flipped (and their doc ids), q/2 random ones (-1)."""
    half = q // 2
    src = rng.integers(0, n_stored, size=half)
    near = stored[src].copy()
    for i in range(half):
        for b in rng.choice(64, size=int(rng.integers(1, 4)), replace=False):
            near[i] ^= np.uint64(1) << np.uint64(int(b))
    qs = np.concatenate([near, fingerprints(rng, q - half)])
    want = np.concatenate([src, np.full(q - half, -1)])
    return qs, want


def time_queries(index, qs: np.ndarray, want: np.ndarray) -> dict:
    """Per-query latency (sorted visiting order, as query_batch), and exactness of the hits."""
    order = np.argsort(qs, kind="stable")
    lat = np.empty(qs.shape[0], dtype=np.int64)
    missed = 0
    pc = time.perf_counter_ns
    for j, i in enumerate(order.tolist()):
        q = int(qs[i])
        t0 = pc()
        found = index.query(q, 3)
        lat[j] = pc() - t0
        if want[i] >= 0 and not any(doc == want[i] for doc, _, _ in found):
            missed += 1
    lat_us = lat / 1000.0
    return {"median_us": float(np.median(lat_us)), "p99_us": float(np.percentile(lat_us, 99)),
            "mean_us": float(lat_us.mean()), "queries": int(qs.shape[0]), "missed": missed}


def drop_cache(directory: str) -> None:
    """posix_fadvise(DONTNEED) on the index's run files: their pages leave the page cache."""
    for name in os.listdir(directory):
        if name.endswith(".tbl"):
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def anon() -> int:
    return (proc_rss_kinds(os.getpid()) or {}).get("anon", 0)


def checkpoints(n: int) -> list[int]:
    out, c = [], 1_000_000
    while c < n:
        out.append(c)
        c *= 10
    return out + [n]


def bench_index(kind: str, n: int, rng_seed: int, queries: int, budget: int, directory: str,
                scratch: str) -> list[dict]:
    rng = np.random.default_rng(rng_seed)
    base_anon = anon()
    if kind == "disk":
        index = NearIndex(directory, ram_budget_bytes=budget)
    else:
        index = SimhashIndex(tail_capacity=4096)
    # the bench's own copy of what was stored is a file map, so RssAnon growth is the index's alone
    stored = np.memmap(os.path.join(scratch, f"stored-{kind}.u64"),
                       dtype=np.uint64, mode="w+", shape=(n,))
    rows = []
    done = 0
    t_insert = 0.0
    # single adds first: the per-call cost a crawl pays per page
    first = min(SINGLE, n)
    stored[:first] = fingerprints(rng, first)
    t0 = time.perf_counter()
    for i, fp in enumerate(stored[:first].tolist()):
        index.add(fp, i)
    single_rate = first / (time.perf_counter() - t0)
    t_insert += time.perf_counter() - t0
    done = first
    for cp in checkpoints(n):
        while done < cp:
            m = min(CHUNK, cp - done)
            chunk = fingerprints(rng, m)
            stored[done:done + m] = chunk
            t0 = time.perf_counter()
            index.add_many(chunk, np.arange(done, done + m, dtype=np.int64))
            t_insert += time.perf_counter() - t0
            done += m
        if kind == "disk":
            t0 = time.perf_counter()
            index.wait_idle()           # merges still running count against the insert rate
            t_insert += time.perf_counter() - t0
        qs, want = make_queries(np.random.default_rng(rng_seed + cp), stored, done, queries)
        warm_pass = time_queries(index, qs, want)     # first pass pulls the pages in
        warm = time_queries(index, qs, want)
        row = {"index": kind, "n": done, "insert_per_s": done / t_insert, "single_add_per_s": single_rate,
               "warm": warm, "first_pass": warm_pass, "anon_growth_bytes": anon() - base_anon}
        if kind == "disk":
            st = index.stats()
            # cold: close (unmapping the run files), drop their pages, reopen; the RAM part goes to disk
            index.close()
            drop_cache(directory)
            index = NearIndex(directory, ram_budget_bytes=budget)
            cold = time_queries(index, *make_queries(np.random.default_rng(rng_seed + cp + 1), stored, done,
                                                     queries))
            row.update(cold=cold, ram_bytes=st["bytes"], budget_bytes=budget, disk_bytes=st["disk_bytes"],
                       disk_bytes_per_fp=st["disk_bytes"] / max(1, st["pairs_on_disk"]), disk_runs=st["disk_runs"],
                       ram_runs=st["ram_runs"], stalls=st["stalls"], stall_s=st["stall_s"],
                       merge_s=st["merge_s"])
        rows.append(row)
        print(fmt(row), flush=True)
    if kind == "disk":
        index.close(flush=False)
    return rows


def fmt(r: dict) -> str:
    s = (f"{r['index']:5s} n={r['n']:>11,d} insert {r['insert_per_s'] / 1e6:6.2f} M/s (single add "
         f"{r['single_add_per_s'] / 1e6:.2f} M/s)  warm query median {r['warm']['median_us']:7.1f} us p99 "
         f"{r['warm']['p99_us']:7.1f} us  missed {r['warm']['missed']}  anon +{r['anon_growth_bytes'] / 2**20:.0f} MiB")
    if "cold" in r:
        s += (f"  cold median {r['cold']['median_us']:.1f} us p99 {r['cold']['p99_us']:.0f} us  RAM "
              f"{r['ram_bytes'] / 2**20:.1f}/{r['budget_bytes'] / 2**20:.0f} MiB  disk "
              f"{r['disk_bytes_per_fp']:.2f} B/fp ({r['disk_runs']} runs)  stalls {r['stalls']} "
              f"({r['stall_s']:.1f} s)")
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("json_out", nargs="?", default="")
    p.add_argument("--n", type=int, default=100_000_000, help="fingerprints stored in the on-disk index")
    p.add_argument("--inram-n", type=int, default=10_000_000, help="fingerprints stored in the in-RAM index")
    p.add_argument("--queries", type=int, default=20_000, help="queries per checkpoint")
    p.add_argument("--budget-bytes", type=int, default=64 << 20, help="NearIndex RAM budget")
    p.add_argument("--dir", default="", help="directory for the run files (default: a temp dir, removed)")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if not (1 <= a.n <= 2_000_000_000 and 0 <= a.inram_n <= 200_000_000 and a.queries >= 2):
        p.error("bounds: 1 <= --n <= 2e9, 0 <= --inram-n <= 2e8, --queries >= 2")
    base = a.dir or tempfile.mkdtemp(prefix="crawlerd-membench-")
    os.makedirs(base, exist_ok=True)
    try:
        free = shutil.disk_usage(base).free
        need = 2 * 40 * a.n + (8 << 30)
        if free < need:
            print(f"memory_bench: {free / 2**30:.0f} GiB free in {base}, {need / 2**30:.0f} GiB needed", file=sys.stderr)
            return 2
        rows = []
        if a.inram_n:
            rows += bench_index("ram", a.inram_n, a.seed, a.queries, a.budget_bytes, base, base)
        rows += bench_index("disk", a.n, a.seed, a.queries, a.budget_bytes, os.path.join(base, "near-index"), base)
    finally:
        if not a.dir:
            shutil.rmtree(base, ignore_errors=True)
    summary = {"rows": rows, "params": vars(a)}
    ram = [r for r in rows if r["index"] == "ram"]
    disk = [r for r in rows if r["index"] == "disk"]
    if ram and disk:
        same = [d for d in disk if d["n"] == ram[-1]["n"]]
        if same:
            d, r = same[0], ram[-1]
            print(f"at n={r['n']:,}: disk/RAM warm median latency {d['warm']['median_us'] / r['warm']['median_us']:.2f}x, "
                  f"insert rate {d['insert_per_s'] / r['insert_per_s']:.2f}x, private memory "
                  f"{d['anon_growth_bytes'] / 2**20:.0f} vs {r['anon_growth_bytes'] / 2**20:.0f} MiB "
                  f"(in-RAM index {r['anon_growth_bytes'] / r['n']:.1f} B/fp)")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
