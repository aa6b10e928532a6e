"""A page's outlinks through the crawl loop's per-link passes, alone (issue 10; branch loop21).

Per page of ``--links`` links (``--hosts`` hosts, ``--nofollow`` of them nofollow, simweb's page
paths, ``--query`` of them with a query): what ``Answers._follow`` does with them before the
seen-set, which is the links to follow and their hosts (``records.followed_links``, or the list and set comprehensions of trees before it),
then ``Intake.submit_links``'s native pass (``_native/intake.links``: the filter's quick test and the
seen-set records, with the shipped ``UrlFilter``). CPU microseconds per page, the best of
``--repeats``.

Run it with each tree's Python to compare (from outside a source tree, so each imports its own)::

    cd /tmp && /work/wt/loop21/.venv/bin/python /work/wt/loop21/bench/link_pass_bench.py
    cd /tmp && /work/main/.venv/bin/python /work/wt/loop21/bench/link_pass_bench.py
"""

from __future__ import annotations

import argparse
import random
import time

from crawlerd._native.intake import links as native_links
from crawlerd.config import load as load_config
from crawlerd.records import Link
from crawlerd.url.canonical import fingerprint
from crawlerd.url.filter import UrlFilter

try:
    from crawlerd.records import followed_links
except ImportError:         # a tree before loop21: the comprehensions Answers._follow ran
    def followed_links(links):
        follow = [ln for ln in links if not ln.nofollow]
        return follow, {ln.host_key for ln in follow}


def pages(n: int, links: int, hosts: int, nofollow: float, query: float, seed: int = 1) -> list[list[Link]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        home = rng.randrange(hosts)
        page = []
        for _ in range(links):
            h = home if rng.random() < 0.85 else rng.randrange(hosts)
            url = f"http://h{h}.sim/p/{rng.randrange(10_000)}.html"       # simweb's page paths
            if rng.random() < query:
                url += f"?s={rng.randrange(1000)}"         # a query: the quick test leaves it to the filter
            page.append(Link(url, fingerprint(url), f"http://h{h}.sim", rng.random() < nofollow))
        out.append(page)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=20_000)
    ap.add_argument("--links", type=int, default=22, help="links per page (e2e: ~22)")
    ap.add_argument("--hosts", type=int, default=20_000)
    ap.add_argument("--nofollow", type=float, default=0.05, help="share of links marked nofollow")
    ap.add_argument("--query", type=float, default=0.05, help="share of links with a query")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cfg = load_config(None)      # the defaults
    uf = cfg.url_filter         # as the shard builds it
    f = UrlFilter(max_url_length=cfg.fetch.max_url_length, max_path_depth=uf.max_path_depth,
                  max_repeated_segments=uf.max_repeated_segments, max_query_params=uf.max_query_params,
                  max_param_values=uf.max_param_values, state_bytes=uf.state_bytes)
    data = pages(args.pages, args.links, args.hosts, args.nofollow, args.query)
    head = b"2 0 1 "
    best_follow = best_links = float("inf")
    for _ in range(args.repeats):
        t0 = time.process_time()
        follows = [followed_links(page)[0] for page in data]
        t1 = time.process_time()
        for follow in follows:
            native_links(follow, head, f.max_url_length, f.quick_slashes, f.check, [])
        t2 = time.process_time()
        best_follow, best_links = min(best_follow, t1 - t0), min(best_links, t2 - t1)
    n = len(data)
    print(f"{args.links} links a page, {n} pages: follow list and hosts {1e6 * best_follow / n:.2f} us/page, "
          f"links pass {1e6 * best_links / n:.2f} us/page, both {1e6 * (best_follow + best_links) / n:.2f} us/page")


if __name__ == "__main__":
    main()
