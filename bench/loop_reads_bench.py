"""The loop's per-URL and per-page LMDB reads, with and without what spares them (branch loop7-reads).

py-lmdb releases the GIL around each ``mdb_get``; with other threads of the crawl process alive
(the writer, DRUM, sync threads), each release and re-take is a futex wake and often a context
switch. This measures, on the calling thread, CPU and wall time per operation of:

- ``Overlay.get`` of keys read again (recrawl states at a lease and again at its answer; BEAST's
  host turns), without and with the overlay's read cache (``read_cache``);
- ``DustStore.archived`` of fingerprints never archived (nearly every fetched page), without and
  with the archived set's Bloom filters (``filter_bytes``);

each alone and beside a "busy" thread that releases and wants the GIL all the time (hashing
64 KiB blocks: ``hashlib`` drops the GIL for large inputs), as the crawl's other threads do.
Run it under the bench lock (``flock /tmp/crawlerd-bench.lock``); ~20 s.

    .venv/bin/python bench/loop_reads_bench.py [--n 200000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import struct
import sys
import tempfile
import threading
import time

import lmdb

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from crawlerd.frontier.dust_store import DustStore  # noqa: E402
from crawlerd.store.overlay import Overlay  # noqa: E402

_U64 = struct.Struct(">Q")


class Busy:
    """A thread that hashes 64 KiB blocks in a loop: it releases the GIL and wants it back."""

    def __init__(self):
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        block = os.urandom(64 << 10)
        while not self._stop.is_set():
            hashlib.sha1(block).digest()

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def timed(fn, n: int) -> tuple[float, float]:
    """(thread CPU µs, wall µs) per call of ``fn(i)`` for i in range(n)."""
    c0, w0 = time.thread_time(), time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.thread_time() - c0) / n * 1e6, (time.perf_counter() - w0) / n * 1e6


def overlay_case(tmp: str, n: int) -> dict:
    env = lmdb.open(os.path.join(tmp, "ov"), map_size=1 << 30, max_dbs=2, sync=False)
    db = env.open_db(b"urls")
    rng = random.Random(1)
    keys = [_U64.pack(rng.getrandbits(64)) for _ in range(20_000)]
    with env.begin(write=True) as txn:
        for k in keys[::2]:                       # half stored (a recrawl visit), half absent (a new URL)
            txn.put(k, os.urandom(120), db=db)
    out = {}
    for name, cache in (("plain", None), ("read cache", {db: 16 << 20})):
        ov = Overlay(env, writer=None, read_cache=cache)
        for k in keys:                            # the first read of each (at the lease)
            ov.get(k, db=db)
        get = ov.get
        out[name] = timed(lambda i, get=get: get(keys[i % len(keys)], db=db), n)    # read again (at the answer)
    env.close()
    return out


def dust_case(tmp: str, n: int) -> dict:
    out = {}
    rng = random.Random(2)
    stored = [rng.getrandbits(64) for _ in range(200_000)]
    fresh = [rng.getrandbits(64) for _ in range(n)]
    for name, fb in (("plain", 0), ("filter", 4 << 20)):
        path = os.path.join(tmp, f"dust-{fb}")
        s = DustStore(path, max_bytes=256 << 20, max_host_bytes=16 << 10, sync=False, filter_bytes=fb)
        for fp in stored:
            s.add_archived(fp, 1)
        s.commit()
        arch = s.archived
        out[name] = timed(lambda i, arch=arch: arch(fresh[i]), n)
        s.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000, help="operations per case")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for beside in ("alone", "busy thread"):
            d = os.path.join(tmp, beside.replace(" ", "-"))
            os.makedirs(d)
            if beside == "alone":
                ov, du = overlay_case(d, a.n), dust_case(d, a.n)
            else:
                with Busy():
                    ov, du = overlay_case(d, a.n), dust_case(d, a.n)
            rows += [(f"Overlay.get again, {k}", beside, *v) for k, v in ov.items()]
            rows += [(f"DustStore.archived new fp, {k}", beside, *v) for k, v in du.items()]
    print(f"{'operation':44} {'beside':12} {'CPU us/op':>10} {'wall us/op':>11}")
    for op, beside, cpu, wall in rows:
        print(f"{op:44} {beside:12} {cpu:10.2f} {wall:11.2f}")


if __name__ == "__main__":
    main()
