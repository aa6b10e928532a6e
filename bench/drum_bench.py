"""DRUM seen-set benchmark: a crawl-shaped check+update stream through DRUM and its peers.

The stream: pages of ``--batch`` fingerprints (default 50); half of each page
is new keys, half already seen (one half of those from the last 5,000 new keys,
like site navigation, the other uniformly from everything seen so far). Keys
are splitmix64 of an index, so an old key is regenerated, not stored.

Stores, each run in its own subprocess (so peak RSS is its own):

* ``drum``  crawlerd.seen.drum.Drum with default parameters, one check_update per page,
  results drained as they are dispatched; a final flush is timed.
* ``lmdb``  one write transaction per 1,000 pages, per key ``get`` then ``put``
  (sync=False; one env.sync() at the end, timed).
* ``numpy`` a sorted uint64 array; pages buffered to 2**20 keys, then sorted and
  merged (searchsorted + insert; numpy.isin/unique are slow on uint64).
* ``set``   a Python set (only up to 10**7 keys).

Reported: keys/s over wall time and over CPU time of the timed work (the
machine is shared), peak RSS, disk bytes per stored key; medians of ``--runs`` runs
and the ratio of DRUM to each peer measured in the same invocation.

    nice .venv/bin/python bench/drum_bench.py                  # 10**7 keys, all stores
    nice .venv/bin/python bench/drum_bench.py --keys 100000000 --stores drum,lmdb --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CHUNK = 1 << 17          # keys generated at a time (untimed); small, so it adds little to peak RSS
NUMPY_BATCH = 1 << 20    # keys the numpy peer buffers before one sort + merge
SEED = np.uint64(0x5EED)


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + SEED
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def stream_chunks(total: int, seed: int = 1, chunk: int = CHUNK):
    """Yields uint64 arrays of at most ``chunk`` keys; the crawl-shaped stream described above."""
    rng = np.random.default_rng(seed)
    made = 0          # new keys handed out so far
    done = 0
    while done < total:
        n = min(chunk, total - done)
        n_new = (n + 1) // 2
        new_idx = np.arange(made, made + n_new, dtype=np.int64)
        # Repeat i comes after new key i, so it picks among the made + i + 1 keys seen by then.
        seen = new_idx + 1
        recent = np.maximum(seen - rng.integers(1, 5001, n - n_new), 0)
        uniform = (rng.random(n - n_new) * seen[:n - n_new]).astype(np.int64)
        old = np.where(rng.random(n - n_new) < 0.5, recent[:n - n_new], uniform)
        out = np.empty(n, np.uint64)
        out[0::2] = _mix(new_idx.astype(np.uint64))
        out[1::2] = _mix(old.astype(np.uint64))
        made += n_new
        done += n
        yield out


def run_drum(path: str, total: int, batch: int, budget_s: float) -> dict:
    from crawlerd.seen.drum import Drum

    dr = Drum(path)
    unique = handed = 0
    spent = cpu = 0.0
    done = 0
    for chunk in stream_chunks(total):
        t, c = time.perf_counter(), time.process_time()
        for i in range(0, len(chunk), batch):
            dr.check_update(chunk[i:i + batch])
            while dr.ready:
                _, keys, u, _ = dr.results_arrays(1 << 20)
                unique += int(u.sum())
                handed += len(keys)
        spent += time.perf_counter() - t
        cpu += time.process_time() - c
        done += len(chunk)
        if spent > budget_s:
            break
    t, c = time.perf_counter(), time.process_time()
    dr.flush()
    while dr.ready:
        _, keys, u, _ = dr.results_arrays(1 << 20)
        unique += int(u.sum())
        handed += len(keys)
    dr.ack()
    spent += time.perf_counter() - t
    cpu += time.process_time() - c
    assert handed == done, (handed, done)
    stored = len(dr)
    disk = dr.disk_bytes()
    dr.close()
    return {"keys": done, "seconds": spent, "unique": unique, "stored": stored, "disk_bytes": disk,
            "cpu_seconds": cpu}


def run_lmdb(path: str, total: int, batch: int, budget_s: float) -> dict:
    import lmdb

    env = lmdb.open(path, map_size=max(1 << 30, total * 96), sync=False, metasync=False, readahead=False,
                    lock=False)
    unique = 0
    spent = cpu = 0.0
    done = 0
    for chunk in stream_chunks(total):
        raw = chunk.astype(">u8").tobytes()          # big-endian: LMDB's byte order is key order
        t, c = time.perf_counter(), time.process_time()
        step = batch * 1000
        for s in range(0, len(chunk), step):
            with env.begin(write=True) as txn:
                get, put = txn.get, txn.put
                for off in range(s * 8, min(s + step, len(chunk)) * 8, 8):
                    k = raw[off:off + 8]
                    if get(k) is None:
                        put(k, b"")
                        unique += 1
        spent += time.perf_counter() - t
        cpu += time.process_time() - c
        done += len(chunk)
        if spent > budget_s:
            break
    t, c = time.perf_counter(), time.process_time()
    env.sync(True)
    spent += time.perf_counter() - t
    cpu += time.process_time() - c
    stored = env.stat()["entries"]
    env.close()
    disk = sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    return {"keys": done, "seconds": spent, "unique": unique, "stored": stored, "disk_bytes": disk,
            "cpu_seconds": cpu}


def run_numpy(path: str, total: int, batch: int, budget_s: float) -> dict:
    main = np.empty(0, np.uint64)
    unique = 0
    spent = cpu = 0.0
    done = 0
    for chunk in stream_chunks(total, chunk=NUMPY_BATCH):
        t, c = time.perf_counter(), time.process_time()
        # Pages are buffered to one chunk: answer them in order by sort + merge.
        order = np.argsort(chunk, kind="stable")
        sc = chunk[order]
        first_sorted = np.ones(len(sc), bool)
        first_sorted[1:] = sc[1:] != sc[:-1]
        first = np.empty(len(sc), bool)
        first[order] = first_sorted
        if len(main):
            pos = np.searchsorted(main, chunk)
            found = main[np.minimum(pos, len(main) - 1)] == chunk
        else:
            found = np.zeros(len(chunk), bool)
        new_mask = first & ~found
        unique += int(new_mask.sum())
        new = np.sort(chunk[new_mask])
        main = np.insert(main, np.searchsorted(main, new), new)
        spent += time.perf_counter() - t
        cpu += time.process_time() - c
        done += len(chunk)
        if spent > budget_s:
            break
    return {"keys": done, "seconds": spent, "unique": unique, "stored": len(main), "disk_bytes": 0,
            "cpu_seconds": cpu}


def run_set(path: str, total: int, batch: int, budget_s: float) -> dict:
    seen: set[int] = set()
    unique = 0
    spent = cpu = 0.0
    done = 0
    for chunk in stream_chunks(total):
        t, c = time.perf_counter(), time.process_time()
        for i in range(0, len(chunk), batch):
            for k in chunk[i:i + batch].tolist():
                if k not in seen:
                    seen.add(k)
                    unique += 1
        spent += time.perf_counter() - t
        cpu += time.process_time() - c
        done += len(chunk)
        if spent > budget_s:
            break
    return {"keys": done, "seconds": spent, "unique": unique, "stored": len(seen), "disk_bytes": 0,
            "cpu_seconds": cpu}


RUNNERS = {"drum": run_drum, "lmdb": run_lmdb, "numpy": run_numpy, "set": run_set}


def child(args) -> None:
    path = tempfile.mkdtemp(prefix=f"drum-bench-{args.child}-", dir=args.dir)
    try:
        out = RUNNERS[args.child](path, args.keys, args.batch, args.budget_s)
        out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        shutil.rmtree(path, ignore_errors=True)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=10**7, help="keys in the stream (default 10**7)")
    ap.add_argument("--batch", type=int, default=50, help="fingerprints per page (default 50)")
    ap.add_argument("--runs", type=int, default=3, help="runs per store; medians are reported (default 3)")
    ap.add_argument("--stores", default="drum,lmdb,numpy,set", help="comma-separated (default all)")
    ap.add_argument("--budget-s", type=float, default=900.0,
                    help="a store stops after this much timed work and reports its rate so far (default 900)")
    ap.add_argument("--dir", default=None, help="directory for the stores' files (default: system temp)")
    ap.add_argument("--json", action="store_true", help="print raw results as JSON")
    ap.add_argument("--child", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    stores = [s for s in args.stores.split(",") if s]
    if args.keys > 10**7 and "set" in stores:
        stores.remove("set")
    rows: dict[str, list[dict]] = {s: [] for s in stores}
    for run in range(args.runs):
        for s in stores:                               # interleaved, so load drifts hit every store alike
            cmd = [sys.executable, os.path.abspath(__file__), "--child", s, "--keys", str(args.keys),
                   "--batch", str(args.batch), "--budget-s", str(args.budget_s)]
            if args.dir:
                cmd += ["--dir", args.dir]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            rows[s].append(res)
            print(f"run {run + 1} {s}: {res['keys'] / res['seconds']:,.0f} keys/s", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
    med = {s: {"rate": statistics.median(r["keys"] / r["seconds"] for r in rs),
               "cpu_rate": statistics.median(r["keys"] / max(r["cpu_seconds"], 1e-9) for r in rs),
               "rss": statistics.median(r["peak_rss_mib"] for r in rs),
               "disk": statistics.median(r["disk_bytes"] / max(r["stored"], 1) for r in rs),
               "keys": statistics.median(r["keys"] for r in rs),
               "unique": rs[0]["unique"]} for s, rs in rows.items()}
    base = med.get("drum", {}).get("rate")
    print(f"stream: {args.keys:,} keys, pages of {args.batch}, {args.runs} run(s), medians")
    print(f"{'store':6} {'keys done':>12} {'keys/s wall':>12} {'keys/s CPU':>12} {'drum x':>7} "
          f"{'peak RSS MiB':>13} {'disk B/key':>10} {'unique':>11}")
    for s, m in med.items():
        ratio = f"{base / m['rate']:.1f}" if base and s != "drum" else "-"
        print(f"{s:6} {m['keys']:>12,.0f} {m['rate']:>12,.0f} {m['cpu_rate']:>12,.0f} {ratio:>7} "
              f"{m['rss']:>13.0f} {m['disk']:>10.1f} {m['unique']:>11,}")


if __name__ == "__main__":
    main()
