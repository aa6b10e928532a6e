"""DUST on the crawl loop: CPU of the learner's three touch points, per URL admitted and per page
observed, on a synthetic stream shaped like the e2e crawl (20,000 hosts, /p/N.html pages, a few
session-id and calendar links), without a crawl.

    .venv/bin/python bench/dust_loop_bench.py [--hosts 20000] [--pages 60000] [--json OUT]
    /work/wt/base-integ/.venv/bin/python bench/dust_loop_bench.py ...     # another tree's crawlerd

Per step: a slice of ``--slice`` new URLs admitted (``admit_batch``: the seen-set's fresh URLs, the
intake's slice), then ``--slice / 5`` pages observed (``observe``: a 200 answer archived; a URL with
a session id shows the page without it, so ``?sid`` rules are learned and applied), and every ``--commit-pages`` pages
the changed hosts written in slices of 128 and committed (``write_hosts`` + ``commit``, as
``DustGate.commit_sliced``), the store's commits on a writer thread as in the shard (``--no-writer``:
in the loop's own transaction). The loop thread's CPU time (``time.thread_time``) per phase; the
same seed gives the same stream to any tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time

from crawlerd.frontier.dust import DustLearner
from crawlerd.store.writer import WriteThread
from crawlerd.url.canonical import fingerprint


def url_stream(rng: random.Random, hosts: int, sid: float):
    while True:
        h = int(rng.paretovariate(1.2)) % hosts if rng.random() < 0.5 else rng.randrange(hosts)
        base = f"http://h{h}.example:8080"
        r = rng.random()
        if r < sid:
            yield f"{base}/p/{rng.randrange(300)}.html?sid={rng.getrandbits(64):016x}", h
        elif r < sid + 0.02:
            yield f"{base}/cal?y={2020 + rng.randrange(10)}&m={1 + rng.randrange(12)}", h
        else:
            yield f"{base}/p/{rng.randrange(300)}.html", h


def main() -> int:
    return asyncio.run(run())


async def run() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=20000)
    p.add_argument("--pages", type=int, default=60000)
    p.add_argument("--slice", type=int, default=250, help="URLs admitted per step")
    p.add_argument("--commit-pages", type=int, default=1000, help="pages observed between commits")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sid", type=float, default=0.04, help="share of URLs with a session id (0: no rules learned)")
    p.add_argument("--no-writer", action="store_true", help="commit on the loop thread")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args()
    rng = random.Random(a.seed)
    stream = url_stream(rng, a.hosts, a.sid)
    cpu = {"admit": 0.0, "observe": 0.0, "write": 0.0, "commit": 0.0}
    admitted = observed = 0
    with tempfile.TemporaryDirectory() as d:
        learner = DustLearner(d + "/dust", sync=False, clock=lambda: 1.0e9)
        writer = None
        if not a.no_writer:
            writer = WriteThread(asyncio.get_running_loop(), name="bench-writer")
            learner.store.attach_writer(writer)
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
            t = time.thread_time()
            ds = learner.admit_batch(urls, fps, [1] * len(urls), [0] * len(urls), [h for _, h in fresh])
            cpu["admit"] += time.thread_time() - t
            admitted += len(urls)
            pages += [(u, h, fp) for (u, h), fp, dd in zip(fresh, fps, ds, strict=True) if dd.action != "skip"]
            batch = []
            for _ in range(min(a.slice // 5, len(pages))):     # pages answered in random order
                i = rng.randrange(len(pages))
                pages[i], pages[-1] = pages[-1], pages[i]
                batch.append(pages.pop())
            for url, host, fp in batch:
                page = fingerprint(url.partition("?sid=")[0])   # a session id does not change the page
                digest = page.to_bytes(8, "big") + bytes(12)     # its SHA-1: the first 8 bytes count
                simhash = page ^ (page >> 7)
                t = time.thread_time()
                learner.observe(url, fp, host, digest, simhash, "")
                cpu["observe"] += time.thread_time() - t
            observed += len(batch)
            since_commit += len(batch)
            if since_commit >= a.commit_pages:
                since_commit = 0
                t = time.thread_time()
                hosts = learner.dirty_hosts()
                for i in range(0, len(hosts), 128):
                    learner.write_hosts(hosts[i:i + 128])
                t2 = time.thread_time()
                learner.commit()
                cpu["write"] += t2 - t
                cpu["commit"] += time.thread_time() - t2
            await asyncio.sleep(0)          # the writer's callbacks
        if writer is not None:
            done = asyncio.get_running_loop().create_future()
            learner.store.barrier(lambda: done.set_result(None))
            await done
            writer.close()
            learner.store.attach_writer(None)
        print(json.dumps({k: v for k, v in learner.stats().items() if not isinstance(v, (list, dict))}), file=sys.stderr)
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
