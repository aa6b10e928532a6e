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
import fcntl
import gc
import logging
import os
import signal
import sys
import time

from crawlerd import config as configmod
from crawlerd import control, layout
from crawlerd import url as urlmod
from crawlerd.config import Config, ConfigError
from crawlerd.metrics import Metrics, prometheus
from crawlerd.outcome import Outcome
from crawlerd.sdnotify import Notifier
from crawlerd.shard import Shard, data_dir_problem
from crawlerd.shard.member import MemberError, MemberParts, open_member
from crawlerd.store.recover import recover as recover_warc

log = logging.getLogger("crawlerd")

# outcomes that are the crawl working as intended, not trouble (the rest count as errors in status)
NOT_ERRORS = frozenset(o.value for o in (Outcome.OK, Outcome.NOT_MODIFIED, Outcome.ROBOTS_DENIED,
                                         Outcome.ROBOTS_UNAVAILABLE, Outcome.BLOCKED, Outcome.ABORTED))


class StartupError(Exception):
    """A one-line reason the daemon cannot start (bad seeds file, data dir in use, ...)."""


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


def read_seeds(path: str) -> tuple[list[str], int]:
    """Seed URLs from a file (one per line, # comments); returns (valid, invalid count)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise StartupError(f"cannot read seeds file {path}: {e.strerror}") from None
    good, bad = [], 0
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if urlmod.normalize(line) is None:
            bad += 1
            log.warning("seed skipped: not an http(s) URL url=%r", line[:200])
        else:
            good.append(line)
    return good, bad


class Supervisor:
    def __init__(self, cfg: Config, *, seeds_files: list[str] = (), duration_s: float | None = None,
                 notifier: Notifier | None = None, on_tick=None, config_path: str | None = None,
                 overrides: list[str] = (), member: int | None = None):
        """``member``: this process runs shard ``member`` of a family (``crawl.shards`` > 1)."""
        self.cfg = cfg
        self.member = member
        self.parts: MemberParts | None = None
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

    # -- preparation (synchronous, before the loop) ------------------------------
    def prepare(self) -> list[str]:
        problem = data_dir_problem(self.cfg.crawl.data_dir)
        if problem:
            raise StartupError(problem)
        if self.member is not None:
            try:
                self.parts = open_member(self.cfg, self.member)
            except MemberError as e:
                raise StartupError(str(e)) from None
            return []
        self._lock_fd = os.open(self.cfg.path("lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartupError(f"data dir {self.cfg.crawl.data_dir} is in use by another crawlerd") from None
        seeds: list[str] = []
        files = self.seeds_files or ([self.cfg.crawl.seeds_file] if self.cfg.crawl.seeds_file else [])
        for path in files:
            good, bad = read_seeds(path)
            seeds += good
            self.seeds_invalid += bad
        try:
            for line in layout.prepare(self.cfg.crawl.data_dir, self.cfg.crawl.shards):
                log.info("data dir: %s", line)
        except (layout.LayoutError, OSError) as e:
            raise StartupError(str(e)) from None
        os.makedirs(self.cfg.path("warc"), exist_ok=True)
        for line in recover_warc(self.cfg.path("warc"), index_dir=self.cfg.path("index")):
            log.info("warc recovery: %s", line)
        return seeds

    def run(self) -> int:
        import uvloop
        seeds = self.prepare()
        return uvloop.run(self._main(seeds))

    # -- the loop ---------------------------------------------------------------------
    async def _main(self, seeds: list[str]) -> int:
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        if self.parts is not None:
            _die_with_parent()
            self.shard = Shard(self.cfg, self.metrics, index=self.member, shards=self.cfg.crawl.shards,
                               **self.parts.kwargs())
        else:
            self.shard = Shard(self.cfg, self.metrics)
        self.metrics.dropped["invalid_seed"] += self.seeds_invalid
        # hosts of configured sitemaps are seeded, so their robots.txt (and with it the sitemaps) is read
        roots = [urlmod.host_key(u) + "/" for u in (urlmod.normalize(x) for x in self.cfg.sitemaps.urls) if u]
        if self.member is not None:
            roots = []                  # the family hands seeds and sitemap hosts to their owners
        if seeds or roots:
            self.shard.submit_urls(seeds + roots, depth=0, priority=0)
        # long-lived start-up objects leave the collector's view; fewer gen-0 passes on the hot path
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        server = control.ControlServer(self.control_path, self._handlers())
        try:
            await server.start()
        except (control.ControlError, OSError) as e:
            self.shard.frontier.close()
            await self.shard.seen.close()
            raise StartupError(str(e) if isinstance(e, control.ControlError) else
                               f"cannot listen on control socket {self.control_path}: {e.strerror}") from None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGQUIT, faulthandler.dump_traceback)
        self.state = "running"
        self.notifier.ready(f"crawling; {len(seeds)} seeds")
        log.info("started pid=%d data_dir=%s seeds=%d", os.getpid(), self.cfg.crawl.data_dir, len(seeds))
        ticker = asyncio.ensure_future(self._ticker())
        timer = loop.call_later(self.duration_s, self.request_stop, "duration") if self.duration_s else None
        try:
            # a family counts crawl.max_pages over all its shards
            await self.shard.run(self.stop_event, max_pages=self.cfg.crawl.max_pages if self.member is None else 0)
        finally:
            self.state = "stopping"
            self.notifier.stopping("draining")
            if timer:
                timer.cancel()
            ticker.cancel()
            await server.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
                loop.remove_signal_handler(sig)
            self.state = "stopped"
            self._write_last_run()
            log.info("stopped pages=%d", self.metrics.pages)
        return 0

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
            try:
                s = self.status()
                self.notifier.status(f"{s['pages']} pages, {s['pages_per_s_10s']:.1f}/s, {s['queued']} queued")
                if self.on_tick is not None:
                    self.on_tick(self, s)
            except Exception as e:     # the watchdog pings above must go on whatever status does
                log.error("status tick failed: %r", e)

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
    def status(self) -> dict:
        snap = self.metrics.snapshot()
        sh = self.shard.status() if self.shard else {}
        return {
            "state": "paused" if (self.shard and self.shard.paused and self.state == "running") else self.state,
            "pid": os.getpid(), "data_dir": self.cfg.crawl.data_dir,
            "uptime_s": snap["uptime_s"], "pages": snap["pages"],
            "pages_per_s_10s": snap["pages_per_s_10s"], "pages_per_s_60s": snap["pages_per_s_60s"],
            "queued": sh.get("queued", 0), "hosts_active": sh.get("hosts_active", 0),
            "in_flight": sh.get("in_flight", 0), "outcomes": snap["outcomes"], "statuses": snap["statuses"],
            "errors": sum(v for k, v in snap["outcomes"].items() if k not in NOT_ERRORS),
            "shard": self.member or 0, "shards": [self._summary(snap, sh)],
        }

    def _summary(self, snap: dict, sh: dict) -> dict:
        """This process's line in the ``shards`` list of ``status`` (a family lists one per shard)."""
        state = "paused" if (self.shard and self.shard.paused and self.state == "running") else self.state
        return {"shard": self.member or 0, "pid": os.getpid(), "state": state, "restarts": 0,
                "pages": snap["pages"], "pages_per_s_10s": snap["pages_per_s_10s"],
                "pages_per_s_60s": snap["pages_per_s_60s"], "in_flight": sh.get("in_flight", 0),
                "queued": sh.get("queued", 0), "hosts_active": sh.get("hosts_active", 0),
                "handoff": sh.get("handoff", {})}

    def stats(self) -> dict:
        snap = self.metrics.snapshot(top=20)
        sh = self.shard.status() if self.shard else {}
        ru = os.times()
        workers = sh.get("worker_cpu_s", {})
        return {**self.status(), "bytes": snap["bytes"], "dropped": snap["dropped"],
                "counters": snap["counters"], "top_hosts": snap["top_hosts"],
                "frontier": sh.get("frontier", {}), "seen_pending": sh.get("seen_pending", 0),
                "recent_errors": sh.get("recent_errors", []),
                "cpu_s": round(ru.user + ru.system + sum(workers.values()), 3),
                "cpu_by_process_s": {"crawl": round(ru.user + ru.system, 3),
                                     **{f"worker-{pid}": round(c, 3) for pid, c in workers.items()}},
                "worker_restarts": sh.get("worker_restarts", 0),
                "budgets": sh.get("budgets", {}), "recrawl": sh.get("recrawl", {})}

    def _handlers(self) -> dict:
        def seed_add(req):
            urls = req.get("urls")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ValueError("seed_add needs 'urls': a list of strings")
            n = self.shard.submit_urls(urls, depth=0, priority=0)
            return {"submitted": n, "invalid": len(urls) - n}

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
            return {"state": "running"}

        def checkpoint(_):
            self.shard.checkpoint()
            return {"checkpointed": True}

        def stop(_):
            self.request_stop("control")
            return {"state": "stopping"}

        def block_add(req):
            self.shard.frontier.block(block(req))
            return {"blocked": self.shard.frontier.blocked()}

        def block_remove(req):
            self.shard.frontier.unblock(block(req))
            return {"blocked": self.shard.frontier.blocked()}

        return {
            "status": lambda _: self.status(),
            "stats": lambda _: self.stats(),
            "metrics": lambda _: {"text": prometheus(self.metrics.snapshot(),
                                                     {"queued": self.status()["queued"]})},
            "seed_add": seed_add, "pause": pause, "resume": resume, "checkpoint": checkpoint, "stop": stop,
            "block_add": block_add, "block_remove": block_remove,
            "block_list": lambda _: {"blocked": self.shard.frontier.blocked()},
        }

    def _write_last_run(self) -> None:
        """<data_dir>/last-run.json: the final stats of this run (temp name, fsync, rename)."""
        import json
        path = (self.cfg.path("last-run.json") if self.member is None else
                os.path.join(layout.shard_dir(self.cfg.crawl.data_dir, self.member), "last-run.json"))
        tmp = path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.stats(), f, indent=1, sort_keys=True, default=str)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            log.error("cannot write %s: %s", path, e.strerror)

    def close(self) -> None:
        if self.parts is not None:
            self.parts.close()
            self.parts = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
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
