"""Due-time heap benchmark: scheduler-shaped workload, native DueHeap vs heapq with lazy deletion.

Workload (IRLbot-style politeness scheduler): N hosts start with random due
times; each round the clock advances, ``pop_due(now, batch)`` hands out the due
hosts, each is pushed back at ``now + delay``; a share of the hosts also get an
update-key (robots Crawl-delay, backoff) and some are removed (queue drained)
and re-added later. The heapq peer is the textbook entry-finder dict with lazy
deletion (entries marked removed, skipped on pop). Both see the same random
operation stream; the popped sequences are checked equal.

Run:  nice .venv/bin/python bench/heap_bench.py [--hosts 1000000] [--pops 2000000] [--runs 5]
"""

from __future__ import annotations

import argparse
import gc
import heapq
import random
import statistics
import time

from crawlerd._native.heap import DueHeap

_REMOVED = -1


class LazyHeapq:
    """heapq peer: [due, host] entries, entry-finder dict, removed entries marked host=-1."""

    def __init__(self) -> None:
        self.heap: list[list] = []
        self.finder: dict[int, list] = {}

    def push(self, host: int, due: float) -> None:
        entry = [due, host]
        self.finder[host] = entry
        heapq.heappush(self.heap, entry)

    def remove(self, host: int) -> bool:
        entry = self.finder.pop(host, None)
        if entry is None:
            return False
        entry[1] = _REMOVED
        return True

    def update(self, host: int, due: float) -> None:
        self.remove(host)
        self.push(host, due)

    def pop_due(self, now: float, limit: int) -> list[int]:
        heap, finder, out = self.heap, self.finder, []
        while heap and len(out) < limit and heap[0][0] <= now:
            _, host = heapq.heappop(heap)
            if host != _REMOVED:
                del finder[host]
                out.append(host)
        return out


def make_ops(hosts: int, pops: int, seed: int):
    """Pre-generate the random numbers so both peers pay nothing for them."""
    rng = random.Random(seed)
    initial = [rng.uniform(0.0, 10.0) for _ in range(hosts)]
    delays = [rng.uniform(1.0, 10.0) for _ in range(pops)]
    updates = [(rng.randrange(hosts), rng.uniform(-2.0, 5.0)) for _ in range(pops // 10)]
    removes = [rng.randrange(hosts) for _ in range(pops // 20)]
    return initial, delays, updates, removes


def run(heap, ops, batch: int, pops: int) -> tuple[float, float, list[int]]:
    """Returns (build seconds, workload seconds, sample of popped hosts)."""
    initial, delays, updates, removes = ops
    push, remove, pop_due = heap.push, heap.remove, heap.pop_due
    update = heap.update
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for host, due in enumerate(initial):
            push(host, due)
        t1 = time.perf_counter()
        now, done, di, ui, ri = 0.0, 0, 0, 0, 0
        parked: list[int] = []
        present = [True] * len(initial)
        sample: list[int] = []
        while done < pops:
            now += 0.01
            got = pop_due(now, batch)
            for host in got:
                push(host, now + delays[di % len(delays)])
                di += 1
            done += len(got)
            if len(sample) < 10000:
                sample.extend(got)
            # one update-key per ten pops, one remove per twenty; removed hosts come back a round later
            for _ in range(len(got) // 10):
                host, delta = updates[ui % len(updates)]
                ui += 1
                if present[host]:
                    update(host, now + delta)
            for host in parked:
                push(host, now + 1.0)
                present[host] = True
            parked = []
            for _ in range(len(got) // 20):
                host = removes[ri % len(removes)]
                ri += 1
                if present[host] and remove(host):
                    present[host] = False
                    parked.append(host)
        t2 = time.perf_counter()
    finally:
        gc.enable()
    return t1 - t0, t2 - t1, sample


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=1_000_000)
    ap.add_argument("--pops", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    ops = make_ops(args.hosts, args.pops, seed=7)
    results: dict[str, list[tuple[float, float]]] = {"DueHeap": [], "heapq+lazy": []}
    for r in range(args.runs):
        # alternate order so drift on a shared machine hits both peers alike
        order = [("DueHeap", DueHeap), ("heapq+lazy", LazyHeapq)]
        if r % 2:
            order.reverse()
        samples = {}
        for name, cls in order:
            heap = cls(args.hosts) if cls is DueHeap else cls()
            build, work, samples[name] = run(heap, ops, args.batch, args.pops)
            results[name].append((build, work))
            del heap
        assert samples["DueHeap"] == samples["heapq+lazy"], "peers popped different sequences"
    print(f"hosts={args.hosts} pops={args.pops} batch={args.batch} runs={args.runs} (medians)")
    med = {}
    for name, rows in results.items():
        build = statistics.median(b for b, _ in rows)
        work = statistics.median(w for _, w in rows)
        med[name] = (build, work)
        print(f"  {name:11s} build {build * 1e9 / args.hosts:7.1f} ns/push   "
              f"workload {work * 1e9 / args.pops:7.1f} ns/pop (incl. re-push, update, remove)")
    nb, nw = med["DueHeap"]
    hb, hw = med["heapq+lazy"]
    print(f"  ratio heapq/DueHeap: build {hb / nb:.1f}x, workload {hw / nw:.1f}x")


if __name__ == "__main__":
    main()
