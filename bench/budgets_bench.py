"""STAR/BEAST budgets benchmark: a crawl-shaped stream through crawlerd.frontier.budgets and a RAM peer.

The stream (deterministic from the seed): ``--urls`` new URLs over ``--domains`` pay-level domains
picked by a Zipf law (s = 1.1), so a few domains are hot and most are seen a handful of times. One URL
in ten is a processed page that links to 8 domains (Zipf too), as the shard records them.

Phases, each timed alone (wall and CPU of this process):

* ``intake``  per URL ``admit``, else ``defer`` a 64-byte record; a commit every 1,000 URLs (the
  shard commits once per seen-set drain).
* ``edges``   ``add_edges`` per page and ``poll``, then one ``flush``: in-degrees are applied.
* ``readmit`` ``new_cycle`` then ``readmit(1000)`` + commit until the deferred store is empty.

Stores, each run in its own subprocess (peak RSS is its own):

* ``budgets``  DomainGraph + Budgets (DRUM edges, LMDB state, LRUs of 65,536 domains), sync=False.
* ``dict``     the same rules on Python dicts/sets/deques: every edge, domain and deferred record in RAM
  (what bounded memory, ARCHITECTURE.md invariant 4; gives up).

Reported: operations/s per phase (wall and CPU), peak RSS (it includes the LMDB file pages the kernel
maps in, which are page cache, not heap) and anonymous RSS at the end; medians of ``--runs`` runs and the
ratio budgets/dict measured in the same invocation.

    nice .venv/bin/python bench/budgets_bench.py                      # 200,000 URLs, 20,000 domains, 3 runs
    nice .venv/bin/python bench/budgets_bench.py --urls 2000000 --domains 200000 --runs 3
"""

from __future__ import annotations

import argparse
import collections
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

RECORD = b"r" * 56
PARAMS = dict(base_budget=10, per_inlink=10, max_budget=100_000)


def stream(urls: int, domains: int, seed: int):
    """(domain index per URL, targets per page): Zipf-distributed, deterministic."""
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, domains + 1, dtype=np.float64)
    p = ranks ** -1.1
    p /= p.sum()
    dom = rng.choice(domains, size=urls, p=p)
    pages = urls // 10
    targets = rng.choice(domains, size=(pages, 8), p=p)
    return dom.tolist(), targets.tolist()


class DictPeer:
    """The rules of Budgets on plain Python containers (unbounded RAM)."""

    def __init__(self):
        self.edges: set[tuple[str, str]] = set()
        self.indeg: collections.Counter[str] = collections.Counter()
        self.spent: collections.Counter[str] = collections.Counter()
        self.deferred: dict[str, collections.deque] = {}

    def budget(self, d):
        return min(PARAMS["max_budget"], PARAMS["base_budget"] + PARAMS["per_inlink"] * self.indeg[d])

    def admit(self, d):
        if d not in self.deferred and self.spent[d] < self.budget(d):
            self.spent[d] += 1
            return True
        return False

    def defer(self, d, rec):
        self.deferred.setdefault(d, collections.deque()).append(rec)

    def add_edges(self, src, targets):
        for t in set(targets):
            if t != src and (src, t) not in self.edges:
                self.edges.add((src, t))
                self.indeg[t] += 1

    def new_cycle(self):
        self.spent.clear()

    def readmit(self, limit):
        out = []
        for d in list(self.deferred):
            q = self.deferred[d]
            n = min(self.budget(d) - self.spent[d], len(q), limit - len(out))
            for _ in range(n):
                out.append(q.popleft())
            self.spent[d] += max(n, 0)
            if not q:
                del self.deferred[d]
            if len(out) >= limit:
                break
        return out


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def run_one(store: str, urls: int, domains: int, seed: int) -> dict:
    dom, targets = stream(urls, domains, seed)
    names = [f"d{i}.example" for i in range(domains)]
    tmp = tempfile.mkdtemp(prefix="budgets-bench-")
    try:
        if store == "budgets":
            from crawlerd.frontier.budgets import Budgets, DomainGraph
            g = DomainGraph(tmp, sync=False, map_size_bytes=8 << 30)
            b = Budgets(g, **PARAMS)
            commit, poll, flush = b.commit, g.poll, g.flush
        else:
            g = b = DictPeer()
            commit = poll = flush = lambda *a: None     # noqa: E731
        out = {}

        t0, c0 = time.perf_counter(), time.process_time()
        admit, defer = b.admit, b.defer
        for i, d in enumerate(dom):
            name = names[d]
            if not admit(name):
                defer(name, RECORD)
            if i % 1000 == 999:
                commit()
        commit()
        out["intake"] = (urls, time.perf_counter() - t0, time.process_time() - c0)

        t0, c0 = time.perf_counter(), time.process_time()
        n_edges = 0
        for k, tg in enumerate(targets):
            g.add_edges(names[dom[k * 10]], [names[t] for t in tg])
            n_edges += 8
            if k % 100 == 99:
                poll()
        flush()
        out["edges"] = (n_edges, time.perf_counter() - t0, time.process_time() - c0)

        t0, c0 = time.perf_counter(), time.process_time()
        b.new_cycle()
        got = 0
        while True:
            recs = b.readmit(1000)
            commit()
            if not recs:
                break
            got += len(recs)
        out["readmit"] = (max(got, 1), time.perf_counter() - t0, time.process_time() - c0)
        out["readmitted"] = got
        if store == "budgets":
            g.close()
        out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out["anon_mib"] = _status_kib("RssAnon") / 1024    # heap now: RSS less mapped LMDB/DRUM file pages
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--urls", type=int, default=200_000)
    ap.add_argument("--domains", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_one(a.child, a.urls, a.domains, a.seed)))
        return 0
    results: dict[str, list[dict]] = {"budgets": [], "dict": []}
    for _ in range(a.runs):
        for store in results:          # interleaved, so both see the same machine load
            cmd = [sys.executable, os.path.abspath(__file__), "--child", store, "--urls", str(a.urls),
                   "--domains", str(a.domains), "--seed", str(a.seed)]
            results[store].append(json.loads(subprocess.check_output(cmd)))
    print(f"urls={a.urls} domains={a.domains} runs={a.runs} params={PARAMS}")
    print(f"{'phase':<9} {'store':<8} {'ops/s (wall)':>14} {'ops/s (cpu)':>13} {'dict/budgets':>13}")
    med = {}
    for phase in ("intake", "edges", "readmit"):
        for store, runs in results.items():
            wall = statistics.median(r[phase][0] / r[phase][1] for r in runs)
            cpu = statistics.median(r[phase][0] / max(r[phase][2], 1e-9) for r in runs)
            med[phase, store] = wall
            ratio = f"{wall / med[phase, 'budgets']:.2f}" if store == "dict" else ""
            print(f"{phase:<9} {store:<8} {wall:>14,.0f} {cpu:>13,.0f} {ratio:>13}")
    for store, runs in results.items():
        print(f"{store:<8} peak RSS {statistics.median(r['rss_mib'] for r in runs):.0f} MiB "
              f"(anonymous at the end {statistics.median(r['anon_mib'] for r in runs):.0f} MiB), "
              f"readmitted {runs[0]['readmitted']}")
    same = {r["readmitted"] for rs in results.values() for r in rs}
    if len(same) != 1:
        print(f"stores disagree on readmitted records: {same}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
