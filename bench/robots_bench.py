"""robots.txt micro-benchmark: parse time for a typical ~2 KB file and match time per URL.

Baselines measured in the same run: urllib.robotparser (stdlib) and protego (if installed;
`pip install protego`). Times are CPU time of this process (time.process_time), so waiting for
a core on a shared machine is not counted. Each figure is the median of --runs runs; ratios are
against crawlerd within each run, then the median.

    nice .venv/bin/python bench/robots_bench.py [--runs 7] [--urls 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import urllib.robotparser

from crawlerd.fetch.robots import RobotsRules

AGENT = "crawlerd"

# A typical large-site robots.txt: a few named groups, a long "*" group with prefix, wildcard
# and anchored rules, comments, a crawl-delay and sitemaps (about 2 KB).
TYPICAL = b"""# robots.txt for www.example.com
# Questions: webmaster@example.com
# Last updated 2024-05-01. Please respect the rules below; abusive clients are blocked.
# See https://www.example.com/legal/crawling for our crawling policy.

User-agent: Googlebot
User-agent: Bingbot
Disallow: /search
Disallow: /private/
Allow: /private/press/

User-agent: Googlebot-Image
Disallow: /media/private/
Allow: /media/

User-agent: Mediapartners-Google
Allow: /

# AI and SEO crawlers: no thanks
User-agent: GPTBot
User-agent: CCBot
User-agent: ClaudeBot
User-agent: AhrefsBot
User-agent: SemrushBot
User-agent: MJ12bot
User-agent: DotBot
Disallow: /

User-agent: Yandex
Crawl-delay: 5
Disallow: /search
Disallow: /private/
Clean-param: sessionid&sort /products/

User-agent: *
Crawl-delay: 2
Disallow: /admin/
Disallow: /cart
Disallow: /checkout/
Disallow: /account/
Disallow: /login
Disallow: /logout
Disallow: /register
Disallow: /search
Disallow: /tmp/
Disallow: /cgi-bin/
Disallow: /api/
Allow: /api/public/
Disallow: /*?sessionid=
Disallow: /*?sort=
Disallow: /*&sort=
Disallow: /*?filter=
Disallow: /*.pdf$
Disallow: /*.json$
Disallow: /print/
Disallow: /preview/
Disallow: /drafts/
Disallow: /comments/feed/
Disallow: /trackback/
Disallow: /wp-admin/
Allow: /wp-admin/admin-ajax.php
Disallow: /wp-includes/
Disallow: /xmlrpc.php
Disallow: /tag/*/page/
Disallow: /author/*/feed$
Disallow: /shop/*/reviews/
Disallow: /user/%7Euser/
Disallow: /media/private/
Allow: /media/
Disallow: /newsletter/confirm
Disallow: /redirect?
Disallow: /out/
Disallow: /ads/
Disallow: /beta/
Disallow: /internal/
Disallow: /staging/
Disallow: /*/edit$
Disallow: /*/history/
Disallow: /*/revisions/*/diff
Disallow: /calendar/*?month=
Disallow: /events/*.ics$
Disallow: /compare?
Disallow: /wishlist
Disallow: /share/
Disallow: /embed/
Disallow: /feeds/private/

Sitemap: https://www.example.com/sitemap_index.xml
Sitemap: https://www.example.com/news-sitemap.xml
Sitemap: https://www.example.com/video-sitemap.xml
Sitemap: https://www.example.com/image-sitemap.xml
"""

_PATHS = [
    "/", "/news/2024/05/some-article-title", "/news/2024/05/some-article-title?page=2",
    "/category/world/europe", "/tag/politics/page/3", "/shop/widgets/reviews/", "/shop/widgets/",
    "/media/img/photo-1234.jpg", "/media/private/x.jpg", "/admin/settings", "/cart", "/search?q=x",
    "/products/list?sort=price", "/products/list?page=1&sort=price", "/files/report.pdf",
    "/files/report.pdf?dl=1", "/author/jane/feed", "/article/42/edit", "/article/42/history/3",
    "/about/team", "/contact", "/wp-admin/admin-ajax.php", "/user/~user/profile", "/caf%C3%A9/menu",
    "/api/public/v1/items", "/api/v1/items", "/static/app.3f2a1b.js", "/blog/2023/12/31/year-review",
]


def make_urls(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return ["https://www.example.com" + rng.choice(_PATHS) for _ in range(n)]


def _parse_us(parse, inner: int) -> float:
    t0 = time.process_time()
    for _ in range(inner):
        parse()
    return (time.process_time() - t0) / inner * 1e6


def _match_us(check, urls: list[str]) -> float:
    t0 = time.process_time()
    for u in urls:
        check(u)
    return (time.process_time() - t0) / len(urls) * 1e6


def _stdlib_parse(body: bytes) -> urllib.robotparser.RobotFileParser:
    rp = urllib.robotparser.RobotFileParser()
    rp.parse(body.decode("utf-8", "replace").splitlines())
    return rp


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="repetitions; the median is reported (default 7)")
    ap.add_argument("--urls", type=int, default=2000, help="URLs per match run (default 2000)")
    ap.add_argument("--parses", type=int, default=300, help="parses per parse run (default 300)")
    args = ap.parse_args(argv)
    urls = make_urls(args.urls)

    # (name, parse(), matcher built once) per library
    libs = [("crawlerd", lambda: RobotsRules.parse(TYPICAL, AGENT),
             lambda rp: rp.allowed)]
    try:
        from protego import Protego
    except ImportError:
        Protego = None
    if Protego is not None:
        text = TYPICAL.decode()
        libs.append(("protego", lambda: Protego.parse(text),
                     lambda rp: (lambda u: rp.can_fetch(u, AGENT))))
    libs.append(("urllib.robotparser", lambda: _stdlib_parse(TYPICAL),
                 lambda rp: (lambda u: rp.can_fetch(AGENT, u))))

    # The libraries take turns inside every run, so load from other processes on a shared
    # machine hits them alike; ratios are taken within a run, then the median is reported.
    parse_s = {name: [] for name, _, _ in libs}
    match_s = {name: [] for name, _, _ in libs}
    for _ in range(args.runs):
        for name, parse, checker in libs:
            parse_s[name].append(_parse_us(parse, args.parses))
            match_s[name].append(_match_us(checker(parse()), urls))
    rows = []
    for name, _, _ in libs:
        rows.append((name, statistics.median(parse_s[name]), statistics.median(match_s[name]),
                     statistics.median(a / b for a, b in zip(parse_s[name], parse_s["crawlerd"], strict=True)),
                     statistics.median(a / b for a, b in zip(match_s[name], match_s["crawlerd"], strict=True))))
    rules = RobotsRules.parse(TYPICAL, AGENT)

    print(f"robots.txt {len(TYPICAL)} bytes, {rules.rule_count} rules for {AGENT!r}; "
          f"{args.urls} URLs; median of {args.runs} interleaved runs")
    print(f"{'library':<20} {'parse us':>10} {'x crawlerd':>10} {'match us/URL':>13} {'x crawlerd':>10}")
    for name, parse_us, match_us, parse_x, match_x in rows:
        print(f"{name:<20} {parse_us:>10.1f} {parse_x:>10.2f} {match_us:>13.3f} {match_x:>10.2f}")
    if Protego is None:
        print("protego not installed: comparison skipped (pip install protego)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
