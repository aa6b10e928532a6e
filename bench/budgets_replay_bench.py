"""The budget stage's loop work, replayed: a crawl's recorded budget calls made again, offline.

Input: a recording of the calls a crawl made into ``Budgets`` (``bench/budget_calls/sitecustomize.py``:
intake's ``offer_many``, readmissions, commits, pages' links, edge answers applied, seeds, refunds).
Each tree under test (``--python``: the interpreter of its venv; default this one) opens a fresh
budget store (the crawl's settings: vouched in-degree, probation, 16 MiB of reserved page buffers)
with a ``WriteThread`` attached, as in the crawl, and makes the same calls in order, yielding to
the event loop every 20 calls so commits land. Reported per recorded page: the loop thread's CPU
in the calls (``time.thread_time``), by call kind (``om`` intake, ``rm`` readmission, ``c``
commit, ``rpl`` pages' links, ``ap`` edge answers, ``ar`` seeds), the writer thread's CPU
(``/proc`` ticks), the budget tables' writes per page (each commit's layer, last write per key),
the verdicts and readmission counts that differ from the recorded ones (``mismatches``: 0 means
the same decisions), and a hash of each table at the end (its rows as FIFO format 4 laid them out,
so that trees before and after format 5 compare), and the bytes the writer thread wrote per page
(``wchar``: LMDB writes each page a commit changed). The commits the edge deliveries make on
their own (``Budgets._commit_edges``) are not in the recording. Each tree runs in a subprocess,
the trees alternating, ``--runs`` times; medians.

    nice -n 10 .venv/bin/python bench/budgets_replay_bench.py /tmp/rec/r.PID.pkl --python /work/wt/integ17/.venv/bin/python --python .venv/bin/python --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

_Answer = collections.namedtuple("_Answer", "seq unique aux key")
_TABLES = ("graph", "votes", "domains", "deferred", "queues", "turns", "meta")


def _wchar(tid: int) -> int:
    return int(open(f"/proc/self/task/{tid}/io").read().split("wchar: ")[1].split()[0])


def _ticks(tid: int) -> int:
    f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def _load(path: str) -> list:
    calls = []
    with open(path, "rb") as f:
        while True:
            try:
                calls.append(pickle.load(f))
            except EOFError:
                return calls


def _rows(txn, store, name: str):
    """A table's rows as FIFO format 4 laid them out, whichever layout the tree under test writes:
    from format 5 on, ``deferred`` also holds the domain records (keys without a NUL, ending in
    ``\\x01``), which read here as the ``domains`` rows they were."""
    if name not in ("deferred", "domains"):
        yield from txn.cursor(db=getattr(store, name))
        return
    rows = sorted([(bytes(k), bytes(v)) for k, v in txn.cursor(db=store.deferred)]
                  + [(bytes(k) + b"\x01", bytes(v)) for k, v in txn.cursor(db=store.domains)])
    for k, v in rows:
        if (b"\0" in k) == (name == "deferred"):
            yield (k, v) if name == "deferred" else (k[:-1], v)


async def _replay(calls: list) -> dict:
    from crawlerd.frontier.budgets import Budgets
    from crawlerd.store.writer import WriteThread
    b = Budgets(tempfile.mkdtemp(prefix="budgets-replay-"), base_budget=2, per_inlink=2, max_budget=100_000,
                mode="vouched", sync=False, write_buffer_bytes=16 << 20, read_cache_bytes=16 << 20, probation=True)
    writer = WriteThread(asyncio.get_running_loop())
    b.attach_writer(writer)
    names = {id(getattr(b.store, n)): n for n in _TABLES}
    writes: collections.Counter[str] = collections.Counter()
    ov = b.store.overlay
    commit = ov.commit

    def counting(then=None, *, sync=False):
        for db, layer in ov._layer.items():
            n = names.get(id(db), "?")
            for v in layer.values():
                writes[n + (".put" if v is not None else ".del")] += 1
        return commit(then, sync=sync)
    ov.commit = counting
    cpu: collections.Counter[str] = collections.Counter()
    mismatches = 0
    w0, b0 = _ticks(writer._thread.native_id), _wchar(writer._thread.native_id)
    tt = time.thread_time
    for i, x in enumerate(calls):
        k = x[0]
        t = tt()
        if k == "om":
            mismatches += b.offer_many(x[1], x[2], x[3]) != x[4]
        elif k == "o":
            mismatches += b.offer(x[1], x[2], x[3], x[4]) != x[5]
        elif k == "rm":
            mismatches += len(b.readmit(x[1], advance=x[2])) != x[3]
        elif k == "c":
            b.commit()
        elif k == "rpl":
            b.record_pages_links(x[1])
        elif k == "ap":
            b.graph.apply([_Answer(s, u, aux, 0) for s, u, aux in x[1]])
        elif k == "ar":
            b.add_root(x[1])
        elif k == "rf":
            b.refund(x[1])
        cpu[k] += tt() - t
        if i % 20 == 19:
            await asyncio.sleep(0)
    done = asyncio.get_running_loop().create_future()
    t = tt()
    b.commit(lambda: done.set_result(None))
    cpu["c"] += tt() - t
    await done
    w1, b1 = _ticks(writer._thread.native_id), _wchar(writer._thread.native_id)
    pages = max(1, sum(len(x[1]) for x in calls if x[0] == "rpl"))
    b.store.attach_writer(None)
    writer.close()
    hashes = {}
    with b.store.env.begin() as txn:
        for n in ("deferred", "domains", "queues", "turns", "graph", "votes"):
            h = hashlib.sha1()
            for key, v in _rows(txn, b.store, n):
                h.update(key + b"|" + v + b"\n")
            hashes[n] = h.hexdigest()[:10]
    b.store.close()
    return {"pages": pages, "loop_us_per_page": sum(cpu.values()) * 1e6 / pages,
            "writer_us_per_page": (w1 - w0) / os.sysconf("SC_CLK_TCK") * 1e6 / pages,
            "writer_kib_per_page": (b1 - b0) / 1024 / pages,
            "calls_us_per_page": {k: v * 1e6 / pages for k, v in sorted(cpu.items())},
            "writes_per_page": {k: v / pages for k, v in sorted(writes.items())},
            "mismatches": mismatches, "tables": hashes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recording")
    p.add_argument("--python", action="append", help="a tree's interpreter (repeat; default: this one)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)     # a child: one replay
    args = p.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(_replay(_load(args.recording)))))
        return
    pythons = args.python or [sys.executable]
    rows: dict[str, list[dict]] = {py: [] for py in pythons}
    for _ in range(args.runs):
        for py in pythons:      # alternate, so a noisy box hits each tree
            out = subprocess.run([py, os.path.abspath(__file__), args.recording, "--one"], check=True,
                                 capture_output=True, text=True).stdout
            rows[py].append(json.loads(out))
    for py, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("loop_us_per_page", "writer_us_per_page", "writer_kib_per_page")}
        calls = {k: round(statistics.median(r["calls_us_per_page"][k] for r in rs), 1) for k in rs[0]["calls_us_per_page"]}
        writes = {k: round(statistics.median(r["writes_per_page"].get(k, 0) for r in rs), 2) for k in rs[0]["writes_per_page"]}
        each = ", ".join(f"{r['loop_us_per_page']:.0f}" for r in rs)
        print(f"{py}: {rs[0]['pages']} pages; loop {med['loop_us_per_page']:.1f} us/page "
              f"(runs {each}), writer {med['writer_us_per_page']:.1f} us/page, "
              f"{med['writer_kib_per_page']:.1f} KiB/page; "
              f"mismatches {[r['mismatches'] for r in rs]}")
        print(f"  calls us/page: {calls}")
        print(f"  writes/page: {writes}")
        print(f"  tables: {rs[-1]['tables']}")


if __name__ == "__main__":
    main()
