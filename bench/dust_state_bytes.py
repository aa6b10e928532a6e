"""The DUST learner's cached host states: the bytes their LRU charges (``dust.cache_bytes``,
``dust_hosts.host_state_bytes``) against the bytes they really hold (issue 14; bench/RESULTS.md,
"bounded-in-bytes accounting, twenty-first pass").

A crawl of simweb's own hosts (``Site(variant_share=0.5)``: half the hosts serve URL variants of
their pages, tracking parameters, sort orders, print and mobile views, session ids, page numbers,
languages) is replayed into the learner without a network: hosts visited round robin, each visit
one archived page (a page, or now and then a variant of one a page links beside it), its digest,
simhash and declared canonical as simweb serves them. After ``rounds`` pages per host the real
bytes are what tracemalloc sees freed when the cache is cut down to one state (its states, and
the store's note of each one's size), against what the cache charged for the states it let go.

    nice -n 10 .venv/bin/python bench/dust_state_bytes.py [hosts] [variant share] [rounds...]
    nice -n 10 .venv/bin/python bench/dust_state_bytes.py 1000 0.5 2 6 12 24 40
"""

from __future__ import annotations

import gc
import hashlib
import sys
import tempfile
import tracemalloc
from collections.abc import Iterator

from xxhash import xxh64_intdigest

from crawlerd.frontier.dust import DustLearner
from crawlerd.simweb.site import Site
from crawlerd.simweb.variants import Variants, parse_view
from crawlerd.url.canonical import fingerprint

PORT = 8080


def _page_identity(host, target: str) -> tuple[bytes, int, str]:
    """(payload digest, simhash, declared canonical) of ``target`` as simweb serves it: a variant
    that keeps the bytes (tracking, sort) has its page's digest; one that keeps the text (print,
    mobile, session) a digest of its own and the page's simhash; another page (a page number, a
    language) its own of both. Variant hosts declare their canonical URL."""
    path, _, query = target.partition("?")
    v = parse_view(host.variants, host.pages, path.split(";")[0], query) if host.variants else None
    if v is None:
        text = f"{host.name}{path}"
        return hashlib.sha1(text.encode()).digest(), xxh64_intdigest(text.encode()) or 1, ""
    text = f"{host.name}/{v.k}/{v.page}/{v.lang}"
    markup = f"{text}/{v.mobile}/{v.print}/{v.sid}"
    canonical = Variants(0, PORT).canonical_url(host, v)
    return hashlib.sha1(markup.encode()).digest(), xxh64_intdigest(text.encode()) or 1, canonical


def visits(hosts: int, rounds: int, variant_share: float = 0.5,
           seed: int = 1) -> Iterator[tuple[str, str, bytes, int, str]]:
    """(url, host key, digest, simhash, canonical) of each archived page, hosts round robin."""
    site = Site(hosts, seed=seed, variant_share=variant_share)
    var = Variants(seed, PORT)
    for k in range(rounds):
        for h in site.hosts[:hosts]:
            # a page, then (where the host has them) a variant of it that the page links beside it
            # (a crawl fetches the two close together), or another page
            page = (k // 2 * 7919 + h.index) % h.pages
            target = f"/p/{page}.html"
            if k % 2:
                target = var.vary(h, target, page, k, featured=True) or f"/p/{(page + 1) % h.pages}.html"
            base = f"http://{h.name}:{PORT}"
            digest, simhash, canonical = _page_identity(h, target)
            yield base + target, base, digest, simhash, canonical


def replay(learner: DustLearner, hosts: int, rounds: int, variant_share: float = 0.5,
           commit_every: int = 2000) -> None:
    for n, (url, host, digest, simhash, canonical) in enumerate(visits(hosts, rounds, variant_share), 1):
        learner.observe(url, fingerprint(url), host, digest, simhash, canonical)
        if n % commit_every == 0:
            learner.commit()
    learner.commit()


def cache_bytes_measured(learner: DustLearner) -> tuple[int, int, int]:
    """(bytes really freed, bytes charged for them, states let go) when the learner's state cache
    is cut down to one state (tracemalloc must be tracing)."""
    hosts = learner.hosts
    hosts.write_dirty()
    gc.collect()
    charged, held = hosts.cached_bytes, hosts.memory()["entries"]
    before = tracemalloc.get_traced_memory()[0]
    keep = hosts.cache_hosts
    hosts.cache_hosts = 1
    hosts.write_dirty()                       # nothing is dirty: this only cuts the LRU to its bound
    hosts.cache_hosts = keep
    gc.collect()
    freed = before - tracemalloc.get_traced_memory()[0]
    return freed, charged - hosts.cached_bytes, held - hosts.memory()["entries"]


def measure(hosts: int, rounds: int, variant_share: float = 0.5) -> dict:
    """One learner, ``rounds`` pages per host, every state cached: real against charged bytes."""
    with tempfile.TemporaryDirectory(prefix="dust-state-bytes") as d:
        learner = DustLearner(d, sync=False, cache_hosts=hosts + 1, cache_bytes=1 << 40)
        tracemalloc.start()
        try:
            replay(learner, hosts, rounds, variant_share)
            freed, charged, states = cache_bytes_measured(learner)
        finally:
            tracemalloc.stop()
            learner.close()
    return {"hosts": hosts, "variant_share": variant_share, "pages_per_host": rounds, "states": states, "real_bytes": freed,
            "charged_bytes": charged, "ratio": round(charged / freed, 2) if freed else None}


def main(argv: list[str]) -> None:
    hosts = int(argv[0]) if argv else 1000
    share = float(argv[1]) if len(argv) > 1 else 0.5
    for rounds in [int(x) for x in argv[2:]] or [2, 6, 12, 24, 40]:
        m = measure(hosts, rounds, share)
        print(f"{m['hosts']} hosts ({share:.0%} with URL variants) x {m['pages_per_host']} pages: "
              f"{m['states']} states, real "
              f"{m['real_bytes'] / m['states']:.0f} B/state, charged {m['charged_bytes'] / m['states']:.0f} "
              f"B/state: charged/real {m['ratio']}")


if __name__ == "__main__":
    main(sys.argv[1:])
