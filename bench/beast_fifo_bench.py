"""BEAST's deferred FIFO on the writer thread: one key per URL against a host's run as one entry.

A crawl-shaped stream through the budget store with the shard's ``WriteThread`` attached (the
overlay, as in a crawl): ``--pages`` pages of hosts picked uniformly from ``--hosts`` (each host its
own registered domain, as in simweb), ``--links`` new URLs each, ``--own`` of them on the page's
host, the rest on random other hosts; ``offer_many`` per page, a budget commit every
``--pages-per-commit`` pages, a readmission of ``--readmit`` URLs every 10 pages. Each variant runs
in a fresh subprocess (``fifo.RUN_BYTES``: 0 writes one key per URL, format 2); reported: CPU of
the writer thread and of the loop thread per page (``/proc`` ticks), deferred-table puts per page,
the writer's transactions and the bytes it wrote per page (``/proc`` ``wchar``: LMDB's commits).

    nice .venv/bin/python bench/beast_fifo_bench.py --pages 20000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading

RECORD_BYTES = 39


def _ticks(tid: int) -> int:
    f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def _wchar(tid: int) -> int:
    """Bytes the thread passed to write system calls (LMDB's commits write each dirty page)."""
    return int(open(f"/proc/self/task/{tid}/io").read().split("wchar: ")[1].split()[0])


async def _one(args: argparse.Namespace, run_bytes: int) -> dict:
    from crawlerd.frontier.budgets import Beast, BudgetRule, BudgetStore, DomainGraph, domain_key, fifo
    from crawlerd.store.writer import WriteThread
    fifo.RUN_BYTES = run_bytes
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="beast-fifo-")
    store = BudgetStore(os.path.join(tmp, "state"), map_size_bytes=4 << 30, sync=False,
                        write_buffer_bytes=args.write_buffer_mib << 20, read_cache_bytes=8 << 20)
    graph = DomainGraph(store, mode="all")
    beast = Beast(store, graph, BudgetRule(2, 2, 100), queues=8)
    writer = WriteThread(asyncio.get_running_loop())
    store.attach_writer(writer)
    puts = [0]
    inner = store.overlay.put_many

    def counting(items, db=None):
        items = list(items)
        if db is store.deferred:
            puts[0] += len(items)
        return inner(items, db=db)
    store.overlay.put_many = counting
    hosts = [f"h{i}.example{i % 97}.org" for i in range(args.hosts)]
    loop_tid, writer_tid = threading.get_native_id(), writer._thread.native_id
    l0, w0, b0 = _ticks(loop_tid), _ticks(writer_tid), _wchar(writer_tid)
    serial = 0
    for page in range(args.pages):
        own = rng.choice(hosts)
        links = [own if rng.random() < args.own else rng.choice(hosts) for _ in range(args.links)]
        links.sort(key=lambda h: h != own)
        dks, recs, fps, hks = [], [], [], []
        for h in links:
            serial += 1
            dks.append(domain_key(h))
            recs.append(serial.to_bytes(8, "big") * (RECORD_BYTES // 8 + 1))
            fps.append(serial)
            hks.append("http://" + h)
        beast.offer_many(dks, recs, fps, hks)
        if page % 10 == 9:
            beast.readmit(args.readmit, advance=True)
        if page % args.pages_per_commit == args.pages_per_commit - 1:
            store.commit()
            await asyncio.sleep(0)
    done = asyncio.get_running_loop().create_future()
    store.commit(lambda: done.set_result(None))
    await done
    l1, w1, b1 = _ticks(loop_tid), _ticks(writer_tid), _wchar(writer_tid)
    hz = os.sysconf("SC_CLK_TCK")
    out = {"run_bytes": run_bytes, "waiting": beast.waiting, "deferred_puts_per_page": puts[0] / args.pages,
           "writer_us_per_page": (w1 - w0) / hz * 1e6 / args.pages, "loop_us_per_page": (l1 - l0) / hz * 1e6 / args.pages,
           "txns": store.overlay.txns, "written_kib_per_page": (b1 - b0) / 1024 / args.pages}
    store.attach_writer(None)
    writer.close()
    store.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=20_000)
    p.add_argument("--hosts", type=int, default=20_000)
    p.add_argument("--links", type=int, default=25)
    p.add_argument("--own", type=float, default=0.7, help="share of a page's links on its own host")
    p.add_argument("--pages-per-commit", type=int, default=14)
    p.add_argument("--readmit", type=int, default=15)
    p.add_argument("--write-buffer-mib", type=int, default=8, help="storage.lmdb_write_buffer_bytes, MiB")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)     # a child: one variant
    args = p.parse_args()
    if args.one is not None:
        print(json.dumps(asyncio.run(_one(args, args.one))))
        return
    from crawlerd.frontier.budgets import fifo
    rows: dict[int, list[dict]] = {0: [], fifo.RUN_BYTES: []}
    for _ in range(args.runs):
        for rb in rows:         # alternate, so a noisy box hits both
            cmd = [sys.executable, __file__, *sys.argv[1:], "--one", str(rb)]
            rows[rb].append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    print(f"{'layout':<26} {'deferred puts/page':>18} {'writer us/page':>15} {'loop us/page':>13} {'txns':>6} "
          f"{'written KiB/page':>16}")
    for rb, rs in rows.items():
        name = "one key per URL (fmt 2)" if rb == 0 else f"host runs (<= {rb} B)"
        med = {k: statistics.median(r[k] for r in rs) for k in ("deferred_puts_per_page", "writer_us_per_page",
                                                               "loop_us_per_page", "txns", "written_kib_per_page")}
        print(f"{name:<26} {med['deferred_puts_per_page']:>18.2f} {med['writer_us_per_page']:>15.1f} "
              f"{med['loop_us_per_page']:>13.1f} {med['txns']:>6.0f} {med['written_kib_per_page']:>16.1f}   runs: "
              + ", ".join(f"{r['writer_us_per_page']:.0f}/{r['loop_us_per_page']:.0f}" for r in rs))


if __name__ == "__main__":
    main()
