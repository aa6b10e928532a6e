"""Frontier benchmark: enqueue rate, lease+complete rate, RAM per active host, disk per queued URL,
and the native due heap against heapq with lazy deletion on the scheduler's own heap workload.

Rates are given per wall second and per CPU second of this process (on a shared
machine the second is the fair one). Phases of one run (fresh LMDB directory each run):

1. memory: one URL for each of --hosts hosts, every host resolved
   (--hosts-per-ip hosts share an address; 1 is the worst case for per-IP
   state); RssAnon growth from the first to the second half of the hosts,
   per host. RssAnon is anonymous memory only: LMDB's file-backed map is not
   counted (it is page cache, reclaimable). Measured in the first run only.
2. enqueue: the remaining --urls URLs in add() batches of --batch, spread over
   the hosts with a heavy tail; URLs/s, then LMDB bytes per queued URL.
3. lease+complete: politeness delays set to 0 so every host is always due;
   lease(limit=--lease-batch) then complete() each, --pairs pairs in all.
4. heap: a separate Frontier on a virtual clock with real delays (1-10 s gaps)
   records every heap call it makes; the same call stream is replayed on the
   native DueHeap and on a heapq peer with lazy deletion; calls/s of each.

Run:  nice -n 10 .venv/bin/python bench/frontier_bench.py [--hosts 20000] [--urls 300000] [--runs 3]
      add --sync to fsync every transaction (default: sync=False, see crawlerd/frontier/queues.py).
"""

from __future__ import annotations

import argparse
import gc
import heapq
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from crawlerd._native import heap as native_heap  # noqa: E402
from crawlerd.frontier import Frontier, QueuedURL  # noqa: E402
from crawlerd.frontier import scheduler as scheduler_mod  # noqa: E402
from crawlerd.outcome import Outcome  # noqa: E402


def rss_anon_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def host_key(i: int) -> str:
    return f"http://www.host{i}.example-{i % 97}.test"


def ip_of(i: int) -> str:
    return f"127.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"   # a label only: nothing is connected


def url_batches(hosts: int, urls: int, batch: int, rng: random.Random):
    # Heavy tail: host index ~ hosts * u**3, so a few hosts hold most URLs.
    for start in range(0, urls, batch):
        out = []
        for j in range(start, min(urls, start + batch)):
            h = int(hosts * rng.random() ** 3)
            hk = host_key(h)
            out.append(QueuedURL(f"{hk}/section/{j % 1000}/page-{j}.html", hk, priority=j % 4, fp=j))
        yield out


def frontier(path: str, hosts: int, sync: bool, **kw) -> Frontier:
    params = dict(max_active_hosts=max(hosts, 1), map_size_bytes=1 << 37, sync=sync, rng=random.Random(1))
    params.update(kw)
    return Frontier(path, **params)


def answer(f: Frontier, hosts_per_ip: int = 1) -> int:
    n = 0
    for hk in f.hosts_needing_dns():
        i = int(hk.split("host", 1)[1].split(".", 1)[0])
        f.set_host_ip(hk, ip_of(i // hosts_per_ip))
        f.set_robots(hk, expires_at=1e18, crawl_delay_s=None)
        n += 1
    return n


def one_run(base: str, args) -> dict:
    rng = random.Random(args.seed)
    path = os.path.join(base, "frontier")
    shutil.rmtree(path, ignore_errors=True)
    f = frontier(path, args.hosts, args.sync, min_delay_s=0.0, delay_factor=0.0, max_delay_s=0.0)
    # Marginal RSS from the first to the second half of the hosts: fixed costs (LMDB's pool of
    # page buffers, table growth steps) cancel out.
    # Small batches: LMDB keeps the page buffers of its largest transaction for reuse, a cost
    # that follows the batch size, not the number of hosts.
    half, rss, step = args.hosts // 2, {}, 500
    for start in range(0, args.hosts, step):
        end = min(args.hosts, start + step)
        f.add([QueuedURL(f"{host_key(h)}/", host_key(h), fp=h) for h in range(start, end)])
        answer(f, args.hosts_per_ip)
        f.commit()
        if start < half <= end or end == args.hosts:
            gc.collect()
            rss[end] = rss_anon_bytes()
    (h1, r1), (h2, r2) = sorted(rss.items())[:2]
    per_host = (r2 - r1) / (h2 - h1)

    # Batches are generated lazily (10^7 URL objects would not fit in RAM); only add() is timed.
    wall = cpu = 0.0
    n = 0
    for batch in url_batches(args.hosts, args.urls - args.hosts, args.batch, rng):
        t0, c0 = time.perf_counter(), time.process_time()
        n += f.add(batch)
        wall += time.perf_counter() - t0
        cpu += time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    f.commit()
    enqueue = n / (wall + time.perf_counter() - t0)
    enqueue_cpu = n / (cpu + time.process_time() - c0)
    use = f.storage()
    queued = f.queued()

    t0, c0 = time.perf_counter(), time.process_time()
    pairs = 0
    while pairs < args.pairs:
        leases = f.lease(limit=args.lease_batch)
        if not leases:
            break
        for lease in leases:
            f.complete(lease.lease_id, outcome=Outcome.OK, status=200)
        pairs += len(leases)
    f.commit()
    lease_rate = pairs / (time.perf_counter() - t0)
    lease_cpu = pairs / (time.process_time() - c0)
    f.check_invariants()
    f.close()
    return {"enqueue_per_s": enqueue, "enqueue_per_cpu_s": enqueue_cpu, "lease_complete_per_s": lease_rate,
            "lease_complete_per_cpu_s": lease_cpu, "ram_per_host_b": per_host,
            "disk_per_url_b": use["queues_bytes"] / max(queued, 1), "file_per_url_b": use["file_bytes"] / max(queued, 1),
            "pairs": pairs}


# -- heap: record the scheduler's calls, replay on both heaps -----------------------------
class RecordingHeap(native_heap.DueHeap):
    trace: list[tuple] = []

    def push(self, h, d):
        RecordingHeap.trace.append((0, h, d))
        return super().push(h, d)

    def update(self, h, d):
        RecordingHeap.trace.append((1, h, d))
        return super().update(h, d)

    def push_or_update(self, h, d):
        RecordingHeap.trace.append((2, h, d))
        return super().push_or_update(h, d)

    def remove(self, h):
        RecordingHeap.trace.append((3, h, 0.0))
        return super().remove(h)

    def pop_due(self, now, limit):
        RecordingHeap.trace.append((4, now, limit))
        return super().pop_due(now, limit)


class LazyHeapq:
    """Peer: heapq of [due, host, live] with an entry dict; removal marks the entry dead."""

    def __init__(self, capacity: int = 0):
        self.heap: list[list] = []
        self.entry: dict[int, list] = {}

    def push(self, h, d):
        e = [d, h, True]
        self.entry[h] = e
        heapq.heappush(self.heap, e)

    def remove(self, h):
        e = self.entry.pop(h, None)
        if e is None:
            return False
        e[2] = False
        return True

    def update(self, h, d):
        self.remove(h)
        self.push(h, d)

    push_or_update = update

    def pop_due(self, now, limit):
        heap, entry, out = self.heap, self.entry, []
        while heap and len(out) < limit and heap[0][0] <= now:
            d, h, live = heapq.heappop(heap)
            if live:
                del entry[h]
                out.append(h)
        return out


def record_trace(base: str, hosts: int, urls: int, rounds: int) -> list[tuple]:
    """Drive a Frontier on a virtual clock with real gaps; return the heap calls it made."""
    path = os.path.join(base, "trace")
    shutil.rmtree(path, ignore_errors=True)
    rng = random.Random(3)
    clock = [0.0]
    scheduler_mod.DueHeap = RecordingHeap
    try:
        f = frontier(path, hosts, False, clock=lambda: clock[0], min_delay_s=1.0, max_delay_s=10.0,
                     per_ip_concurrency=2)
    finally:
        scheduler_mod.DueHeap = native_heap.DueHeap
    for batch in url_batches(hosts, urls, 5000, rng):
        f.add(batch)
    answer(f)
    RecordingHeap.trace = []
    for _ in range(rounds):
        clock[0] += 0.05
        leases = f.lease(clock[0], limit=5000)
        for lease in leases:
            # ~6 % fail (backoff), the rest answer in 0.1-1 s (gaps 1-10 s).
            bad = rng.random() < 0.06
            f.complete(lease.lease_id, outcome=Outcome.TIMEOUT if bad else Outcome.OK, status=0 if bad else 200,
                       response_time_s=rng.uniform(0.1, 1.0))
        answer(f)
    trace = RecordingHeap.trace
    RecordingHeap.trace = []
    f.close()
    return trace


def replay(heap, trace) -> tuple[float, int]:
    push, update, pou, remove, pop_due = heap.push, heap.update, heap.push_or_update, heap.remove, heap.pop_due
    check = 0
    t0 = time.perf_counter()
    for op, a, b in trace:
        if op == 4:
            check += len(pop_due(a, b))
        elif op == 0:
            push(a, b)
        elif op == 1:
            update(a, b)
        elif op == 2:
            pou(a, b)
        else:
            remove(a)
    return time.perf_counter() - t0, check


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=20000)
    ap.add_argument("--urls", type=int, default=300000)
    ap.add_argument("--batch", type=int, default=5000, help="URLs per add() call")
    ap.add_argument("--lease-batch", type=int, default=1000, help="limit of each lease() call")
    ap.add_argument("--pairs", type=int, default=100000, help="lease+complete pairs measured")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hosts-per-ip", type=int, default=1, help="hosts sharing one address (1: worst case for RAM)")
    ap.add_argument("--sync", action="store_true", help="fsync every LMDB transaction")
    ap.add_argument("--heap-hosts", type=int, default=50000)
    ap.add_argument("--heap-rounds", type=int, default=400)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir, removed after)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.urls < args.hosts:
        ap.error("--urls must be >= --hosts")
    if args.hosts < 1000:
        ap.error("--hosts must be at least 1000 (RAM is measured between the two halves)")
    base = args.dir or tempfile.mkdtemp(prefix="frontier-bench-")
    try:
        print(f"frontier bench: hosts={args.hosts} urls={args.urls} batch={args.batch} "
              f"lease_batch={args.lease_batch} pairs={args.pairs} runs={args.runs} sync={args.sync}", flush=True)
        runs = []
        for i in range(args.runs):
            r = one_run(base, args)
            runs.append(r)
            print(f"  run {i + 1}: " + "  ".join(f"{k}={v:,.0f}" for k, v in r.items()), flush=True)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        med["ram_per_host_b"] = runs[0]["ram_per_host_b"]   # later runs reuse memory freed by earlier ones
        print(f"median enqueue          {med['enqueue_per_s']:>12,.0f} URLs/s wall, "
              f"{med['enqueue_per_cpu_s']:,.0f} per CPU-s   (target >= 100,000)")
        print(f"median lease+complete   {med['lease_complete_per_s']:>12,.0f} pairs/s wall, "
              f"{med['lease_complete_per_cpu_s']:,.0f} per CPU-s  (target >= 50,000)")
        print(f"RAM/active host (run 1) {med['ram_per_host_b']:>12,.0f} B        (target <= 300; marginal RssAnon, "
              f"{args.hosts_per_ip} host(s) per IP)")
        print(f"median disk/queued URL  {med['disk_per_url_b']:>12,.0f} B        (queues table pages; "
              f"map file {med['file_per_url_b']:,.0f} B/URL)")

        trace = record_trace(base, args.heap_hosts, args.heap_hosts * 4, args.heap_rounds)
        kinds = [sum(1 for t in trace if t[0] == k) for k in range(5)]
        print(f"heap trace: {len(trace):,} calls (push {kinds[0]:,}, update {kinds[1]:,}, "
              f"push_or_update {kinds[2]:,}, remove {kinds[3]:,}, pop_due {kinds[4]:,})")
        nat, peer = [], []
        for _ in range(max(args.runs, 3)):
            dn, cn = replay(native_heap.DueHeap(1024), trace)
            dp, cp = replay(LazyHeapq(), trace)
            if cn != cp:
                print(f"heap replay mismatch: native popped {cn}, heapq popped {cp}")
                return 1
            nat.append(dn)
            peer.append(dp)
        mn, mp = statistics.median(nat), statistics.median(peer)
        print(f"heap replay: native {len(trace) / mn:,.0f} calls/s, heapq+lazy {len(trace) / mp:,.0f} calls/s, "
              f"ratio {mp / mn:.1f}x (median of {len(nat)})")
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
