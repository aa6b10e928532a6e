"""The Scrapy peer of the end-to-end benchmark: crawl the synthetic web the way Scrapy would.

    python bench/peers/scrapy_peer.py --seeds FILE --seconds 30 --out stats.json

Starts from the same seeds as crawlerd, follows every ``<a href>`` that is not ``rel=nofollow``
(and none from a page whose meta robots says nofollow), obeys robots.txt through Scrapy's own
RobotsTxtMiddleware (Protego), and stops after ``--seconds`` (CLOSESPIDER_TIMEOUT). Politeness is
set as close to crawlerd's defaults as Scrapy's knobs allow: one request in flight per host and
a fixed 1 s DOWNLOAD_DELAY. Scrapy measures that delay from the *start* of one request to the
start of the next (``Downloader._process_queue``), not from the end of the last answer as
crawlerd does (ARCHITECTURE.md invariant 1); the server ledger judges both crawlers by the same rule.

Scrapy resolves names with the system resolver (getaddrinfo in a thread pool), so the benchmark
runs this script in its own mount namespace with a temporary /etc/hosts bind-mounted over the
real one; this script never touches /etc/hosts itself.

At exit it writes one JSON object to ``--out``: pages seen by the spider, Scrapy's own stats
(requests, responses, statuses, robots, retries), and its own CPU time and peak RSS from
getrusage.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import scrapy
from scrapy import signals
from scrapy.crawler import CrawlerProcess
from scrapy.http import TextResponse

DEFAULT_UA = "crawlerd-bench-scrapy-peer/0.1 (+synthetic web on loopback; operator: bench@localhost)"


def peer_settings(seconds: float, user_agent: str, robots_agent: str, delay_s: float,
                  concurrency: int, timeout_s: float, log_level: str) -> dict:
    """Scrapy settings for a polite crawl comparable to crawlerd's defaults (config_schema.py)."""
    return {
        "USER_AGENT": user_agent,
        "ROBOTSTXT_OBEY": True,
        # the product token robots.txt groups are matched against; the same one crawlerd uses,
        # so both crawlers are held to the same rules
        "ROBOTSTXT_USER_AGENT": robots_agent,
        "DOWNLOAD_DELAY": delay_s,                  # politeness.min_delay_s
        "RANDOMIZE_DOWNLOAD_DELAY": False,
        "AUTOTHROTTLE_ENABLED": False,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 1,        # one request in flight per host
        "CONCURRENT_REQUESTS": concurrency,         # fetch.max_in_flight
        "DOWNLOAD_TIMEOUT": timeout_s,              # fetch.timeout_s
        "DOWNLOAD_MAXSIZE": 10 * 1024 * 1024,       # fetch.max_body_bytes
        "REDIRECT_MAX_TIMES": 5,                    # fetch.max_redirects
        "RETRY_TIMES": 2,                           # frontier.max_attempts = 3 attempts in all
        "CLOSESPIDER_TIMEOUT": seconds,
        "COOKIES_ENABLED": False,                   # crawlerd keeps no cookies
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": log_level,
        "LOGSTATS_INTERVAL": 0,
        # breadth-first, like crawlerd's per-host FIFO queues
        "DEPTH_PRIORITY": 1,
        "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
    }


def _meta_nofollow(response: TextResponse) -> bool:
    for content in response.xpath(
            "//meta[translate(@name, 'ROBTS', 'robts')='robots']/@content").getall():
        tokens = {t.strip().lower() for t in content.split(",")}
        if "nofollow" in tokens or "none" in tokens:
            return True
    return False


class SimWebSpider(scrapy.Spider):
    """Follows links breadth-first from the seeds. Key of its only state: ``pages`` counts
    responses delivered to ``parse`` (after robots, redirects and retries)."""

    name = "simweb_peer"

    def __init__(self, seeds: list[str], **kw) -> None:
        super().__init__(**kw)
        self.seeds = seeds
        self.pages = 0
        self.links_followed = 0

    async def start(self):
        for url in self.seeds:
            yield scrapy.Request(url, callback=self.parse, errback=self.failed)

    def parse(self, response):
        self.pages += 1
        if not isinstance(response, TextResponse) or _meta_nofollow(response):
            return
        for a in response.css("a[href]"):
            rel = (a.attrib.get("rel") or "").lower().split()
            if "nofollow" in rel:
                continue
            href = a.attrib["href"].strip()
            if not href or href.startswith(("#", "mailto:", "javascript:")):
                continue
            try:
                req = response.follow(href, callback=self.parse, errback=self.failed)
            except ValueError:          # unparsable or unsupported URL: crawlerd drops these too
                self.crawler.stats.inc_value("peer/bad_link")
                continue
            self.links_followed += 1
            yield req

    def failed(self, failure) -> None:
        self.crawler.stats.inc_value("peer/failed")


def run(seeds: list[str], seconds: float, out: str, **settings_kw) -> dict:
    t0 = time.monotonic()
    process = CrawlerProcess(settings=peer_settings(seconds, **settings_kw), install_root_handler=True)
    crawler = process.create_crawler(SimWebSpider)
    closed: dict = {}

    def on_closed(spider, reason) -> None:
        closed["reason"] = reason
        closed["t"] = time.monotonic()

    crawler.signals.connect(on_closed, signal=signals.spider_closed)
    process.crawl(crawler, seeds=seeds)
    process.start()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    spider = crawler.spider
    stats = {k: v for k, v in (crawler.stats.get_stats() or {}).items() if isinstance(v, (int, float, str))}
    report = {
        "crawler": f"scrapy {scrapy.__version__}",
        "pid": os.getpid(),
        "pages": spider.pages if spider else 0,
        "links_followed": spider.links_followed if spider else 0,
        "close_reason": closed.get("reason", ""),
        "wall_s": round(time.monotonic() - t0, 3),
        "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
        "max_rss_bytes": ru.ru_maxrss * 1024,      # Linux reports KiB
        "stats": stats,
    }
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True, default=str)
    os.replace(tmp, out)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seeds", required=True, help="seed URLs, one per line")
    p.add_argument("--seconds", type=float, default=30.0, help="crawl this long (CLOSESPIDER_TIMEOUT)")
    p.add_argument("--out", required=True, help="write the peer's report (JSON) here")
    p.add_argument("--user-agent", default=DEFAULT_UA, help="User-Agent header")
    p.add_argument("--robots-agent", default="crawlerd", help="product token matched in robots.txt")
    p.add_argument("--delay-s", type=float, default=1.0, help="DOWNLOAD_DELAY per host, seconds")
    p.add_argument("--concurrency", type=int, default=1000, help="CONCURRENT_REQUESTS")
    p.add_argument("--timeout-s", type=float, default=60.0, help="DOWNLOAD_TIMEOUT, seconds")
    p.add_argument("--log-level", default="WARNING", help="Scrapy log level")
    args = p.parse_args(argv)
    with open(args.seeds, encoding="utf-8") as f:
        seeds = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    if not seeds:
        print("scrapy_peer: no seeds", file=sys.stderr)
        return 2
    rep = run(seeds, args.seconds, args.out, user_agent=args.user_agent, robots_agent=args.robots_agent,
              delay_s=args.delay_s, concurrency=args.concurrency, timeout_s=args.timeout_s,
              log_level=args.log_level)
    print(f"scrapy peer: {rep['pages']} pages in {rep['wall_s']:.1f}s, CPU {rep['cpu_s']:.2f}s, "
          f"closed: {rep['close_reason']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
