"""The admission path alone: DRUM deliveries through ``Intake`` into BEAST and the frontier, CPU per answer.

A crawl-shaped stream of answers (``--hosts`` hosts, each its own registered domain like simweb's
``h{i}.sim``; a page's links: 15 on its own host, 2 on other hosts; half of the answers unique)
goes through ``Intake.on_seen_results`` in deliveries of 8,192 answers, the way the seen-set's
pump hands them over (a ``Delivery``: a page's answers one journal block's run, as a submit per
page makes them; ``--objects``: a list of answer objects instead, as before the nineteenth pass),
with budgets on (the shipped rule and probation); robots (``--robots``:
every host's rules ``Disallow: /private/``, 2% of the links there) and DUST (``--dust``: the shipped
learner behind the shard's gate) off unless asked for.
After warm-up deliveries (and 3,000 seed answers, the trust roots), ``--deliveries`` are timed:
process CPU per answer and per unique answer, and the budget and frontier commits they took.
Nothing is fetched and no thread but the loop runs, so it isolates the loop's admission CPU.
``--peak`` instead traces the timed deliveries' Python allocations (tracemalloc: the CPU numbers
are then not comparable) and reports the highest that what they allocated reached at once: the
admission path's own transient, which sets how far the crawl's live Python objects swing (and so
its arena count). ``--commit-answers N`` commits every N answers judged instead of the shipped
``COMMIT_ANSWERS`` (an experiment: what a smaller batch saves at the peak and costs in commits).

Runs on whichever crawlerd the interpreter imports, so a tree is compared with another by running
this file with each tree's interpreter:

    nice .venv/bin/python bench/intake_bench.py --runs 5 [--robots --dust]
    nice /path/to/other/.venv/bin/python bench/intake_bench.py --runs 5 [--robots --dust]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import shutil
import statistics
import tempfile
import time
import tracemalloc

import numpy as np

from crawlerd import config
from crawlerd._native import drum as native_drum
from crawlerd.fetch.robots import RobotsCache
from crawlerd.fetch.robots.policy import RobotsEntry, RobotsState
from crawlerd.fetch.robots.rules import RobotsRules
from crawlerd.frontier import Frontier
from crawlerd.frontier.budgets import Budgets
from crawlerd.metrics import Metrics
from crawlerd.seen.drum_answers import Delivery, DrumResult, Op, _Part
from crawlerd.shard import intake as intake_module
from crawlerd.shard.dust import DustGate, open_learner
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.intake import Intake, encode_aux
from crawlerd.url.filter import UrlFilter

DELIVERY = 8192
UNIQUE_SHARE = 0.5
SEEDS = 3000
PRIVATE_SHARE = 0.02            # links into /private/, which --robots disallows


class Seen:
    """The seen-set as the intake sees it: ``ack`` ends a delivery."""

    backpressure = False

    def __init__(self) -> None:
        self.acked: asyncio.Event | None = None

    def release(self) -> None:
        pass

    def ack(self, upto: int | None = None) -> None:
        self.acked.set()


def as_delivery(results: list[DrumResult]) -> Delivery:
    """The answers as the seen-set's pump hands them over: one run per page (a submit's journal block)."""
    parts, i = [], 0
    while i < len(results):
        run = results[i:i + 17]
        aux = [r.aux for r in run]
        parts.append(_Part(run[0].seq, Op.CHECK_UPDATE, np.array([r.key for r in run], dtype=np.uint64),
                           np.array([r.unique for r in run], dtype=np.uint8), None, b"".join(aux),
                           np.cumsum([len(a) for a in aux], dtype=np.int64)))
        i += len(run)
    return Delivery(parts, len(results), native_drum.make_results, 0)


def deliveries(rng: random.Random, hosts: int, n: int, depth: int, first_seq: int,
               objects: bool = True) -> list:
    out, seq = [], first_seq
    for _ in range(n):
        one: list[DrumResult] = []
        while len(one) < DELIVERY:
            page_host = rng.randrange(hosts)
            for j in range(17):
                h = page_host if j < 15 else rng.randrange(hosts)
                kind = "private" if rng.random() < PRIVATE_SHARE else "p"
                url = f"http://h{h}.sim/{kind}/{rng.randrange(10**9)}.html"
                one.append(DrumResult(key=rng.getrandbits(63), op=Op.CHECK_UPDATE,
                                      unique=rng.random() < UNIQUE_SHARE, value=None,
                                      aux=encode_aux(depth, 1, 1, url), seq=seq))
                seq += 1
        out.append(one[:DELIVERY] if objects else as_delivery(one[:DELIVERY]))
    return out


async def one_run(args: argparse.Namespace, seed: int) -> dict:
    work = tempfile.mkdtemp(prefix="crawlerd-intake-bench-")
    try:
        cfg = config.load(None, [f"crawl.data_dir={work!r}"])
        bu, buf = cfg.budgets, cfg.storage.lmdb_write_buffer_bytes
        frontier = Frontier(cfg.path("frontier"), map_size_bytes=1 << 32, blocklist=[], sync=False,
                            deferred_level=True, write_buffer_bytes=buf)
        budgets = Budgets(cfg.path("budgets"), base_budget=bu.base_budget, per_inlink=bu.per_inlink,
                          max_budget=bu.max_budget, mode=bu.indegree, vouch_ratio=bu.vouch_ratio, queues=bu.queues,
                          max_spread=bu.max_spread, cache_entries=bu.cache_entries, map_size_bytes=1 << 32,
                          sync=False, write_buffer_bytes=buf, probation=bu.probation)
        seen = Seen()
        robots = None
        if args.robots:
            robots = RobotsCache()
            rules = RobotsRules.parse(b"User-agent: *\nDisallow: /private/\n", "crawlerd", 1 << 16)
            for h in range(args.hosts):
                robots.put(f"http://h{h}.sim", RobotsEntry(rules, 0.0, 1e18, 200, RobotsState.PARSED.value, ""))
        metrics = Metrics()
        intake = Intake(cfg, frontier=frontier, seen=seen, url_filter=UrlFilter(), recrawl=None, metrics=metrics,
                        wake=lambda: None, budgets=budgets, wall=time.time, robots=robots, clock=time.monotonic)
        learner = None
        if args.dust:
            learner = open_learner(cfg)
            gate = DustGate(cfg, learner, frontier=frontier, intake=intake, events=FetchEvents(None, wall=time.time),
                            metrics=metrics)
            intake.admission = gate.admit

        async def deliver(results: list[DrumResult]) -> None:
            seen.acked = asyncio.Event()
            intake.on_seen_results(results)
            await seen.acked.wait()

        rng = random.Random(seed)
        seeds = deliveries(rng, args.hosts, 1, 0, 0)[0][:SEEDS]
        warm = deliveries(rng, args.hosts, args.warmup, 2, SEEDS)
        timed = deliveries(rng, args.hosts, args.deliveries, 2, warm[-1][-1].seq + 100, args.objects)
        await deliver(seeds)
        for d in warm:
            await deliver(d)
        gc.collect()
        gc.freeze()
        commits = (budgets.store.commits, frontier.commits)
        if args.peak:
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
        t0 = time.process_time()
        for d in timed:
            await deliver(d)
        cpu = time.process_time() - t0
        peak = None
        if args.peak:
            peak = tracemalloc.get_traced_memory()[1] - base
            tracemalloc.stop()
        answers = sum(len(d) for d in timed)
        unique = sum(r.unique for d in timed for r in d)
        out = {"us_per_answer": 1e6 * cpu / answers, "us_per_unique": 1e6 * cpu / unique,
               "budget_commits": budgets.store.commits - commits[0], "frontier_commits": frontier.commits - commits[1],
               "deferred": intake.metrics.counters["budget_deferred"], "peak_bytes": peak}
        frontier.close()
        await budgets.close()
        if learner is not None:
            learner.close()
        return out
    finally:
        gc.unfreeze()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=20000)
    p.add_argument("--deliveries", type=int, default=30, help="timed deliveries of 8,192 answers")
    p.add_argument("--warmup", type=int, default=5, help="deliveries before the timed ones")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--robots", action="store_true", help="every host's robots rules checked at admission")
    p.add_argument("--dust", action="store_true", help="the DUST gate at admission (the shipped learner)")
    p.add_argument("--objects", action="store_true",
                   help="deliveries as lists of answer objects (the timed ones; default: as the seen-set hands them over)")
    p.add_argument("--peak", action="store_true",
                   help="trace the timed deliveries' Python allocations and report their peak (CPU not comparable)")
    p.add_argument("--commit-answers", type=int, default=0,
                   help="commit every N answers judged (default: the shipped COMMIT_ANSWERS)")
    args = p.parse_args()
    if args.commit_answers > 0:
        intake_module.COMMIT_ANSWERS = args.commit_answers
    gc.set_threshold(50_000, 20, 100)      # as the daemon sets it (supervisor.py)
    runs = [asyncio.run(one_run(args, seed)) for seed in range(1, args.runs + 1)]
    for r in runs:
        peak = "" if r["peak_bytes"] is None else f", peak of what the deliveries allocated {r['peak_bytes'] / 2**20:.2f} MiB"
        print(f"  {r['us_per_answer']:.2f} us/answer, {r['us_per_unique']:.2f} us/unique answer, "
              f"{r['budget_commits']} budget / {r['frontier_commits']} frontier commits{peak}")
    print(f"median: {statistics.median(r['us_per_answer'] for r in runs):.2f} us/answer, "
          f"{statistics.median(r['us_per_unique'] for r in runs):.2f} us/unique answer "
          f"({args.deliveries} deliveries of {DELIVERY} answers, {args.hosts} hosts, {args.runs} runs"
          f"{', robots' if args.robots else ''}{', dust' if args.dust else ''}, commits every "
          f"{intake_module.COMMIT_ANSWERS} answers)")


if __name__ == "__main__":
    main()
