"""The shard's stores, made the way the Shard makes them, in a tmp data dir (no network, no Shard)."""

from __future__ import annotations

import asyncio
import glob
import time

from crawlerd import config
from crawlerd.dedup.near import NearDuplicates
from crawlerd.frontier import Frontier
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.records import FetchResult
from crawlerd.seen import AsyncSeenSet
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.intake import Intake
from crawlerd.store.digest_set import DigestSet
from crawlerd.store.events import read_events
from crawlerd.url.filter import UrlFilter

T0 = 1_700_000_000.0


class Parts:
    def __init__(self, data_dir: str, *overrides: str, clock=time.monotonic):
        self.cfg = config.load(None, [f"crawl.data_dir={data_dir!r}", "url_filter.max_path_depth=4",
                                      "process.workers=1", *overrides])
        cfg = self.cfg
        self.metrics = Metrics()
        self.woken = 0
        self.clock = clock
        fr = cfg.frontier
        self.frontier = Frontier(cfg.path("frontier"), clock=clock, map_size_bytes=1 << 26, blocklist=[],
                                 working_set_max=fr.working_set_max, session_fetches=fr.session_fetches,
                                 session_s=fr.session_s)
        self.seen = AsyncSeenSet(cfg.path("drum"), buckets=4, bucket_buffer_bytes=1 << 12,
                                 merge_bytes=1 << 20, cache_entries=1 << 10, threaded_intake=True)
        self.recrawl = Recrawl(cfg.path("recrawl"), map_size_bytes=1 << 24, clock=time.time)
        self.digests = DigestSet(cfg.path("dedup", "digests"), map_size_bytes=1 << 24)
        self.near = NearDuplicates(cfg.path("dedup"))
        self.events = FetchEvents(cfg.path("events"), wall=time.time)
        self.url_filter = UrlFilter(max_path_depth=cfg.url_filter.max_path_depth)
        self.intake = Intake(cfg, frontier=self.frontier, seen=self.seen, url_filter=self.url_filter,
                             recrawl=self.recrawl, metrics=self.metrics, wake=self._wake, wall=time.time)

    def _wake(self) -> None:
        self.woken += 1

    def event_lines(self) -> list[dict]:
        self.events.flush()
        return [ev for p in sorted(glob.glob(self.cfg.path("events", "*"))) for ev in read_events(p)]

    async def close(self) -> None:
        await self.seen.close()
        self.frontier.close()
        self.recrawl.close()
        self.digests.close()
        self.near.close()
        self.events.close()


def answer(url: str, body: bytes, *, status: int = 200, headers=(), ctype: str = "text/html") -> FetchResult:
    hdrs = [("Content-Type", ctype), ("Content-Length", str(len(body))), *headers]
    head = f"HTTP/1.1 {status} X\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs) + "\r\n"
    host = url.split("/")[2]
    req = f"GET /{url.split('/', 3)[3]} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: crawlerd-test\r\n\r\n"
    return FetchResult(url=url, outcome=Outcome.OK, status=status, ip="127.0.0.1", started_at=T0,
                       elapsed_s=0.01, request_head=req.encode(), response_head=head.encode(), body=body,
                       headers=hdrs)


def run(coro):
    return asyncio.run(coro)


class MostUnlanded:
    """The most the given overlays held unlanded together, read once per loop iteration (between
    callbacks) from ``start()`` until ``stop()``."""

    def __init__(self, *overlays):
        self.overlays, self.most, self.running = [ov for ov in overlays if ov is not None], 0, True

    def start(self) -> None:
        self.most = max(self.most, sum(ov.unlanded_bytes for ov in self.overlays))
        if self.running:
            asyncio.get_running_loop().call_soon(self.start)

    def stop(self) -> int:
        self.running = False
        return self.most
