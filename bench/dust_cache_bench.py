"""The DUST learner's decoded host states alone: Python memory against pages archived, with the
entry cap only and with ``dust.cache_bytes`` (issue 14; bench/RESULTS.md, "DUST host states
bounded in bytes").

``hosts`` hosts are visited round robin, as a crawl whose hosts outnumber the cache visits them,
``rounds`` pages each (every host's evidence window grows by one entry per round), committing
every 2,000 pages as the shard does every couple of seconds; tracemalloc's live bytes are read
after each round.

    nice -n 10 .venv/bin/python bench/dust_cache_bench.py 1073741824 4194304
"""

from __future__ import annotations

import gc
import hashlib
import sys
import tempfile
import tracemalloc

from crawlerd.frontier.dust import DustLearner
from crawlerd.url.canonical import fingerprint


def run(cache_bytes: int, hosts: int = 20000, rounds: int = 20) -> list[tuple[int, int, dict]]:
    """(pages so far, traced bytes, the cache's memory()) after each round."""
    learner = DustLearner(tempfile.mkdtemp(prefix="dust-cache-bench"), sync=False, cache_bytes=cache_bytes)
    tracemalloc.start()
    out, n = [], 0
    for k in range(rounds):
        for i in range(hosts):
            host = f"http://host{i}.example.com"
            url = f"{host}/section/{k}/article-{k * 7919 % 10007}.html"
            learner.observe(url, fingerprint(url), host, hashlib.sha1(url.encode()).digest(),
                            (i * 2654435761 + k) & ((1 << 64) - 1), "")
            n += 1
            if n % 2000 == 0:
                learner.commit()
        gc.collect()
        out.append((n, tracemalloc.get_traced_memory()[0], learner.hosts.memory()))
    tracemalloc.stop()
    learner.close()
    return out


def main(argv: list[str]) -> None:
    for cap in [int(x) for x in argv] or [1 << 30, 4 << 20]:
        res = run(cap)
        (n0, b0, _), (n1, b1, mem) = res[len(res) // 4], res[-1]
        print(f"cache_bytes={cap >> 20} MiB: traced {b0 / 2**20:.1f} -> {b1 / 2**20:.1f} MiB over pages {n0:,}..{n1:,}: "
              f"{(b1 - b0) / (n1 - n0):+.1f} B/page; cache {mem}")


if __name__ == "__main__":
    main(sys.argv[1:])
