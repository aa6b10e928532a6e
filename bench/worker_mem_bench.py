"""A processing worker's private memory against the pages it processed, without a crawl.

One worker of a :class:`crawlerd.process.pool.WorkerPool` (the real worker process: body ring,
batches, its own WARC writer, its own first captures, exact duplicates looked up by the worker, a
near-duplicate question per batch answered "none") is fed ``--pages`` pages of simweb's web
profile (what the soak crawls: varied sizes and link forms, 30 % gzip) as fast as it takes them.
Each page gets its own URL; an identity page also gets its own bytes (a comment appended), so its
digest is new and the worker's own-captures LRU churns as in a crawl; gzip pages repeat (revisits).
The worker logs its memory every ``--every`` seconds (``CRAWLERD_WORKER_MEMLOG_S``,
``crawlerd.memtrace.MemLog``): RssAnon, Python's arenas and allocated bytes, glibc's heap in use,
the collector's counts. After the warm-up (``--warmup`` of the pages) each is fitted against pages
(least squares, B/page), the figure ``tests/e2e/test_soak.py`` bounds for the workers (≤ 2 B/page).

Run (niced, outside the bench lock: it is one worker and a feeder, no network):

    nice -n 10 .venv/bin/python bench/worker_mem_bench.py [--pages 200000] [--every 2] [--json OUT]

``CRAWLERD_TRACEMALLOC_S=N`` in the environment also makes the worker write tracemalloc snapshots
to ``--dir``/worker-*/ (compare with ``python -m crawlerd.memtrace --series DIR``); slow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from process_bench import simweb_results  # noqa: E402 (the bench directory, put on the path above)

from crawlerd.memtrace import MEMLOG_ENV  # noqa: E402
from crawlerd.process.pool import WorkerPool  # noqa: E402
from crawlerd.records import FetchResult  # noqa: E402
from crawlerd.store.digest_set import DigestSet  # noqa: E402

FIELDS = ("rss_anon", "arenas", "py_allocated", "py_blocks", "c_in_use")


def variant(res: FetchResult, k: int) -> FetchResult:
    """``res`` under its own URL; an identity body with its own bytes (a new digest)."""
    body, headers = res.body, res.headers
    if not any(name.lower() == "content-encoding" for name, _ in headers):
        body = body + b"<!-- %d -->" % k
        headers = [(n, str(len(body)) if n.lower() == "content-length" else v) for n, v in headers]
    head = "HTTP/1.1 200 OK\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
    return FetchResult(url=f"{res.url}?v={k}", outcome=res.outcome, status=200, ip=res.ip,
                       started_at=res.started_at + k, elapsed_s=res.elapsed_s, request_head=res.request_head,
                       response_head=head.encode(), body=body, headers=headers)


def fit(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` on ``xs``."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else None


async def feed(pool: WorkerPool, pages: list[FetchResult], total: int, window: int) -> int:
    done = 0
    while done < total:
        n = min(window, total - done)
        out = await asyncio.gather(*(pool.process(variant(pages[(done + i) % len(pages)], done + i), lookup=True)
                                     for i in range(n)))
        errors = [pr for pr in out if pr.error]
        if errors:
            raise RuntimeError(f"a page failed: {errors[0].error}")
        done += n
    return done


def run(args) -> dict:
    d = args.dir or tempfile.mkdtemp(prefix="worker-mem-")
    DigestSet(os.path.join(d, "digests")).close()       # an empty digest set: the worker's read-only view
    init = {"warc_dir": os.path.join(d, "warc"), "index_dir": os.path.join(d, "index"), "prefix": "bench",
            "digest_dir": os.path.join(d, "digests"), "captures_bytes": args.captures_bytes,
            "segment_max_bytes": args.segment_max_bytes, "shard": "0", "user_agent": "crawlerd-bench/0.1",
            "agent_token": "crawlerd", "max_decoded_bytes": 10 << 20, "max_links": 5000,
            "trim_interval_s": 10.0, "memtrace_dir": d}
    os.environ[MEMLOG_ENV] = str(args.every)        # the worker inherits it
    pages = simweb_results(args.distinct)

    async def main() -> float:
        pool = WorkerPool(1, init, jobs_per_worker=32, near_duplicate=lambda simhash, url: "")
        await pool.start()
        t0 = time.monotonic()
        try:
            await feed(pool, pages, args.pages, args.window)
        finally:
            await pool.close()
        return time.monotonic() - t0

    seconds = asyncio.run(main())
    (log,) = [os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jsonl")]
    with open(log) as f:
        lines = [json.loads(x) for x in f]
    fitted = [x for x in lines if x["pages"] >= args.warmup * args.pages]
    scale = {"arenas": 1 << 20}      # an arena is 1 MiB: its count's slope in bytes
    slopes = {k: fit([x["pages"] for x in fitted if x[k] is not None],
                     [x[k] * scale.get(k, 1) for x in fitted if x[k] is not None]) for k in FIELDS}
    steps = [(b["pages"], a["arenas"], b["arenas"]) for a, b in zip(lines, lines[1:], strict=False) if b["arenas"] != a["arenas"]]
    return {"pages": args.pages, "seconds": round(seconds, 1), "dir": d, "lines": lines, "arena_steps": steps,
            "fit_from_pages": fitted[0]["pages"] if fitted else None, "slopes_b_per_page": slopes}


def report(r: dict) -> list[str]:
    out = [f"{r['pages']} pages in {r['seconds']} s; fit from {r['fit_from_pages']} pages ({r['dir']})",
           f"{'pages':>8} {'RssAnon MiB':>11} {'arenas':>6} {'py alloc MiB':>12} {'py blocks':>9} "
           f"{'C in use MiB':>12} {'gc collections':>16} {'gc collected':>18}"]
    lines = r["lines"]
    step = max(1, len(lines) // 25)
    for x in lines[::step] + ([lines[-1]] if (len(lines) - 1) % step else []):
        out.append(f"{x['pages']:8d} {x['rss_anon'] / 2**20:11.2f} {x['arenas']:6d} {x['py_allocated'] / 2**20:12.2f} "
                   f"{x['py_blocks']:9d} {(x['c_in_use'] or 0) / 2**20:12.2f} {str(x['gc_collections']):>16} "
                   f"{str(x['gc_collected']):>18}")
    out.append("arena count changes (by the line's pages): "
               + (", ".join(f"{a}->{b} at {p}" for p, a, b in r["arena_steps"]) or "none"))
    out.append("slopes after the warm-up, B/page (arenas x 1 MiB): " + ", ".join(
        f"{k} {v:+.2f}" if v is not None else f"{k} -" for k, v in r["slopes_b_per_page"].items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=200_000, help="pages fed to the worker")
    ap.add_argument("--distinct", type=int, default=3000, help="simweb pages generated (then varied)")
    ap.add_argument("--every", type=float, default=2.0, help="seconds between the worker's memory lines")
    ap.add_argument("--warmup", type=float, default=0.3, help="fraction of the pages before the fit")
    ap.add_argument("--window", type=int, default=256, help="pages in flight from the feeder at once")
    ap.add_argument("--captures-bytes", type=int, default=1 << 20, help="dedup.worker_captures_bytes (soak: 1 MiB)")
    ap.add_argument("--segment-max-bytes", type=int, default=1 << 30, help="warc.segment_max_bytes")
    ap.add_argument("--dir", default="", help="working directory (default: a new temp dir)")
    ap.add_argument("--json", default="", help="write the lines and slopes here")
    args = ap.parse_args()
    r = run(args)
    print("\n".join(report(r)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main()
