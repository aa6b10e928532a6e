"""Shards benchmark: the same synthetic web crawled with 1 and 2 (or more) crawl shards, in one run.

    nice -n 10 .venv/bin/python bench/shards_bench.py [--hosts 20000] [--pages 12000] [--runs 2] [--shards 1,2]

Inside a private network namespace with only ``lo`` (re-executes itself under ``unshare -n``, as
bench/e2e_bench.py does, and uses its crawl runner and judge). Every crawl gets a fresh simweb
with the same seed (all hosts are seeds; names resolved by simweb's own DNS server on loopback)
and a fresh data dir; runs alternate the order of the shard counts. Every crawl does the same
work: it stops at ``crawl.max_pages`` (``--pages``; ``--seconds`` is only a cap), so CPU per page
compares equal progress (a crawl further along parses more pages and merges a bigger seen-set
per request than one still reading robots.txt files).

Per crawl: requests answered and pages (server ledger; a "page" excludes robots.txt and sitemaps,
which are most of the first minute's work with 20,000 new hosts), CPU per answered request
by process kind (the family supervisor, the shard loops, the processing workers; from
``last-run.json``), hand-off batches, URLs and bytes per page (every shard's outbox), and the
ledger's politeness verdict. ``--equal-processes P`` gives every crawl P busy processes (loops
plus workers): on a box with fewer cores than processes, CPU time per unit of work inflates with
the number of processes contending (cold caches, context switches), and the workers' CPU per page
(identical work in every crawl) shows how much. The box is small and shared: absolute speed is noise, CPU per page
and ratios against the one-shard crawl of the same run are the result. The projection for a
bigger machine uses the measured CPU per page of one shard loop (single-threaded: one core at
most) and of the workers: a core budget ``C`` is best split as ``shards = C x loop / (loop +
workers)``, and pages/s = ``C / (CPU per page)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import e2e_bench as eb  # noqa: E402  (bench/ is not a package: its sibling's runner and judge)

from crawlerd.simweb import SimWebProcess  # noqa: E402
from crawlerd.simweb.netns import in_private_netns  # noqa: E402

# 20,000 hosts leave a large backlog to drain at the end (their robots leases, DRUM, budgets)
eb.STOP_GRACE_S = 90.0
eb.KILL_GRACE_S = 60.0


def one(args, root: str, run: int, shards: int) -> dict:
    work = os.path.join(root, f"run{run}-shards{shards}")
    os.makedirs(work)
    with SimWebProcess(hosts=args.hosts, seed=args.seed, bind="0.0.0.0", dns_port=0) as sim:
        seeds = os.path.join(work, "seeds.txt")
        with open(seeds, "w") as f:
            f.write("\n".join(sim.seeds) + "\n")
        sets = [f"crawl.shards={shards}", f"crawl.max_pages={args.pages}", *(args.set or [])]
        if args.equal_processes:        # as many busy processes in every crawl: workers make up the rest
            sets.append(f"process.workers={args.equal_processes - shards}")
        run_args = argparse.Namespace(seconds=args.seconds, warmup=min(30.0, args.seconds / 4),
                                      crawlerd_python=sys.executable, py_spy=None)
        r = eb.run_crawlerd(sim, seeds, run_args, work, sets, f"shards{shards}")
    with open(os.path.join(work, "crawlerd-data", "last-run.json")) as f:
        last = json.load(f)
    # per answered request (robots.txt and sitemaps included: 20,000 new hosts start with them)
    pages = max(1, r.judged["requests"])
    wall = last.get("uptime_s") or args.seconds
    cpu = last.get("cpu_by_process_s", {})
    # one shard runs in the supervisor's process ("crawl"); with more, "crawl" is the family itself
    loops = sum(v for k, v in cpu.items() if k.startswith("shard-")) if shards > 1 else cpu.get("crawl", 0.0)
    family = cpu.get("crawl", 0.0) if shards > 1 else 0.0
    workers = sum(v for k, v in cpu.items() if k.startswith("worker-"))
    per_shard = last.get("shards", [])
    ho = [s.get("handoff", {}) for s in per_shard]
    return {"shards": shards, "rc": r.rc, "pages": r.judged["pages"], "pages_per_s": r.judged["pages"] / wall,
            "requests": r.judged["requests"], "requests_per_s": r.judged["requests"] / wall, "wall_s": wall,
            "politeness": r.judged["politeness"], "robots": r.judged["robots"],
            "cpu_us_per_page": 1e6 * (loops + family + workers) / pages,
            "loop_us_per_page": 1e6 * loops / pages, "family_us_per_page": 1e6 * family / pages,
            "worker_us_per_page": 1e6 * workers / pages,
            "handoff_batches_per_page": sum(h.get("batches_sent", 0) for h in ho) / pages,
            "handoff_urls_per_page": sum(h.get("records_sent", 0) for h in ho) / pages,
            "handoff_bytes_per_page": sum(h.get("bytes_sent", 0) for h in ho) / pages,
            "pages_by_shard": [s.get("pages", 0) for s in per_shard], "warc_valid": r.warc.get("valid"),
            "peak_rss_mib": r.peak_rss_kib / 1024, "stderr_tail": r.extra.get("stderr_tail", "")}


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def bench(args) -> dict:
    counts = [int(x) for x in args.shards.split(",")]
    root = tempfile.mkdtemp(prefix="crawlerd-shards-bench-")
    results: dict[int, list[dict]] = {n: [] for n in counts}
    for run in range(args.runs):
        order = counts if run % 2 == 0 else counts[::-1]
        for n in order:
            print(f"run {run + 1}/{args.runs}: {n} shard(s), {args.hosts} hosts, {args.pages} pages", flush=True)
            res = one(args, root, run, n)
            results[n].append(res)
            print(f"  requests {res['requests']} ({res['requests_per_s']:.1f}/s), pages {res['pages']}  cpu {res['cpu_us_per_page']:.0f} us/page  "
                  f"hand-off {res['handoff_urls_per_page']:.2f} URLs/page  politeness {res['politeness']}",
                  flush=True)
    base = med(results[counts[0]], "cpu_us_per_page")
    base_rate = med(results[counts[0]], "requests_per_s")
    print()
    print("per answered request (\"req\"):")
    print(f"| shards | req/s | vs {counts[0]} | pages/s | CPU us/req | vs {counts[0]} | loops us/req | workers us/req "
          f"| family us/req | hand-off batches/req | URLs/req | bytes/req | violations |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for n in counts:
        rows = results[n]
        s = {k: med(rows, k) for k in ("requests_per_s", "pages_per_s", "cpu_us_per_page", "loop_us_per_page", "worker_us_per_page",
                                        "family_us_per_page", "handoff_batches_per_page", "handoff_urls_per_page",
                                        "handoff_bytes_per_page")}
        s["violations"] = sum(sum(r["politeness"].values()) + sum(r["robots"].values()) for r in rows)
        summary[n] = s
        print(f"| {n} | {s['requests_per_s']:.1f} | {s['requests_per_s'] / base_rate:.2f} | {s['pages_per_s']:.1f} | "
              f"{s['cpu_us_per_page']:.0f} | "
              f"{s['cpu_us_per_page'] / base:.2f} | {s['loop_us_per_page']:.0f} | {s['worker_us_per_page']:.0f} | "
              f"{s['family_us_per_page']:.0f} | {s['handoff_batches_per_page']:.3f} | "
              f"{s['handoff_urls_per_page']:.2f} | {s['handoff_bytes_per_page']:.0f} | {s['violations']} |")
    one_shard = summary[counts[0]]
    loop, work = one_shard["loop_us_per_page"], one_shard["worker_us_per_page"]
    multi = summary[counts[-1]]
    print()
    for cores in (args.project_cores, 64):
        n = max(1, round(cores * loop / (loop + work))) if loop + work else 1
        rate = cores * 1e6 / multi["cpu_us_per_page"] if multi["cpu_us_per_page"] else 0
        print(f"projection, {cores} cores: {n} shards (one loop per {(loop + work) / loop:.1f} cores), "
              f"~{rate:.0f} requests/s if CPU-bound at {multi['cpu_us_per_page']:.0f} us/page "
              f"(a shard loop alone tops out near {1e6 / loop:.0f} requests/s)")
    out = {"hosts": args.hosts, "seconds": args.seconds, "runs": args.runs, "summary": summary,
           "results": results, "code": eb.code_version()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--hosts", type=int, default=20000, help="synthetic hosts (all are seeds)")
    p.add_argument("--pages", type=int, default=12000, help="crawl.max_pages: every crawl stops there")
    p.add_argument("--seconds", type=float, default=900.0, help="longest crawl (a cap; --pages ends it)")
    p.add_argument("--runs", type=int, default=3, help="repeat; the table shows medians")
    p.add_argument("--shards", default="1,2", help="shard counts to compare (the first is the baseline)")
    p.add_argument("--seed", type=int, default=1, help="simweb seed")
    p.add_argument("--equal-processes", type=int, default=0, metavar="P",
                   help="give every crawl P busy processes (shard loops + workers), so that a small box is "
                        "as oversubscribed with one shard as with several (0: workers by default)")
    p.add_argument("--project-cores", type=int, default=32, help="cores of the projected machine")
    p.add_argument("-s", "--set", action="append", metavar="SECTION.KEY=VALUE", help="extra crawlerd override")
    p.add_argument("--json", metavar="FILE", help="also write all results as JSON")
    p.add_argument("--inside-netns", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.hosts < 1 or args.seconds <= 0 or args.runs < 1:
        p.error("need --hosts >= 1, --seconds > 0, --runs >= 1")
    if not in_private_netns():
        if args.inside_netns:
            print("shards_bench: not in a private network namespace after unshare; refusing to run", file=sys.stderr)
            return 2
        return eb.reexec_in_netns(argv, os.path.abspath(__file__))
    bench(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
