"""The byte-capped caches `crawlerd stats` shows: each one's estimated bytes against what tracemalloc
sees it hold, filled with realistic entries (issue 14; bench/RESULTS.md, "bounded-in-bytes
accounting, twenty-first pass"). A ratio (estimated / traced) far from 1 makes a cap mean
something else than its config key says; DUST's host states are measured by
``dust_state_bytes.py``.

    nice -n 10 .venv/bin/python bench/cache_bytes.py
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import dust_state_bytes

from crawlerd.bytecache import ByteLRU
from crawlerd.fetch.robots.cache import RobotsCache
from crawlerd.fetch.robots.policy import robots_decision
from crawlerd.simweb.site import Site
from crawlerd.url.filter import UrlFilter

HOSTS = 3000


def traced(fill: Callable[[], object]) -> tuple[int, object]:
    """(bytes still held after ``fill()``, what it returned, kept alive meanwhile)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = fill()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held, kept


def byte_lru_entries() -> dict:
    """The map's own cost per entry (``ENTRY_OVERHEAD``): host-key strings charged 0, kept apart."""
    keys = [f"http://h{i}.sim:8080" for i in range(HOSTS * 10)]

    def fill():
        c = ByteLRU(1 << 40)
        for k in keys:
            c.put(k, None, 0)
        return c
    real, c = traced(fill)
    return {"cache": "ByteLRU entry (the map alone)", "entries": len(c), "estimated": c.bytes, "traced": real}


def robots(label: str, bodies: list[bytes]) -> dict:
    def fill():
        c = RobotsCache(cap_bytes=1 << 40)
        for i, body in enumerate(bodies):
            c.put(f"http://h{i}.sim:8080", robots_decision(
                status=200, outcome_ok=True, body=body, location=None, hops=0, previous=None, now=1000.0,
                agent_token="crawlerd", cache_ttl_s=86400.0, error_retry_s=60.0, max_bytes=512 << 10))
        return c
    real, c = traced(fill)
    m = c.memory()
    return {"cache": f"robots.cache_bytes ({label})", "entries": m["entries"], "estimated": m["bytes"], "traced": real}


def url_filter() -> dict:
    urls = [u for u, *_ in dust_state_bytes.visits(HOSTS, 8, 0.5)]
    urls += [f"http://h{i % HOSTS}.sim:8080/search?q=term{i}&page={i % 7}" for i in range(20000)]

    def fill():
        f = UrlFilter(state_bytes=1 << 40)
        for u in urls:
            f.check(u)
        return f
    real, f = traced(fill)
    m = f.memory()
    return {"cache": "url_filter.state_bytes", "entries": m["entries"], "estimated": m["bytes"], "traced": real}


def main() -> None:
    site = Site(HOSTS, seed=1)
    long_robots = (b"User-agent: *\n" + b"".join(b"Disallow: /dir%d/*?q=%d$\nAllow: /dir%d/ok/\n" % (i, i, i)
                                                 for i in range(40))
                   + b"Sitemap: http://x.example/sitemap.xml\nUser-agent: otherbot\nDisallow: /\n")
    rows = [byte_lru_entries(), robots("simweb's files", [h.robots.text.encode() for h in site.hosts]),
            robots("a 40-rule file", [long_robots] * HOSTS), url_filter()]
    for share in (0.0, 1.0):
        m = dust_state_bytes.measure(1000, 24, share)
        rows.append({"cache": f"dust.cache_bytes ({share:.0%} variant hosts, 24 pages)", "entries": m["states"],
                     "estimated": m["charged_bytes"], "traced": m["real_bytes"]})
    print(f"{'cache':<52} {'entries':>8} {'est. B/entry':>12} {'traced B/entry':>14} {'est./traced':>11}")
    for r in rows:
        n = r["entries"]
        print(f"{r['cache']:<52} {n:>8} {r['estimated'] / n:>12.0f} {r['traced'] / n:>14.0f} "
              f"{r['estimated'] / r['traced']:>11.2f}")


if __name__ == "__main__":
    main()
