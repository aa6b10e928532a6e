"""Recrawl benchmark: record rate, hand-out (due + record 304) rate, disk and RAM per tracked URL.

Phases of one run (fresh LMDB directory each run):

1. record: first visits of --urls URLs (spread over --hosts hosts), with ETag, Last-Modified
   and digest, group-committed as in the crawl; URLs/s per wall and per CPU second.
2. revisit: ``due()`` in batches of --batch until nothing is due, each URL answered with a
   304 ``record()``; URLs/s. Then LMDB bytes per tracked URL, and RssAnon growth over both
   phases (anonymous memory only; LMDB's file-backed map is page cache, not counted).
3. peer: the floor under phase 1, measured in the same run: raw py-lmdb puts of the same
   keys and value sizes in the two tables (no decode, no policy), same commit grouping.
   The ratio recrawl/peer is the cost of the policy and the Python around it.

Run:  nice -n 10 .venv/bin/python bench/recrawl_bench.py [--urls 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time

import lmdb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from crawlerd.frontier.recrawl import Recrawl  # noqa: E402

T0 = 1_700_000_000.0
DAY = 86400.0


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def url_of(fp: int, hosts: int) -> tuple[str, str]:
    hk = f"http://www.host{fp % hosts}.example.test"
    return f"{hk}/section/{fp // hosts}/page-{fp}.html", hk


def clocked(fn):
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def run_once(n: int, hosts: int, batch: int, group_ops: int) -> dict:
    d = tempfile.mkdtemp(prefix="recrawl-bench-")
    try:
        rc = Recrawl(os.path.join(d, "r"), jitter=0.1, sync=False, group_ops=group_ops,
                     map_size_bytes=1 << 32)
        rss0 = rss_anon_bytes()

        def record_all():
            for fp in range(n):
                url, hk = url_of(fp, hosts)
                rc.record(url, fp, hk, fetched_at=T0, status=200, etag=f'W/"{fp:x}-5f3a"',
                          last_modified="Tue, 15 Nov 1994 12:45:26 GMT", digest=f"sha1:{fp:032X}",
                          changed=None)
            rc.commit()

        rec_w, rec_c = clocked(record_all)
        handed = 0

        def revisit_all():
            nonlocal handed
            now = T0 + 30 * DAY
            while items := rc.due(now, batch):
                handed += len(items)
                for it in items:
                    rc.record(it.url, it.fp, it.host_key, fetched_at=now, status=304, etag=None,
                              last_modified=None, digest=None, changed=None)
            rc.commit()

        rev_w, rev_c = clocked(revisit_all)
        assert handed == n, (handed, n)
        rss = rss_anon_bytes() - rss0
        disk = os.stat(os.path.join(d, "r", "data.mdb")).st_blocks * 512     # sparse (writemap)
        rc.close()

        # peer: the same puts on bare LMDB
        env = lmdb.open(os.path.join(d, "peer"), map_size=1 << 32, max_dbs=3, sync=False, metasync=False,
                        readahead=False, meminit=False)
        urls, due = env.open_db(b"urls"), env.open_db(b"due")
        u64, dkey = struct.Struct(">Q"), struct.Struct(">QQ")
        pad = b"x" * 46                        # fixed header of a record
        etag, lm = b'W/"00000-5f3a"', b"Tue, 15 Nov 1994 12:45:26 GMT"

        def peer():
            txn = env.begin(write=True)
            for fp in range(n):
                url, hk = url_of(fp, hosts)
                value = pad + url.encode() + hk.encode() + etag + lm + f"sha1:{fp:032X}".encode()
                txn.put(dkey.pack(int(T0 * 1000) + fp, fp), b"", db=due)
                txn.put(u64.pack(fp), value, db=urls)
                if fp % group_ops == group_ops - 1:
                    txn.commit()
                    txn = env.begin(write=True)
            txn.commit()

        peer_w, peer_c = clocked(peer)
        env.close()
        return {"record_per_s": n / rec_w, "record_per_cpu_s": n / rec_c, "revisit_per_s": n / rev_w,
                "revisit_per_cpu_s": n / rev_c, "peer_per_s": n / peer_w, "peer_per_cpu_s": n / peer_c,
                "disk_bytes_per_url": disk / n, "rss_anon_growth_bytes": rss}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--urls", type=int, default=200_000)
    ap.add_argument("--hosts", type=int, default=5_000)
    ap.add_argument("--batch", type=int, default=1000, help="due() limit per call")
    ap.add_argument("--group-ops", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    results = [run_once(a.urls, a.hosts, a.batch, a.group_ops) for _ in range(a.runs)]
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    print(f"recrawl bench: {a.urls} URLs over {a.hosts} hosts, {a.runs} runs, medians")
    print(f"  record (first visit)   {med['record_per_s']:>10,.0f} URLs/s   {med['record_per_cpu_s']:>10,.0f} /CPU s")
    print(f"  due + record 304       {med['revisit_per_s']:>10,.0f} URLs/s   {med['revisit_per_cpu_s']:>10,.0f} /CPU s")
    print(f"  peer (bare LMDB puts)  {med['peer_per_s']:>10,.0f} URLs/s   {med['peer_per_cpu_s']:>10,.0f} /CPU s")
    print(f"  record / peer (CPU)    {med['record_per_cpu_s'] / med['peer_per_cpu_s']:>10.2f}")
    print(f"  disk per tracked URL   {med['disk_bytes_per_url']:>10.0f} bytes")
    print(f"  RssAnon growth         {med['rss_anon_growth_bytes'] / 1e6:>10.2f} MB (both phases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
