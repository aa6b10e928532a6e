"""The writer thread's LMDB writes, replayed: a crawl's recorded overlay groups written again.

Input: a recording of a crawl's overlay groups (``bench/write_counts/sitecustomize.py`` with
``CRAWLERD_WRITE_RECORD=DIR``: per store, every group the writer thread wrote, as its layers'
writes by table). For each recorded store this opens a fresh LMDB environment with the store's
tables and its page reservation (``WriteBudget`` over the same tables, as the store opens it), and
has ``Overlay._write`` of the tree under test (``--tree``, default this script's) write the same
groups, in order, on a thread of its own: the writer's work without the crawl around it.
Reported per store and in all: the thread's CPU (``time.thread_time``) per recorded page, the
transactions, the writes handed to LMDB, and the bytes the commits wrote (``wchar`` of the thread,
``/proc``; a commit writes each page its transaction changed, so KiB / 4 is the pages written),
against the pages the writer's charge (``Overlay._charge``) allowed.

    nice -n 10 .venv/bin/python bench/writer_replay_bench.py DIR --pages N [--tree /work/wt/integ15] [--runs 3]

``--pages``: the pages the recorded crawl fetched while it recorded (figures per page).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _wchar() -> int:
    tid = threading.get_native_id()
    return int(open(f"/proc/self/task/{tid}/io").read().split("wchar: ")[1].split()[0])


def _load(path: str):
    with open(path, "rb") as f:
        head = pickle.load(f)
        groups = []
        while True:
            n = f.read(8)
            if len(n) < 8:
                break
            groups.append(pickle.loads(f.read(int.from_bytes(n, "little"))))
    return head, groups


def _replay(path: str, tmp: str, reserve: dict[str, int]) -> dict:
    import lmdb

    from crawlerd.store import overlay as ov
    from crawlerd.store.lmdb_reserve import WriteBudget
    head, groups = _load(path)
    store = head["store"]
    names = sorted({t for g in groups for layer in g for t, _, _ in layer} | set(head["budget_dbs"]))
    env = lmdb.open(os.path.join(tmp, store), map_size=4 << 30, max_dbs=16, sync=False, metasync=False,
                    readahead=False, meminit=False)
    budget = WriteBudget(env, reserve.get(store, head["pages"] * env.stat()["psize"]))
    dbs = {n: env.open_db(n.split(".", 1)[1].encode()) for n in names}
    budget.dbs = tuple(dbs[n] for n in head["budget_dbs"] if n in dbs)

    class _NoWriter:
        def submit(self, *a, **k):
            raise AssertionError("replay writes directly")

    o = ov.Overlay(env, _NoWriter(), budget)
    three = hasattr(o, "_group")         # a tree whose writer merges takes each layer's changes too
    items_of = []
    for g in groups:
        items = []
        for layer in g:
            ops, changes = [], {}
            for t, dels, puts in layer:
                db = dbs[t]
                if dels is None:
                    ops.append((db, None, ()))
                    continue
                ops.append((db, dels, puts))
                ch = dict.fromkeys(dels)
                ch.update(puts)
                changes[db] = ch
            items.append((ops, False, changes) if three else (ops, False))
        items_of.append(items)
    out = {}
    pages = []          # per committed transaction: the pages its commit wrote

    class _Measured:
        """A write transaction whose commit counts the pages it wrote (the thread's wchar)."""

        def __init__(self, txn):
            self._txn = txn

        def __getattr__(self, name):
            return getattr(self._txn, name)

        def commit(self):
            w = _wchar()
            self._txn.commit()
            pages.append((_wchar() - w) // psize)

    psize = env.stat()["psize"]
    begin = o._begin
    o._begin = lambda: _Measured(begin())

    def run() -> None:
        o.loop_thread = -1
        w0, c0 = _wchar(), time.thread_time()
        for items in items_of:
            o._write(items)
        out["cpu_s"] = time.thread_time() - c0
        out["wchar"] = _wchar() - w0

    t = threading.Thread(target=run, name="replay-writer")
    t.start()
    t.join()
    writes = sum(len(d) + len(p) for g in groups for layer in g for _, d, p in layer if d is not None)
    st = o.stats()
    env.close()
    return {"store": store, "groups": len(groups), "layers": sum(len(g) for g in groups), "writes": writes,
            "lmdb_writes": st.get("writes", writes), "merged": st.get("merged_writes", 0),
            "txns": o.txns, "cpu_s": out["cpu_s"], "wchar": out["wchar"], "limit": budget.limit,
            "pages_mean": sum(pages) / max(1, len(pages)), "pages_p99": sorted(pages)[int(0.99 * len(pages))] if pages else 0,
            "pages_max": max(pages, default=0)}


def _child(args) -> None:
    tmp = tempfile.mkdtemp(prefix="writer-replay-")
    try:
        reserve = {k: int(v) << 20 for k, v in (x.split("=") for x in args.reserve_mib)}
        rows = [_replay(p, tmp, reserve) for p in sorted(glob.glob(os.path.join(args.dir, "*.rec")))]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--pages", type=int, required=True, help="pages the recorded crawl fetched while recording")
    ap.add_argument("--tree", help="import crawlerd from this tree (default: this script's)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reserve-mib", action="append", default=[], metavar="STORE=MIB",
                    help="a store's page reservation (default: as recorded), e.g. BudgetStore=16")
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    tree = args.tree or os.path.dirname(HERE)
    env = dict(os.environ, PYTHONPATH=tree)
    runs = []
    for _ in range(args.runs):
        cmd = [sys.executable, "-P", os.path.abspath(__file__), args.dir, "--pages", str(args.pages), "--child",
               *(f"--reserve-mib={x}" for x in args.reserve_mib)]
        rows = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        runs.append(rows)
        tot = {k: sum(r[k] for r in rows) for k in ("writes", "lmdb_writes", "merged", "txns", "cpu_s", "wchar")}
        print(f"{tree}: writer µs/page {1e6 * tot['cpu_s'] / args.pages:.1f}, transactions {tot['txns']}, "
              f"writes to LMDB {tot['lmdb_writes']} of {tot['writes']} recorded, "
              f"KiB written/page {tot['wchar'] / 1024 / args.pages:.2f}")
        for r in rows:
            print(f"   {r['store']}: {r['groups']} groups, {r['layers']} layers, {r['txns']} transactions, "
                  f"µs/page {1e6 * r['cpu_s'] / args.pages:.1f}, KiB/page {r['wchar'] / 1024 / args.pages:.2f}, "
                  f"merged away {r['merged']}; pages a commit wrote: mean {r['pages_mean']:.0f}, p99 "
                  f"{r['pages_p99']}, max {r['pages_max']} (charge limit {r['limit']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tree": tree, "pages": args.pages, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
