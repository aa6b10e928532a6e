"""URL pipeline and HTML extraction micro-benchmark.

Measures, on a realistic page (50 links: root-relative, relative, absolute
same-host, other hosts, protocol-relative, percent-encoded, mailto/javascript/
fragment, repeated navigation links) and a ~20 KB HTML document holding them:

- links_from_page, µs per link, warm host cache (the steady state) and with the
  caches cleared before every page (worst case: every host new);
- the same work done by normalize() per href (no fast path);
- a naive baseline: urllib.parse.urljoin + urlsplit per href (less correct: no
  IDNA, no percent-encoding or port normalisation, no validation);
- UrlFilter.check per resulting link;
- extract(), µs per 20 KB page; against lexbor's parse alone (the floor) and a
  naive stdlib html.parser link extractor.

Every figure is the median of --runs runs, CPU-time per item; ratios are
against links_from_page (warm) and extract() in the same run.

    nice .venv/bin/python bench/url_bench.py [--runs 7] [--pages 300]
"""

from __future__ import annotations

import argparse
import statistics
import time
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit, urlunsplit

from selectolax.lexbor import LexborHTMLParser
from xxhash import xxh3_64_intdigest

from crawlerd.process.html import extract
from crawlerd.process.links import links_from_page
from crawlerd.records import Link
from crawlerd.url.canonical import fingerprint, normalize, normalize_authority, parse_base
from crawlerd.url.filter import UrlFilter
from crawlerd.url.hosts import host_key

BASE = "https://www.example.com/news/world/2024/05/article-12345.html"

HREFS: list[tuple[str, bool]] = (
    [(p, False) for p in ("/", "/news/", "/sport/", "/business/", "/tech/", "/culture/", "/about/",
                          "/contact/", "/privacy", "/terms")]                                  # nav
    + [(f"/news/world/2024/05/story-{i}.html", False) for i in range(12)]                    # root-relative
    + [(f"related-{i}.html", False) for i in range(6)]                                       # relative
    + [("../04/archive.html", False), ("./gallery/photo-1.jpg", False)]                      # dot segments
    + [(f"https://www.example.com/video?id={i}&autoplay=0", False) for i in range(5)]        # absolute same-host
    + [("https://cdn.examplecdn.net/static/app.js", False), ("//fonts.example.org/css?family=Open+Sans", False),
       ("https://twitter.com/intent/tweet?url=https%3A%2F%2Fwww.example.com%2Fnews", True),
       ("https://www.facebook.com/sharer/sharer.php?u=https%3A%2F%2Fwww.example.com", True),
       ("http://partner.example.org/offer", True), ("https://Shop.Example.com/Cart", False),
       ("/search?q=hello world", False), ("https://de.example.com/nachrichten/übersicht", False)]
    + [("mailto:news@example.com", False), ("javascript:void(0)", False), ("#top", False)]
    + [("/", False), ("/news/", False), ("/about/", False), ("/sport/", False)]               # repeats
)
assert len(HREFS) == 50, len(HREFS)


def make_page(target_bytes: int = 20_000) -> bytes:
    parts = ['<!doctype html><html lang="en"><head><meta charset="utf-8"><title>World news: an article</title>',
             '<meta name="viewport" content="width=device-width"><meta name="robots" content="index, follow">',
             "<style>body{font:16px/1.4 sans-serif}.nav a{margin:0 4px}</style>",
             "<script>window.dataLayer=[];function track(e){dataLayer.push(e)}</script></head><body>",
             '<header><nav class="nav">']
    for href, _ in HREFS[:10]:
        parts.append(f'<a href="{href}">{href.strip("/") or "home"}</a>')
    parts.append("</nav></header><main><article><h1>An article about the world</h1>")
    para = ("<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
            "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation.</p>")
    rest = HREFS[10:]
    i = 0
    while sum(map(len, parts)) < target_bytes - 600:
        parts.append(para)
        if i < len(rest):
            href, nofollow = rest[i]
            rel = ' rel="nofollow noopener"' if nofollow else ""
            parts.append(f'<p>See <a href="{href}"{rel}>link {i}</a> and <span class="x">more</span>.</p>')
            i += 1
    for href, _ in rest[i:]:
        parts.append(f'<a href="{href}">more</a>')
    parts.append('</article></main><footer><p>&copy; Example</p></footer>'
                 '<script>track({"page":"article"})</script></body></html>')
    return "".join(parts).encode()


def naive_links(hrefs: list[tuple[str, bool]], base: str) -> list[Link]:
    out = []
    for href, nofollow in hrefs:
        parts = urlsplit(urljoin(base, href))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            continue
        url = urlunsplit((parts.scheme, parts.netloc.lower(), parts.path or "/", parts.query, ""))
        out.append(Link(url, xxh3_64_intdigest(url.encode()), f"{parts.scheme}://{parts.netloc.lower()}", nofollow))
    return out


def general_links(hrefs: list[tuple[str, bool]], base: str) -> list[Link]:
    out = []
    for href, nofollow in hrefs:
        url = normalize(href, base)
        if url is not None:
            out.append(Link(url, fingerprint(url), host_key(url), nofollow))
    return out


def cold_links(hrefs: list[tuple[str, bool]], base: str) -> list[Link]:
    normalize_authority.cache_clear()
    parse_base.cache_clear()
    return links_from_page(hrefs, base)


class _StdlibLinks(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[tuple[str, bool]] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("a", "area"):
            d = dict(attrs)
            if d.get("href") is not None:
                self.links.append((d["href"], "nofollow" in (d.get("rel") or "").lower().split()))


def stdlib_extract(body: bytes) -> list[tuple[str, bool]]:
    p = _StdlibLinks()
    p.feed(body.decode("utf-8", "replace"))
    p.close()
    return p.links


def per_item_us(fn, items: int, repeat: int) -> float:
    t0 = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - t0) / (repeat * items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--pages", type=int, default=300, help="pages per run")
    args = ap.parse_args()
    page = make_page()
    n = len(HREFS)
    info = extract(page, BASE)
    print(f"page: {len(page)} bytes, {n} hrefs, {len(info.links)} unique a/area hrefs, "
          f"{len(links_from_page(info.links, BASE))} links out; {args.runs} runs x {args.pages} pages")

    url_filter = UrlFilter()
    out_urls = [lk.url for lk in links_from_page(HREFS, BASE)]
    link_cases = {
        "links_from_page (warm)": lambda: links_from_page(HREFS, BASE),
        "links_from_page (cold caches)": lambda: cold_links(HREFS, BASE),
        "normalize() per href": lambda: general_links(HREFS, BASE),
        "naive urljoin+urlsplit": lambda: naive_links(HREFS, BASE),
        "UrlFilter.check (per link out)": lambda: [url_filter.check(u) for u in out_urls],
    }
    page_cases = {
        "extract() 20 KB page": lambda: extract(page, BASE),
        "extract + links_from_page": lambda: links_from_page(extract(page, BASE).links, BASE),
        "lexbor parse only": lambda: LexborHTMLParser(page.decode()),
        "naive stdlib html.parser": lambda: stdlib_extract(page),
    }
    results: dict[str, list[float]] = {k: [] for k in (*link_cases, *page_cases)}
    for _ in range(args.runs):
        for name, fn in link_cases.items():
            items = len(out_urls) if name.startswith("UrlFilter") else n
            results[name].append(per_item_us(fn, items, args.pages))
        for name, fn in page_cases.items():
            results[name].append(per_item_us(fn, 1, max(1, args.pages // 3)))

    ref = statistics.median(results["links_from_page (warm)"])
    print(f"\n{'per link (50-link page)':34} {'median µs':>10} {'min':>8} {'max':>8} {'x warm':>8}")
    for name in link_cases:
        r = results[name]
        print(f"{name:34} {statistics.median(r):10.2f} {min(r):8.2f} {max(r):8.2f} "
              f"{statistics.median(r) / ref:8.2f}")
    ref = statistics.median(results["extract() 20 KB page"])
    print(f"\n{'per page (20 KB)':34} {'median µs':>10} {'min':>8} {'max':>8} {'x extract':>9}")
    for name in page_cases:
        r = results[name]
        print(f"{name:34} {statistics.median(r):10.1f} {min(r):8.1f} {max(r):8.1f} "
              f"{statistics.median(r) / ref:9.2f}")


if __name__ == "__main__":
    main()
