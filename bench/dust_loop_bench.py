"""DUST on the crawl loop: CPU of the learner's three touch points, per URL admitted and per page
observed, on a synthetic stream shaped like the e2e crawl (20,000 hosts, /p/N.html pages, a few
session-id and calendar links), without a crawl.

    .venv/bin/python bench/dust_loop_bench.py [--hosts 20000] [--pages 60000] [--json OUT]
    /work/wt/base-integ/.venv/bin/python bench/dust_loop_bench.py ...     # another tree's crawlerd

Per step: a slice of ``--slice`` new URLs admitted (``admit_batch``: the seen-set's fresh URLs, the
intake's slice), then ``--slice / 5`` pages observed (``observe``: a 200 answer archived, its digest
random, one page in ten a copy of another page of its host), and every ``--commit-pages`` pages
the changed hosts written in slices of 128 and committed (``write_hosts`` + ``commit``, as
``DustGate.commit_sliced``; no writer thread: the commit's own cost is reported apart). Process CPU
time (``time.process_time``) per phase; the same seed gives the same stream to any tree.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time

from crawlerd.frontier.dust import DustLearner
from crawlerd.url.canonical import fingerprint


def url_stream(rng: random.Random, hosts: int):
    while True:
        h = int(rng.paretovariate(1.2)) % hosts if rng.random() < 0.5 else rng.randrange(hosts)
        base = f"http://h{h}.example:8080"
        r = rng.random()
        if r < 0.04:
            yield f"{base}/p/{rng.randrange(300)}.html?sid={rng.getrandbits(64):016x}", h
        elif r < 0.06:
            yield f"{base}/cal?y={2020 + rng.randrange(10)}&m={1 + rng.randrange(12)}", h
        else:
            yield f"{base}/p/{rng.randrange(300)}.html", h


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=20000)
    p.add_argument("--pages", type=int, default=60000)
    p.add_argument("--slice", type=int, default=250, help="URLs admitted per step")
    p.add_argument("--commit-pages", type=int, default=1000, help="pages observed between commits")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args()
    rng = random.Random(a.seed)
    stream = url_stream(rng, a.hosts)
    cpu = {"admit": 0.0, "observe": 0.0, "write": 0.0, "commit": 0.0}
    admitted = observed = 0
    with tempfile.TemporaryDirectory() as d:
        learner = DustLearner(d + "/dust", sync=False, clock=lambda: 1.0e9)
        seen: set[str] = set()
        pages: list[tuple[str, str, int]] = []
        since_commit = 0
        while observed < a.pages:
            fresh = []
            while len(fresh) < a.slice:
                url, h = next(stream)
                if url not in seen:
                    seen.add(url)
                    fresh.append((url, f"h{h}.example:8080"))
            urls = [u for u, _ in fresh]
            fps = [fingerprint(u) for u in urls]
            t = time.process_time()
            ds = learner.admit_batch(urls, fps, [1] * len(urls), [0] * len(urls), [h for _, h in fresh])
            cpu["admit"] += time.process_time() - t
            admitted += len(urls)
            pages += [(u, h, fp) for (u, h), fp, dd in zip(fresh, fps, ds, strict=True) if dd.action != "skip"]
            batch = []
            for _ in range(min(a.slice // 5, len(pages))):     # pages answered in random order
                i = rng.randrange(len(pages))
                pages[i], pages[-1] = pages[-1], pages[i]
                batch.append(pages.pop())
            for url, host, fp in batch:
                digest = (fp if rng.random() < 0.1 else rng.getrandbits(160)).to_bytes(20, "big")
                simhash = rng.getrandbits(64)
                t = time.process_time()
                learner.observe(url, fp, host, digest, simhash, "")
                cpu["observe"] += time.process_time() - t
            observed += len(batch)
            since_commit += len(batch)
            if since_commit >= a.commit_pages:
                since_commit = 0
                t = time.process_time()
                hosts = learner.dirty_hosts()
                for i in range(0, len(hosts), 128):
                    learner.write_hosts(hosts[i:i + 128])
                t2 = time.process_time()
                learner.commit()
                cpu["write"] += t2 - t
                cpu["commit"] += time.process_time() - t2
        learner.close()
    out = {"admitted": admitted, "observed": observed,
           "admit_us_per_url": 1e6 * cpu["admit"] / admitted,
           "observe_us_per_page": 1e6 * cpu["observe"] / observed,
           "write_us_per_page": 1e6 * cpu["write"] / observed,
           "commit_us_per_page": 1e6 * cpu["commit"] / observed}
    out["loop_us_per_page"] = (1e6 * (cpu["admit"] + cpu["observe"] + cpu["write"]) / observed)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
