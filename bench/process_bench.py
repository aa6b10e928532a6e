"""Processing benchmark: the whole worker path on 20 KB pages with 50 links, and its pieces.

1. Worker path, in process: ``PageProcessor.process`` + a WARC flush per 8 pages (a batch)
   (decode, parse, links, digest, simhash, WARC request/response records), CPU
   microseconds per page, for identity pages, for gzip + chunked pages and for the pages
   simweb serves the e2e bench (web profile: varied sizes and link forms, 30% gzip).
2. Worker path through the pool: one worker process fed over its socketpair;
   CPU per page of the worker (from /proc) and of the crawl process (pickling,
   dispatch), so the IPC overhead is visible.
3. Pieces, each on the same pages: decode (gzip + chunked), extract (lexbor
   parse, hrefs, visible text), links_from_page per link (normalise and
   fingerprint), payload digest (SHA-1), simhash against the ``simhash`` PyPI
   package (same 3-word shingles as features, as bench/simhash_bench.py), WARC
   write; the near-duplicate query on a SimhashIndex of --fingerprints pairs
   and NearDuplicates.check_and_add (query + LMDB) on a store of --store docs.

Every figure is the median over --runs runs of CPU time (process_time) per item;
ratios are against the target of the issue and, for simhash, the peer measured
in the same run.

With ``--baseline DIR`` (another source tree of crawlerd, e.g. ``git archive REV | tar -x -C DIR``
plus the compiled ``crawlerd/_native/*.so``) the bench instead runs itself --rounds times
for each tree, alternating, each run in a fresh process, and prints per row the median
of each tree and their ratio: a before/after measured under the same load.

Run:  nice -n 10 .venv/bin/python bench/process_bench.py [--runs 5] [--pages 200] [--fingerprints 10000000]
      [--skip-near] [--baseline DIR [--rounds 3]]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from crawlerd._native import simhash_ref
from crawlerd._native.simhash import simhash
from crawlerd.dedup.near import NearDuplicates
from crawlerd.dedup.simhash_index import SimhashIndex
from crawlerd.fetch.codec import decode_body
from crawlerd.outcome import Outcome
from crawlerd.process.html import extract
from crawlerd.process.links import links_from_page
from crawlerd.process.pool import WorkerPool
from crawlerd.process.worker import PageProcessor
from crawlerd.records import FetchResult
from crawlerd.store.encoding import payload_digest
from crawlerd.store.warc import WarcWriter

PAGE_BYTES = 20_000
LINKS = 50
TARGETS_US = {"worker path": 500.0, "per link": 3.0, "simhash": 60.0, "near query": 20.0}


# -- pages --------------------------------------------------------------------------------------
def _vocab(rng: random.Random) -> tuple[list[str], list[float]]:
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10)))
             for _ in range(20000)]
    return vocab, [1.0 / (i + 1) for i in range(len(vocab))]


def _hrefs(rng: random.Random, i: int) -> list[str]:
    """50 links in the forms pages use: navigation, relative, dot segments, absolute, other hosts, junk."""
    out = [f"/section/{s}/" for s in ("news", "sport", "tech", "culture", "about", "contact")]
    out += [f"/news/2024/{rng.randrange(12):02d}/story-{rng.randrange(10**5)}.html" for _ in range(16)]
    out += [f"related-{rng.randrange(1000)}.html" for _ in range(8)]
    out += ["../archive/index.html", "./gallery/photo-1.jpg", f"?page={i % 7 + 2}", "#comments"]
    out += [f"https://www.site{i % 50}.test/video?id={rng.randrange(10**4)}&autoplay=0" for _ in range(5)]
    out += [f"https://host{rng.randrange(5000)}.example.org/p/{rng.randrange(10**6)}" for _ in range(6)]
    out += ["//cdn.example.net/static/app.js", "https://Shop.Example.com:443/Cart", "/search?q=caf%C3%A9+cr%C3%A8me",
            "mailto:desk@example.com", "javascript:void(0)"]
    return out[:LINKS]


def page_html(i: int, vocab: list[str], weights: list[float]) -> bytes:
    rng = random.Random(i)
    links = "".join(f'<li><a href="{h}">{rng.choice(vocab)} {rng.choice(vocab)}</a></li>\n'
                    for h in _hrefs(rng, i))
    head = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Story {i}</title>'
            f'<meta name="viewport" content="width=device-width"><link rel="stylesheet" href="/s.css">'
            f'<script>window.dataLayer=[];</script></head><body><nav><ul>\n{links}</ul></nav><main>'
            f"<h1>Story {i}</h1>\n")
    paras = []
    size = len(head) + 40
    while size < PAGE_BYTES:
        words = rng.choices(vocab, weights, k=rng.randint(40, 120))
        p = "<p>" + " ".join(words).capitalize() + ".</p>\n"
        paras.append(p)
        size += len(p)
    return (head + "".join(paras) + "</main></body></html>\n").encode()


def chunked(body: bytes, size: int = 8192) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                    for i in range(0, len(body), size)) + b"0\r\n\r\n"


def fetch_result(i: int, body: bytes, *, coded: bool) -> FetchResult:
    url = f"https://www.site{i % 50}.test/news/2024/05/story-{i}.html"
    headers = [("Content-Type", "text/html; charset=utf-8"), ("Server", "bench")]
    if coded:
        body = chunked(gzip.compress(body, 6, mtime=0))
        headers += [("Content-Encoding", "gzip"), ("Transfer-Encoding", "chunked")]
    else:
        headers.append(("Content-Length", str(len(body))))
    head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    req = (f"GET /news/2024/05/story-{i}.html HTTP/1.1\r\nHost: www.site{i % 50}.test\r\n"
           f"User-Agent: crawlerd-bench/0.1\r\nAccept-Encoding: gzip\r\n\r\n")
    return FetchResult(url=url, outcome=Outcome.OK, status=200, ip="127.0.0.1", started_at=1.7e9 + i,
                       elapsed_s=0.05, request_head=req.encode(), response_head=head.encode(), body=body,
                       headers=headers)


def simweb_results(n: int) -> list[FetchResult]:
    """``n`` HTML answers of simweb's web profile (what the e2e bench crawls): sizes and link
    counts as drawn there, 30% of hosts gzip, the link forms of simweb.pages; ~5% home pages."""
    from crawlerd.simweb import site as S
    from crawlerd.simweb.handler import Handler
    site = S.Site(n_hosts=2000, seed=7, profile=S.PROFILE_WEB)
    handler = Handler(site, 80)
    hosts = [h for h in site.hosts[:site.n_hosts] if h.role == S.ROLE_NORMAL]
    out: list[FetchResult] = []
    i = 0
    while len(out) < n:
        host = hosts[(i * 7) % len(hosts)]
        path = "/" if i % 20 == 0 else f"/p/{(i * 7919) % max(host.pages, 1)}.html"
        i += 1
        _, reply = handler.handle(host.name, path, accept_gzip=True)
        if reply.status != 200 or not reply.content_type.startswith("text/html"):
            continue
        headers = [("Content-Type", reply.content_type), ("Content-Length", str(len(reply.body))),
                   *reply.headers]
        head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
        req = (f"GET {path} HTTP/1.1\r\nHost: {host.name}\r\nUser-Agent: crawlerd-bench/0.1\r\n"
               f"Accept-Encoding: gzip\r\n\r\n")
        out.append(FetchResult(url=f"http://{host.name}{path}", outcome=Outcome.OK, status=200, ip="127.0.0.2",
                               started_at=1.7e9 + i, elapsed_s=0.01, request_head=req.encode(),
                               response_head=head.encode(), body=reply.body, headers=headers))
    return out


# -- measuring ----------------------------------------------------------------------------------
def per_item_us(fn, items, runs: int, per: int | None = None) -> float:
    """Median over ``runs`` passes of CPU microseconds per item (or per ``per`` units in all)."""
    samples = []
    for _ in range(runs):
        gc.collect()
        t0 = time.process_time()
        for x in items:
            fn(x)
        samples.append((time.process_time() - t0) / (per or len(items)) * 1e6)
    return statistics.median(samples)


def worker_path(results: list[FetchResult], runs: int, tmp: str, min_links: int = 40) -> float:
    samples = []
    for r in range(runs):
        warc = WarcWriter(f"{tmp}/inproc-{r}", segment_max_bytes=1 << 30)
        proc = PageProcessor(warc, agent_token="crawlerd", max_decoded_bytes=10 << 20, max_links=5000)
        gc.collect()
        t0 = time.process_time()
        for i, res in enumerate(results):
            pr = proc.process(res, prior=None)
            if i % 8 == 7:
                warc.flush()    # as the worker loop does before answering a batch (8 jobs in flight)
        samples.append((time.process_time() - t0) / len(results) * 1e6)
        assert pr.outcome is Outcome.OK and len(pr.links) >= min_links, pr
        warc.close()
    return statistics.median(samples)


def cpu_ns(pid: int) -> int:
    """CPU time of a process in ns from /proc/PID/schedstat (exact; /proc/PID/stat counts 10 ms ticks)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def pool_path(results: list[FetchResult], runs: int, tmp: str) -> tuple[float, float]:
    """(worker CPU us/page, crawl-process CPU us/page) through a one-worker pool."""
    init = {"warc_dir": f"{tmp}/pool-warc", "index_dir": f"{tmp}/pool-index", "prefix": "bench",
            "segment_max_bytes": 1 << 30, "shard": "0", "user_agent": "crawlerd-bench/0.1",
            "agent_token": "crawlerd", "max_decoded_bytes": 10 << 20, "max_links": 5000}

    async def run() -> tuple[list[float], list[float]]:
        pool = WorkerPool(1, init, jobs_per_worker=8)
        await pool.start()
        worker, crawl = [], []
        try:
            await asyncio.gather(*(pool.process(r) for r in results[:20]))     # imports, caches
            for _ in range(runs):
                (pid,) = pool.pids()
                w0, c0 = cpu_ns(pid), time.process_time()
                for _ in range(3):
                    out = await asyncio.gather(*(pool.process(r) for r in results))
                w1, c1 = cpu_ns(pid), time.process_time()
                assert all(pr.outcome is Outcome.OK for pr in out)
                worker.append((w1 - w0) / 1e3 / (3 * len(results)))
                crawl.append((c1 - c0) / (3 * len(results)) * 1e6)
        finally:
            await pool.close()
        return worker, crawl

    worker, crawl = asyncio.run(run())
    return statistics.median(worker), statistics.median(crawl)


def row(name: str, us: float, unit: str = "page", target: float | None = None, note: str = "") -> None:
    verdict = ""
    if target is not None:
        verdict = f"target {target:6.1f}  {'ok' if us <= target else 'OVER'} ({us / target:.2f}x)"
    print(f"  {name:44s} {us:9.2f} us/{unit:5s} {verdict} {note}")


_ROW = re.compile(r"^  (\S.*?)\s+(-?[\d.]+) us/(\w+)")


def compare(baseline: str, rounds: int, child_args: list[str]) -> None:
    """Alternate runs of this bench on ``baseline`` and on this checkout; print medians and ratios."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"baseline": os.path.abspath(baseline), "current": here}
    samples: dict[str, dict[str, list[float]]] = {}
    units: dict[str, str] = {}
    for r in range(rounds):
        for label, tree in trees.items():
            # cwd = the tree: pool workers start with "python -m", which imports from the cwd first
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *child_args], cwd=tree, env=env,
                                 capture_output=True, text=True, check=True, timeout=1800).stdout
            for line in out.splitlines():
                m = _ROW.match(line)
                if m:
                    samples.setdefault(m.group(1), {}).setdefault(label, []).append(float(m.group(2)))
                    units[m.group(1)] = m.group(3)
            print(f"round {r + 1}/{rounds} {label} done", file=sys.stderr)
    print(f"medians of {rounds} alternating runs per tree; baseline {trees['baseline']}")
    print(f"  {'':44s} {'baseline':>10s} {'current':>10s}   current/baseline")
    for name, by in samples.items():
        if len(by) < 2:
            continue
        b, c = statistics.median(by["baseline"]), statistics.median(by["current"])
        print(f"  {name:44s} {b:10.2f} {c:10.2f}   {c / b:5.2f}   us/{units[name]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--fingerprints", type=int, default=10_000_000, help="pairs in the index for the query")
    ap.add_argument("--store", type=int, default=200_000, help="docs in NearDuplicates for check_and_add")
    ap.add_argument("--skip-near", action="store_true", help="worker path and pieces only (no index build)")
    ap.add_argument("--baseline", metavar="DIR", help="source tree to compare against (see the module doc)")
    ap.add_argument("--rounds", type=int, default=3, help="with --baseline: runs per tree")
    args = ap.parse_args()
    runs, n = args.runs, args.pages
    if args.baseline:
        child = ["--runs", str(runs), "--pages", str(n), "--fingerprints", str(args.fingerprints),
                 "--store", str(args.store)] + (["--skip-near"] if args.skip_near else [])
        compare(args.baseline, args.rounds, child)
        return

    vocab, weights = _vocab(random.Random(1))
    bodies = [page_html(i, vocab, weights) for i in range(n)]
    plain = [fetch_result(i, b, coded=False) for i, b in enumerate(bodies)]
    coded = [fetch_result(i, b, coded=True) for i, b in enumerate(bodies)]
    infos = [extract(b, r.url, agent_token="crawlerd", max_links=5000) for b, r in zip(bodies, plain, strict=True)]
    n_links = sum(len(info.links) for info in infos)
    texts = [info.text for info in infos]
    print(f"{n} pages, {sum(map(len, bodies)) / n / 1000:.1f} KB HTML, {n_links / n:.0f} links, "
          f"{sum(map(len, texts)) / n / 1000:.1f} K chars of text each; medians of {runs} runs, CPU time")

    with tempfile.TemporaryDirectory(prefix="process-bench-") as tmp:
        print("worker path (decode, parse, links, digest, simhash, WARC + flush per batch):")
        row("in process, identity body", worker_path(plain, runs, tmp), target=TARGETS_US["worker path"])
        row("in process, gzip + chunked body", worker_path(coded, runs, tmp), target=TARGETS_US["worker path"])
        web = simweb_results(n)
        row("in process, simweb web-profile pages", worker_path(web, runs, tmp, min_links=1), target=TARGETS_US["worker path"],
            note=f"({sum(len(r.body) for r in web) / n / 1000:.1f} KB as sent)")
        w_us, c_us = pool_path(coded, runs, tmp)
        row("pool, 1 worker: worker process", w_us, target=TARGETS_US["worker path"])
        row("pool, 1 worker: crawl process (IPC)", c_us)

        print("pieces:")
        row("decode gzip + chunked (codec.decode_body)",
            per_item_us(lambda r: decode_body(r.body, chunked=True, content_encoding="gzip", max_bytes=10 << 20),
                        coded, runs))
        row("extract (lexbor parse, hrefs, text)",
            per_item_us(lambda b: extract(b, "https://www.site1.test/a/b.html", agent_token="crawlerd",
                                          max_links=5000), bodies, runs))
        pairs = [(info.links, info.base_url) for info in infos]
        row("links_from_page (normalise + fingerprint)",
            per_item_us(lambda p: links_from_page(*p), pairs, runs, per=n_links), unit="link",
            target=TARGETS_US["per link"])
        row("payload digest (SHA-1 + base32)", per_item_us(payload_digest, bodies, runs))
        sim_us = per_item_us(simhash, texts, runs)
        try:
            from simhash import Simhash
        except ImportError:
            peer_note = "(simhash PyPI package not installed: no peer)"
        else:
            peer_us = per_item_us(lambda t: Simhash(simhash_ref.shingles(t)).value, texts[:5], max(3, runs // 2))
            peer_note = f"peer simhash (PyPI) {peer_us:.0f} us: {peer_us / sim_us:.0f}x slower (target >= 50x)"
        row("simhash (native)", sim_us, target=TARGETS_US["simhash"], note=peer_note)
        warc = WarcWriter(f"{tmp}/pieces", segment_max_bytes=1 << 30)
        row("WARC request + response (write_fetch)",
            per_item_us(lambda r: warc.write_fetch(url=r.url, fetched_at=r.started_at, ip=r.ip,
                                                   request_head=r.request_head, response_head=r.response_head,
                                                   body=r.body), coded, runs))
        digests = {id(r): payload_digest(r.body) for r in plain}
        row("WARC write_fetch, identity body, digest given",
            per_item_us(lambda r: warc.write_fetch(url=r.url, fetched_at=r.started_at, ip=r.ip,
                                                   request_head=r.request_head, response_head=r.response_head,
                                                   body=r.body, payload_digest=digests[id(r)]), plain, runs))
        warc.close()
        if args.skip_near:
            return

        print("near duplicates (crawl process):")
        rng = np.random.default_rng(5)
        fps = rng.integers(0, 2**64, size=args.fingerprints, dtype=np.uint64)
        index = SimhashIndex()
        index.add_many(fps, np.arange(args.fingerprints, dtype=np.int64))
        qrng = random.Random(6)
        near = []
        for i in qrng.sample(range(args.fingerprints), 20_000):
            q = int(fps[i])
            for b in qrng.sample(range(64), qrng.randrange(0, 4)):
                q ^= 1 << b
            near.append(q)
        rand = [qrng.getrandbits(64) for _ in range(20_000)]
        row(f"SimhashIndex.query k=3, {args.fingerprints:,} stored, near",
            per_item_us(index.query, near, runs), unit="query", target=TARGETS_US["near query"])
        row(f"SimhashIndex.query k=3, {args.fingerprints:,} stored, random",
            per_item_us(index.query, rand, runs), unit="query", target=TARGETS_US["near query"])
        del index, fps
        with NearDuplicates(f"{tmp}/dedup", map_size_bytes=1 << 30) as nd:
            srng = random.Random(7)
            t0 = time.process_time()
            for i in range(args.store):
                nd.check_and_add(srng.getrandbits(64), f"https://h{i % 1000}.test/p/{i}", f"https://h{i % 1000}.test")
            fill_us = (time.process_time() - t0) / args.store * 1e6
            probes = [(srng.getrandbits(64), i) for i in range(20_000)]
            samples = []
            for r in range(runs):   # fresh fingerprints each run: every probe is a stored original
                probes = [(srng.getrandbits(64), i) for i in range(20_000)]
                t0 = time.process_time()
                for fp, i in probes:
                    nd.check_and_add(fp, f"https://x{r}.test/p/{i}", "https://x.test")
                samples.append((time.process_time() - t0) / len(probes) * 1e6)
            row(f"NearDuplicates.check_and_add, {args.store:,} docs (new page)", statistics.median(samples),
                unit="page", note=f"(fill: {fill_us:.2f} us/page)")
            dups = [(fp ^ 1, i) for fp, i in probes]
            row("NearDuplicates.check_and_add (near duplicate)",
                per_item_us(lambda p: nd.check_and_add(p[0], f"https://y.test/{p[1]}", "https://y.test"), dups,
                            runs), unit="page")


if __name__ == "__main__":
    main()
