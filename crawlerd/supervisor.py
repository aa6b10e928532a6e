"""The daemon: owns the event loop, the shard, the control socket, signals and systemd.

Start-up order: validate config → claim the data dir (an exclusive lock, so two
daemons never share one) → recover torn WARC segments → open the shard (frontier,
seen-set, stores) → load seeds → listen on the control socket → READY=1.

Shutdown order (SIGTERM, SIGINT, ``crawlerd stop``, ``--duration`` elapsed,
``crawl.max_pages`` reached): STOPPING=1 → stop leasing → in-flight fetches
finish or are abandoned after ``fetch.shutdown_grace_s`` (their URLs return to
their queues) → seen-set flushed into the frontier → frontier committed → WARC
segments closed → control socket removed → exit 0.

SIGHUP re-reads the config file's runtime keys (blocklist, network.allow).
SIGQUIT dumps every thread's stack to stderr.

With ``crawl.shards`` = 1 the one shard runs in this process. With more, ``family.Family``
supervises one process per shard, and each of them is this class in *member* mode
(``crawlerd run --member i``): it takes its shard's ownership lease instead of the data dir's
lock, opens its hand-off channels and the shared per-IP slot table (``shard.member``), serves
its own control socket under ``shards/<i>/`` and writes its ``last-run.json`` there; it reads
no seeds (the family hands them over) and ends when the family does.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import os
import signal
import sys
import time

import lmdb

from crawlerd import aggregate, control, layout
from crawlerd import config as configmod
from crawlerd.allocator import tune_malloc
from crawlerd.config import Config, ConfigError
from crawlerd.exposition import render, render_text
from crawlerd.gcpace import GcPacer
from crawlerd.last_run import reserve_last_run, write_last_run
from crawlerd.metrics import Metrics, process_usage
from crawlerd.metrics_server import MetricsServer
from crawlerd.outcome import Outcome, storage_error
from crawlerd.sdnotify import Notifier
from crawlerd.seen import DrumError
from crawlerd.shard import Shard, data_dir_problem, free_space_problem, whynot
from crawlerd.shard.member import MemberError, MemberParts, open_member
from crawlerd.startup import StartupError, claim_data_dir, release_data_dir
from crawlerd.store.recover import recover as recover_warc
from crawlerd.url.canonical import normalize
from crawlerd.url.hosts import host_key

log = logging.getLogger("crawlerd")

STORE_ERRORS = (OSError, lmdb.Error, DrumError)
# a cluster member that may not run its shard (another node holds or took its lease; EX_TEMPFAIL):
# not a crash, the family asks again after the lease TTL
EXIT_NOT_OWNER = 75

# outcomes that are the crawl working as intended, not trouble (the rest count as errors in status)
NOT_ERRORS = frozenset(o.value for o in (Outcome.OK, Outcome.NOT_MODIFIED, Outcome.ROBOTS_DENIED,
                                         Outcome.ROBOTS_UNAVAILABLE, Outcome.BLOCKED, Outcome.ABORTED,
                                         Outcome.DUST_SKIPPED))


# a shard view's figures that stats() states for every shard at once (aggregate.merge)
SHARD_TOTALS = ("frontier", "budgets", "recrawl", "fetcher", "dust", "memory", "near_index", "malloc", "unlanded",
                "body_pool_fallbacks", "seen_pending", "worker_restarts", "worker_cpu_s", "recent_errors")
# per-shard fields in `status` (`stats` has each shard's whole dict)
SHARD_SUMMARY = ("shard", "pid", "pages", "pages_per_s_10s", "in_flight", "leases", "processing", "queued",
                 "hosts_active", "working_set_hosts", "sessions_started")


class KeyValueFormatter(logging.Formatter):
    """One event per line: ``ts level logger msg key=value...`` (``tag``: after the logger name)."""

    def __init__(self, tag: str = ""):
        super().__init__()
        self.tag = f" {tag}" if tag else ""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (f"{ts}.{int(record.msecs):03d}Z {record.levelname.lower()} {record.name}{self.tag} "
                f"{record.getMessage()}")
        if record.exc_info:
            line += " exc=" + repr(record.exc_info[1])
        return line


def setup_logging(level: str, tag: str = "") -> None:
    root = logging.getLogger()
    if not any(isinstance(h.formatter, KeyValueFormatter) for h in root.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(KeyValueFormatter(tag))
        root.addHandler(h)
    root.setLevel(level.upper())


class Supervisor:
    def __init__(self, cfg: Config, *, seeds_files: list[str] = (), duration_s: float | None = None,
                 notifier: Notifier | None = None, on_tick=None, config_path: str | None = None,
                 overrides: list[str] = (), member: int | None = None):
        """``member``: this process runs shard ``member`` of a family (``crawl.shards`` > 1)."""
        self.cfg = cfg
        self.member = member
        self.parts: MemberParts | None = None
        self.cluster = None             # a cluster member's ClusterParts (cluster.servers set)
        self.seeds_files = list(seeds_files)
        self.duration_s = duration_s
        self.notifier = notifier or Notifier()
        self.on_tick = on_tick
        self.config_path = config_path
        self.overrides = list(overrides)
        self.metrics = Metrics()
        self.state = "starting"
        self.shard: Shard | None = None
        self.stop_event: asyncio.Event | None = None
        self._lock_fd: int | None = None
        self.seeds_invalid = 0
        self.metrics_endpoint: MetricsServer | None = None

    # -- preparation (synchronous, before the loop) ------------------------------
    def prepare(self) -> list[str]:
        problem = data_dir_problem(self.cfg.crawl.data_dir)
        if problem:
            raise StartupError(problem)
        if self.member is not None:
            try:
                self.parts = open_member(self.cfg, self.member, spool=not self.cfg.cluster.servers)
            except MemberError as e:
                raise StartupError(str(e)) from None
            self.reserve_last_run()
            return []
        problem = free_space_problem(self.cfg.crawl.data_dir, self.cfg.storage.min_free_bytes)
        self._lock_fd, seeds, self.seeds_invalid = claim_data_dir(self.cfg, self.cfg.crawl.shards, self.seeds_files)
        try:
            os.makedirs(self.cfg.path("warc"), exist_ok=True)
            # recovery only cuts torn tails and writes indexes: it can work on a full disk
            for line in recover_warc(self.cfg.path("warc"), index_dir=self.cfg.path("index")):
                log.info("warc recovery: %s", line)
        except OSError as e:
            raise StartupError(f"warc recovery failed: {storage_error(e, e.filename or self.cfg.path('warc'))}: "
                               f"{e.strerror}; fix the storage and start again") from None
        if problem:
            raise StartupError(problem)
        self.reserve_last_run()
        return seeds

    def run(self) -> int:
        import uvloop
        # before the stores open: their buffers come from the tuned allocator
        tune_malloc(self.cfg.malloc.mmap_threshold_bytes, self.cfg.malloc.arena_max)
        seeds = self.prepare()
        return uvloop.run(self._main(seeds))

    # -- the loop ---------------------------------------------------------------------
    async def _main(self, seeds: list[str]) -> int:
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        if self.parts is not None:
            _die_with_parent()
        kwargs = self.parts.kwargs() if self.parts is not None else {}
        if self.parts is not None and self.cfg.cluster.servers:
            refused = await self._join_cluster()
            if refused:
                return refused
            kwargs.update(self.cluster.kwargs())
            if self.cfg.cluster.ip_turns:
                kwargs["ip_slots"] = await self._share_ips()
        try:
            if self.parts is not None:
                self.shard = Shard(self.cfg, self.metrics, index=self.member, shards=self.cfg.crawl.shards,
                                   **kwargs)
            else:
                self.shard = Shard(self.cfg, self.metrics)
        except layout.StateFormatError as e:
            raise StartupError(f"cannot open the crawl state: {e}") from None
        except STORE_ERRORS as e:
            raise StartupError(f"cannot open the crawl state: {storage_error(e, self.cfg.crawl.data_dir)}: "
                               f"{e}") from None
        if self.cluster is not None and self.shard.owners is not None:
            # digest owners on other machines over NATS; this shard answers theirs
            c, n = self.cfg.cluster, self.cfg.crawl.shards
            local = configmod.parse_shard_set(c.own, n) if c.own else list(range(n))
            await self.cluster.serve_digests(self.shard.owners, self.shard.owner_server.handle, local)
        self.metrics.dropped["invalid_seed"] += self.seeds_invalid
        # hosts of configured sitemaps are seeded, so their robots.txt (and with it the sitemaps) is read
        roots = [host_key(u) + "/" for u in (normalize(x) for x in self.cfg.sitemaps.urls) if u]
        if self.member is not None:
            roots = []                  # the family hands seeds and sitemap hosts to their owners
        if seeds or roots:
            self.shard.submit_urls(seeds + roots, depth=0, priority=0)
        # long-lived start-up objects leave the collector's view; fewer gen-0 passes on the hot path
        gc.collect()
        gc.freeze()
        gc_pacer = GcPacer()            # the collector's passes between callbacks (gcpace.py)
        gc_pacer.start(loop)
        server = control.ControlServer(self.control_path, self._handlers())
        try:
            await server.start()
        except (control.ControlError, OSError) as e:
            self.shard.frontier.close()
            await self.shard.seen.close()
            if self.shard.budgets is not None:
                await self.shard.budgets.close()
            raise StartupError(str(e) if isinstance(e, control.ControlError) else
                               f"cannot listen on control socket {self.control_path}: {e.strerror}") from None
        endpoint = None
        if self.cfg.metrics.listen and self.member is None:    # a family serves its shards' endpoint
            endpoint = MetricsServer(self.cfg.metrics.listen, lambda accept: render(self.stats(), accept))
            try:
                await endpoint.start()
            except OSError as e:
                await server.close()
                self.shard.frontier.close()
                await self.shard.seen.close()
                raise StartupError(f"metrics.listen = {self.cfg.metrics.listen!r}: cannot listen: "
                                   f"{e.strerror}") from None
            log.info("metrics endpoint url=%s", endpoint.url)
        self.metrics_endpoint = endpoint
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGQUIT, faulthandler.dump_traceback)
        self.state = "running"
        self.notifier.ready(f"crawling; {len(seeds)} seeds")
        log.info("started pid=%d data_dir=%s seeds=%d", os.getpid(), self.cfg.crawl.data_dir, len(seeds))
        ticker = asyncio.ensure_future(self._ticker())
        timer = loop.call_later(self.duration_s, self.request_stop, "duration") if self.duration_s else None
        if self.cluster is not None:
            self.cluster.start()
        try:
            # a family counts crawl.max_pages over all its shards
            await self.shard.run(self.stop_event, max_pages=self.cfg.crawl.max_pages if self.member is None else 0)
        except STORE_ERRORS as e:     # a storage failure during shutdown: one line, never a traceback
            self.shard.storage.fatal(e, "shutdown")
        finally:
            self.state = "stopping"
            self.notifier.stopping("draining")
            if timer:
                timer.cancel()
            ticker.cancel()
            gc_pacer.stop()
            if endpoint is not None:
                await endpoint.close()
            await server.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
                loop.remove_signal_handler(sig)
            if self.cluster is not None:    # after the shard's drain: its outbox is published by now
                await self.cluster.close()
            self.state = "stopped"
            self._write_last_run()
            log.info("stopped pages=%d", self.metrics.pages)
        if self.shard.storage.fatal_reason:
            return 1                  # a store could not be written: systemd's Restart= may try again
        if self.cluster is not None and self.cluster.lease.lost:
            return EXIT_NOT_OWNER     # another node runs this shard now: the family tries again later
        return 0

    async def _join_cluster(self) -> int:
        """A cluster member: link, N check, this shard's lease, JetStream hand-off (``self.cluster``).
        Returns EXIT_NOT_OWNER when another node holds the lease, else 0."""
        from crawlerd.cluster.engine import ClusterError
        from crawlerd.cluster.member import MemberRefused, open_cluster_parts
        h, d = self.cfg.handoff, self.cfg.crawl.data_dir
        kw = {"max_pending": h.max_pending_batches, "batch_records": h.batch_records,
              "flush_interval_s": h.flush_interval_s, "fsync": h.fsync}
        try:
            self.cluster = await open_cluster_parts(
                self.cfg, self.member, outbox_root=layout.outbox_dir(d, self.member), outbox_kw=kw,
                standby_wait_s=self.cfg.cluster.standby_wait_s, on_lost=self._lease_lost,
                heir=True)      # this process holds shards/<i>/lock: no other of this node runs it
        except MemberRefused as e:
            log.warning("not running shard %d: %s", self.member, e)
            return EXIT_NOT_OWNER
        except ClusterError as e:
            raise StartupError(str(e)) from None
        log.info("shard %d: lease %s; hand-off over JetStream (%s)", self.member,
                 "taken over from an earlier process of this node" if self.cluster.lease.inherited else "held",
                 ", ".join(self.cfg.cluster.servers))
        return 0

    async def _share_ips(self):
        """Per-IP turns across machines (``cluster.ipgrants``) over this machine's slot table."""
        c, d = self.cfg.cluster, self.cfg.crawl.data_dir
        # a shard run before may have granted turns that still run: wait them out (grant + drain)
        ran = os.path.isdir(os.path.join(layout.shard_dir(d, self.member), "frontier"))
        drain_s = self.cfg.fetch.timeout_s + 1.0
        return await self.cluster.share_ips(self.parts.ip_slots, shards=self.cfg.crawl.shards,
                                            node=self.cluster.lease.node, grant_s=c.ip_grant_s, drain_s=drain_s,
                                            quiet_s=c.ip_grant_s + drain_s if ran else 0.0)

    def _lease_lost(self, why: str) -> None:
        # the fence has closed already (no request starts); the shard drains and this process ends
        self.request_stop(f"lease lost: {why}")

    @property
    def control_path(self) -> str:
        return self.cfg.control_socket if self.member is None else layout.shard_socket(self.cfg.crawl.data_dir,
                                                                                      self.member)

    async def _ticker(self) -> None:
        wd = self.notifier.watchdog_interval_s
        last_wd = 0.0
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            if wd and now - last_wd >= wd:
                self.notifier.watchdog()
                last_wd = now
            if self.cluster is not None:    # what `cluster status` shows of this shard, in its lease
                self._lease_numbers()
            if not self.notifier.enabled and self.on_tick is None:
                continue                # a family's member: the family asks for status itself
            try:
                s = self.status()
                state = f"{s['state']}; " if s["state"] != "running" else ""
                self.notifier.status(f"{state}{s['pages']} pages, {s['pages_per_s_10s']:.1f}/s, {s['queued']} queued")
                if self.on_tick is not None:
                    self.on_tick(self, s)
            except Exception as e:     # the watchdog pings above must go on whatever status does
                log.error("status tick failed: %r", e)

    def _lease_numbers(self) -> None:
        try:
            m = self.metrics
            self.cluster.lease.numbers = {"pages": m.pages, "pages_per_s": round(m.rate(10.0), 2),
                                          "outbox_batches": self.cluster.outbox.unpublished()}
        except Exception as e:          # the numbers are a view; the lease renews without them
            log.debug("lease numbers: %r", e)

    def request_stop(self, why: str = "") -> None:
        if self.stop_event is not None and not self.stop_event.is_set():
            log.info("stop requested reason=%s", why)
            self.state = "stopping"
            self.stop_event.set()

    def reload(self) -> None:
        """SIGHUP: re-read runtime keys from the config file; a bad file keeps the old values."""
        self.notifier.reloading()
        try:
            cfg = configmod.load(self.config_path, self.overrides)
            self.shard.reload(cfg)
            log.info("config reloaded blocklist=%d", len(cfg.blocklist.hosts))
        except ConfigError as e:
            log.error("reload failed, keeping current config: %s", e)
        except Exception as e:
            log.error("reload failed: %r", e)
        finally:
            self.notifier.ready()

    # -- control socket -------------------------------------------------------------------
    def _shard_views(self, detail: bool = True) -> list[dict]:
        """Each shard's own status dict (one shard today; the list is the shape for several)."""
        return [self.shard.status(detail=detail)] if self.shard else []

    def status(self, views: list[dict] | None = None) -> dict:
        snap = self.metrics.snapshot()
        views = self._shard_views(detail=False) if views is None else views

        def total(key: str) -> int:
            return sum(v.get(key, 0) for v in views)
        return {
            "state": self._state(),
            "pid": os.getpid(), "data_dir": self.cfg.crawl.data_dir,
            "metrics_url": self.metrics_endpoint.url if self.metrics_endpoint else "",
            "uptime_s": snap["uptime_s"], "pages": snap["pages"],
            "pages_per_s_10s": snap["pages_per_s_10s"], "pages_per_s_60s": snap["pages_per_s_60s"],
            "queued": total("queued"), "hosts_active": total("hosts_active"),
            "working_set_hosts": total("working_set_hosts"), "sessions_started": total("sessions_started"),
            "in_flight": total("in_flight"), "leases": total("leases"), "processing": total("processing"),
            "outcomes": snap["outcomes"], "statuses": snap["statuses"],
            "errors": sum(v for k, v in snap["outcomes"].items() if k not in NOT_ERRORS),
            "shard": self.member or 0,
            "shards": [{k: v.get(k) for k in SHARD_SUMMARY} | {"loop_lag": v["loop_lag"],
                                                               "loop_lag_recent_max_s": v["loop_lag"]["recent_max_s"]}
                       | {"state": self._state(), "restarts": 0, "pages_per_s_60s": snap["pages_per_s_60s"],
                          "handoff": v.get("handoff", {})}
                       for v in views],
        }

    def _state(self) -> str:
        """running, paused, "paused (disk full: <path>)", starting, stopping, stopped."""
        sh = self.shard
        if sh is None or self.state != "running":
            return self.state
        if sh.storage.reason:
            return f"paused ({sh.storage.reason})"
        return "paused" if sh.paused else "running"

    def stats(self) -> dict:
        snap = self.metrics.snapshot(top=20)
        views = self._shard_views()
        # every shard's figures in one (aggregate.merge: sums, maxima, settings once); per shard under "shards"
        sh = aggregate.merge([{k: v[k] for k in SHARD_TOTALS if k in v} for v in views])
        ru = os.times()
        workers = sh.get("worker_cpu_s", {})
        procs = [p for v in views for p in v["processes"]]
        if all(p["pid"] != os.getpid() for p in procs):
            procs.insert(0, process_usage("supervisor", os.getpid()))
        backed_off = sorted((h for v in views for h in v["hosts_backed_off"]), key=lambda h: -h["failures"])
        return {**self.status(views), "bytes": snap["bytes"], "dropped": snap["dropped"],
                "counters": snap["counters"], "top_hosts": snap["top_hosts"],
                "frontier": sh.get("frontier", {}), "seen_pending": sh.get("seen_pending", 0),
                "recent_errors": sh.get("recent_errors", [])[-10:],
                "cpu_s": round(ru.user + ru.system + sum(workers.values()), 3),
                "cpu_by_process_s": {"crawl": round(ru.user + ru.system, 3),
                                     **{f"worker-{pid}": round(c, 3) for pid, c in workers.items()}},
                "worker_restarts": sh.get("worker_restarts", 0),
                "budgets": sh.get("budgets", {}), "recrawl": sh.get("recrawl", {}),
                "requests": sum(sum(v["fetcher"].get("outcomes", {}).values()) for v in views),
                "processes": procs, "hosts_backed_off": backed_off[:10], "shards": views,
                "fetcher": sh.get("fetcher", {}), "dust": sh.get("dust", {}),
                "memory": sh.get("memory", {}), "body_pool_fallbacks": sh.get("body_pool_fallbacks", {}),
                "near_index": sh.get("near_index", {}),
                "malloc": sh.get("malloc", {}), "unlanded": sh.get("unlanded", {}),
                **({"ip_turns": self.cluster.ips.snapshot()} if self.cluster and self.cluster.ips else {})}

    def _handlers(self) -> dict:
        def seed_add(req):
            urls = req.get("urls")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ValueError("seed_add needs 'urls': a list of strings")
            n = self.shard.submit_urls(urls, depth=0, priority=0)
            answer = {"submitted": n, "invalid": len(urls) - n}
            kept = self.shard.links_barrier()
            if kept is None:
                return answer

            async def once_kept():
                await kept          # answered once the seen-set's intake log holds them
                return answer
            return once_kept()

        def block(req):
            pat = req.get("pattern")
            if not isinstance(pat, str) or not pat:
                raise ValueError("needs 'pattern': a host or domain")
            return pat.strip().lower()

        def pause(_):
            self.shard.paused = True
            return {"state": "paused"}

        def resume(_):
            self.shard.paused = False
            self.shard.storage.retry_now()      # a storage fault is probed at once
            return {"state": self._state()}

        def checkpoint(_):
            self.shard.checkpoint()
            return {"checkpointed": True}

        def stop(_):
            self.request_stop("control")
            return {"state": "stopping"}

        def url_why(req):
            url = req.get("url")
            if not isinstance(url, str) or not url:
                raise ValueError("url_why needs 'url': a URL")
            return whynot.explain(self.shard, url)       # awaited by the control server

        def block_add(req):
            self.shard.frontier.block(block(req))
            return {"blocked": self.shard.frontier.blocked()}

        def block_remove(req):
            self.shard.frontier.unblock(block(req))
            return {"blocked": self.shard.frontier.blocked()}

        return {
            "status": lambda _: self.status(),
            "stats": lambda _: self.stats(),
            "metrics": lambda _: {"text": render_text(self.stats())},
            "seed_add": seed_add, "pause": pause, "resume": resume, "checkpoint": checkpoint, "stop": stop,
            "block_add": block_add, "block_remove": block_remove,
            "block_list": lambda _: {"blocked": self.shard.frontier.blocked()},
            "url_why": url_why,
        }

    def _write_last_run(self) -> None:
        """<data_dir>/last-run.json (a member's: shards/<i>/last-run.json): see ``write_last_run``."""
        write_last_run(self.last_run_path, self.stats())

    @property
    def last_run_path(self) -> str:
        if self.member is None:
            return self.cfg.path("last-run.json")
        return os.path.join(layout.shard_dir(self.cfg.crawl.data_dir, self.member), "last-run.json")

    def reserve_last_run(self) -> None:
        reserve_last_run(self.last_run_path)

    def close(self) -> None:
        if self.parts is not None:
            self.parts.close()
            self.parts = None
        release_data_dir(self._lock_fd)
        self._lock_fd = None
        self.notifier.close()


def _die_with_parent() -> None:
    """A member shard gets SIGTERM (an ordered drain) when its family supervisor dies (Linux)."""
    import ctypes
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)       # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os.kill(os.getpid(), signal.SIGTERM)      # the parent died before prctl
