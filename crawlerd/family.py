"""The family supervisor: ``crawlerd run`` with ``crawl.shards`` > 1, one process per shard.

Start-up: claim the data dir (exclusive lock) → check or record the shard count
(``layout.prepare``) → recover torn WARC segments → a fresh per-IP slot table → hand the seeds
(and the hosts of configured sitemaps) to their owners through the hand-off (source N, written
before any shard starts) → start every shard (``crawlerd run --member i``, which imports the
very package this process runs) → listen on the control socket → READY=1 once every shard
answers.

Watching: a shard that dies is restarted alone (its cells in the slot table are freed first);
its partition resumes from its own state and the others keep crawling. A shard that dies
``CRASH_LOOP_DEATHS`` times in a row within ``CRASH_LOOP_WINDOW_S`` of its start stops the
daemon with that reason (exit 1), never a restart loop. Every second the family asks each
shard's ``status``: sd_notify STATUS is the family's total, and WATCHDOG=1 is sent only while
every shard is answering or being restarted.

Control: ``status``/``stats``/``metrics`` add up every shard (``aggregate``) and list them
(``shards``); with ``"shard": i`` they are shard i's own answer. ``seed_add`` hands seeds to
their owners; ``pause``/``resume``/``checkpoint``/``block_*`` go to every shard. SIGHUP is
validated here and passed to every shard, each re-reading the config file.

In a cluster (``cluster.servers``; ``crawlerd run --cluster ... --own ...``) the family runs only
the shards this node owns (``cluster.own``), after the cluster agreed to its N
(``cluster.node.check_cluster``); seeds go to their owners over JetStream (``SeedSender``), and
a shard whose lease another node holds, or took, ends with ``EXIT_NOT_OWNER``: it is no crash,
its process is started again after ``cluster.lease_ttl_s`` to ask once more (a standby).

Shutdown (SIGTERM, SIGINT, ``crawlerd stop``, ``--duration``, ``crawl.max_pages``): every shard
is paused first (no new request anywhere), then each drains in its own ordered shutdown (its
outbox flushed: what it handed over stays in the receivers' spools for their next start); a
shard that outlives ``fetch.shutdown_grace_s`` + 60 s is killed. Then ``last-run.json`` (the
shards' final stats added up), the control socket removed, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import logging
import os
import signal
import time
from collections import deque

from crawlerd import aggregate, control, layout
from crawlerd import config as configmod
from crawlerd.allocator import tune_malloc
from crawlerd.child import child_env, python_argv
from crawlerd.config import Config, ConfigError
from crawlerd.exposition import render, render_text
from crawlerd.last_run import reserve_last_run, write_last_run
from crawlerd.metrics_server import MetricsServer
from crawlerd.sdnotify import Notifier
from crawlerd.shard import data_dir_problem, encode_aux
from crawlerd.shard.member import outbox_for
from crawlerd.startup import StartupError, claim_data_dir, release_data_dir
from crawlerd.store.recover import recover as recover_warc
from crawlerd.supervisor import EXIT_NOT_OWNER
from crawlerd.url.canonical import fingerprint, normalize
from crawlerd.url.hosts import host_key, shard_of_url

log = logging.getLogger("crawlerd.family")

CRASH_LOOP_DEATHS = 3           # deaths in a row, each within the window of its start: a crash loop
CRASH_LOOP_WINDOW_S = 30.0
RESTART_DELAYS_S = (0.0, 0.5, 2.0)
POLL_S = 1.0                    # status of every shard, this often
ASK_TIMEOUT_S = 5.0
READY_TIMEOUT_S = 120.0


class Member:
    """One shard process. Invariant: ``proc`` is the live process of shard ``index`` or None."""

    def __init__(self, index: int):
        self.index = index
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self.restarts = 0
        self.quick_deaths: deque[float] = deque(maxlen=CRASH_LOOP_DEATHS)
        self.last: dict | None = None           # its last status answer
        self.last_at = 0.0
        self.ready = False
        self.stopping = False
        self.standby = ""                       # why another node runs this shard now ("" if none)
        self.watcher: asyncio.Task | None = None


class Family:
    """Starts, watches and restarts the shard processes; one control socket for all of them."""

    def __init__(self, cfg: Config, *, seeds_files: list[str] = (), duration_s: float | None = None,
                 notifier: Notifier | None = None, config_path: str | None = None, overrides: list[str] = ()):
        self.cfg = cfg
        self.n = cfg.crawl.shards
        self.seeds_files = list(seeds_files)
        self.duration_s = duration_s
        self.notifier = notifier or Notifier()
        self.config_path = config_path
        self.overrides = list(overrides)
        self.clustered = bool(cfg.cluster.servers)
        # the shards this process runs: all of them, or this node's share of a cluster's
        self.own = configmod.parse_shard_set(cfg.cluster.own, self.n) if self.clustered and cfg.cluster.own \
            else list(range(self.n))
        self.members = [Member(i) for i in self.own]
        self._by_index = {m.index: m for m in self.members}
        self._pending_seeds: list[str] = []     # a cluster's seeds, handed over once the loop runs
        self.state = "starting"
        self.fatal = ""
        self.started = time.monotonic()
        self.retired = aggregate.Retired()
        self.seeds_invalid = 0
        self.stop_event: asyncio.Event | None = None
        self._lock_fd: int | None = None
        self._slots = None
        self._final: dict = {}
        self._stats_cache: dict = {}        # the last aggregated stats, for the metrics endpoint
        self._seeds_out = None              # `seed add`'s outbox (source N), its flusher on the loop

    # -- preparation ----------------------------------------------------------------------
    def prepare(self) -> int:
        """Lock, layout, WARC recovery, the slot table, seeds handed over; returns seeds handed over."""
        d = self.cfg.crawl.data_dir
        problem = data_dir_problem(d)
        if problem:
            raise StartupError(problem)
        self._lock_fd, seeds, self.seeds_invalid = claim_data_dir(self.cfg, self.n, self.seeds_files)
        reserve_last_run(self.cfg.path("last-run.json"))
        for i in range(self.n):     # a shard's final stats of this run, not of an earlier one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(layout.shard_dir(d, i), "last-run.json"))
        os.makedirs(self.cfg.path("warc"), exist_ok=True)
        for line in recover_warc(self.cfg.path("warc"), index_dir=self.cfg.path("index")):
            log.info("warc recovery: %s", line)
        from crawlerd._native.ipslots import IPSlots, create
        create(layout.ipslots_path(d), self.n, self.cfg.politeness.per_ip_concurrency,
               self.cfg.politeness.shared_ip_slots)
        self._slots = IPSlots(layout.ipslots_path(d))
        roots = [host_key(u) + "/" for u in (normalize(x) for x in self.cfg.sitemaps.urls) if u]
        if self.clustered:
            from crawlerd.cluster.node import ClusterError, check_cluster
            try:
                asyncio.run(check_cluster(self.cfg))
            except ClusterError as e:
                raise StartupError(str(e)) from None
            self._pending_seeds = seeds + roots
            return 0
        return asyncio.run(self.hand_seeds(seeds + roots)) if seeds or roots else 0

    async def hand_seeds(self, urls: list[str]) -> int:
        """Seeds to their owners' inboxes (durable when this returns); returns how many."""
        by_owner: dict[int, list[tuple[int, bytes]]] = {}
        for raw in urls:
            norm = normalize(raw)
            if norm is None:
                continue
            owner = shard_of_url(norm, self.n)
            by_owner.setdefault(owner, []).append((fingerprint(norm), encode_aux(0, 0, 0, norm)))
        outbox = self._seeds_out
        if outbox is None:              # before the loop (the seeds file): one outbox, one flush
            outbox = outbox_for(self.cfg, self.n, range(self.n))
        for dest, records in by_owner.items():
            outbox.stage(dest, records)
        await outbox.flush()
        if outbox is not self._seeds_out:
            await outbox.close()
        return sum(len(r) for r in by_owner.values())

    def run(self) -> int:
        import uvloop
        tune_malloc(self.cfg.malloc.mmap_threshold_bytes, self.cfg.malloc.arena_max)
        handed = self.prepare()
        log.info("seeds handed to their shards: %d", handed)
        return uvloop.run(self._main())

    # -- the loop ----------------------------------------------------------------------------
    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self.stop_event = asyncio.Event()
        server = control.ControlServer(self.cfg.control_socket, self._handlers())
        try:
            await server.start()
        except (control.ControlError, OSError) as e:
            raise StartupError(str(e) if isinstance(e, control.ControlError) else
                               f"cannot listen on control socket {self.cfg.control_socket}: {e.strerror}") from None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGQUIT, faulthandler.dump_traceback)
        timer = loop.call_later(self.duration_s, self.request_stop, "duration") if self.duration_s else None
        ticker = None
        endpoint = None
        if self.cfg.metrics.listen:     # scrapes read the shards' stats as of the last poll
            endpoint = MetricsServer(self.cfg.metrics.listen, lambda accept: render(self._stats_cache, accept))
            try:
                await endpoint.start()
            except OSError as e:
                await server.close()
                raise StartupError(f"metrics.listen = {self.cfg.metrics.listen!r}: cannot listen: "
                                   f"{e.strerror}") from None
            log.info("metrics endpoint url=%s", endpoint.url)
        try:
            if self.clustered:
                from crawlerd.cluster.node import ClusterError, SeedSender
                try:
                    self._seeds_out = await SeedSender(self.cfg).open()
                except ClusterError as e:
                    raise StartupError(str(e)) from None
                if self._pending_seeds:
                    log.info("seeds handed to their shards: %d", await self.hand_seeds(self._pending_seeds))
            else:
                self._seeds_out = outbox_for(self.cfg, self.n, range(self.n))
                self._seeds_out.start()             # concurrent `seed add`s share one flusher
            for m in self.members:
                await self._spawn(m)
            await self._wait_ready()
            if not self.stop_event.is_set():
                self.state = "running"
                self.notifier.ready(f"crawling; {len(self.members)} of {self.n} shards")
                log.info("started pid=%d data_dir=%s shards=%d own=%s", os.getpid(), self.cfg.crawl.data_dir,
                         self.n, ",".join(map(str, self.own)))
            ticker = asyncio.ensure_future(self._ticker())
            await self.stop_event.wait()
        finally:
            self.state = "stopping"
            self.notifier.stopping("draining")
            if timer:
                timer.cancel()
            if ticker:
                ticker.cancel()
            if self._seeds_out is not None:
                await self._seeds_out.close()
            await self._drain()
            if endpoint is not None:
                await endpoint.close()
            await server.close()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
                loop.remove_signal_handler(sig)
            self.state = "stopped"
            self._write_last_run()
            log.info("stopped pages=%d", self._final.get("pages", 0))
        if self.fatal:
            raise StartupError(self.fatal)
        return 0

    def _argv(self, index: int) -> list[str]:
        args = ["run", "--member", str(index), "--data-dir", self.cfg.crawl.data_dir]
        if self.config_path:
            args += ["--config", self.config_path]
        for o in self.overrides:
            args += ["-s", o]
        args += ["-s", f"crawl.shards={self.n}"]
        return python_argv("crawlerd", *args)

    async def _spawn(self, m: Member) -> None:
        env = child_env(drop=("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"))
        m.proc = await asyncio.create_subprocess_exec(*self._argv(m.index), env=env, stdin=asyncio.subprocess.DEVNULL)
        m.started_at = time.monotonic()
        m.ready = False
        m.stopping = False
        m.watcher = asyncio.ensure_future(self._watch(m, m.proc))
        log.info("shard %d started pid=%d", m.index, m.proc.pid)

    async def _watch(self, m: Member, proc: asyncio.subprocess.Process) -> None:
        rc = await proc.wait()
        if m.proc is proc:
            m.proc = None
        if m.stopping or self.stop_event.is_set():
            return                          # its final counts are in its last-run.json
        if m.last:
            self.retired.add(m.last)        # a death: its counters stay in the family's totals
            m.last = None
        lived = time.monotonic() - m.started_at
        if rc == EXIT_NOT_OWNER:            # another node runs it: ask again once a lease could expire
            m.standby = "held by another node"
            log.warning("shard %d: another node holds its lease; asking again in %.0f s", m.index,
                        self.cfg.cluster.lease_ttl_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), self.cfg.cluster.lease_ttl_s)
            if not self.stop_event.is_set():
                await self._spawn(m)
            return
        m.standby = ""
        log.error("shard %d died: exit status %s after %.1f s; restarting it alone", m.index, rc, lived)
        if self._slots is not None:     # its cut-off requests end now: their IPs' gaps start now
            self._slots.reclaim(m.index, time.monotonic(), self.cfg.politeness.ip_delay_s)
        if lived < CRASH_LOOP_WINDOW_S:
            m.quick_deaths.append(lived)
        else:
            m.quick_deaths.clear()
        if len(m.quick_deaths) >= CRASH_LOOP_DEATHS:
            self.fatal = (f"shard {m.index} died {len(m.quick_deaths)} times within {CRASH_LOOP_WINDOW_S:g} s of "
                          f"starting (last exit status {rc}); its error is logged above")
            log.error("giving up: %s", self.fatal)
            self.request_stop("crash loop")
            return
        await asyncio.sleep(RESTART_DELAYS_S[min(len(m.quick_deaths), len(RESTART_DELAYS_S) - 1)])
        if not self.stop_event.is_set():
            m.restarts += 1
            await self._spawn(m)

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.stop_event.is_set() and not all(m.ready or m.standby for m in self.members):
            await self._poll()
            if time.monotonic() > deadline:
                late = [m.index for m in self.members if not (m.ready or m.standby)]
                self.fatal = f"shards {late} did not answer within {READY_TIMEOUT_S:g} s of starting"
                self.request_stop("start timeout")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), 0.2)

    async def _poll(self) -> None:
        """Ask every live shard for its status (kept in ``last``)."""
        async def one(m: Member):
            if m.proc is None:
                return
            try:
                r = await control.ask(layout.shard_socket(self.cfg.crawl.data_dir, m.index), "status",
                                      timeout_s=ASK_TIMEOUT_S)
            except control.ControlError:
                return
            if r.get("ok"):
                m.last, m.last_at, m.ready, m.standby = r, time.monotonic(), True, ""
        await asyncio.gather(*(one(m) for m in self.members))
        if self.cfg.metrics.listen:
            self._stats_cache = self.status_view(await self._ask_all("stats"), kind="stats")

    async def _ticker(self) -> None:
        wd = self.notifier.watchdog_interval_s
        last_wd = 0.0
        poll: asyncio.Task | None = None
        # a shard is unhealthy once it has not answered for this long (a busy loop answers late)
        silence_s = max(3 * POLL_S + ASK_TIMEOUT_S, 3 * (wd or 0))
        while True:
            await asyncio.sleep(POLL_S)
            if poll is None or poll.done():     # a slow shard never delays the watchdog's pings
                poll = asyncio.ensure_future(self._poll())
            now = time.monotonic()
            # the watchdog is fed only while the whole family answers (a restart in progress counts)
            healthy = all(m.proc is None or now - m.last_at < silence_s or
                          now - m.started_at < READY_TIMEOUT_S and not m.ready for m in self.members)
            if wd and healthy and now - last_wd >= wd:
                self.notifier.watchdog()
                last_wd = now
            s = self.status_view()
            up = sum(1 for m in self.members if m.proc is not None and m.ready)
            self.notifier.status(f"{s['pages']} pages, {s['pages_per_s_10s']:.1f}/s, {s['queued']} queued, "
                                 f"{up}/{len(self.members)} shards up")
            if self.cfg.crawl.max_pages and s["pages"] >= self.cfg.crawl.max_pages:
                self.request_stop("max_pages")

    # -- stop, reload -------------------------------------------------------------------------
    def request_stop(self, why: str = "") -> None:
        if self.stop_event is not None and not self.stop_event.is_set():
            log.info("stop requested reason=%s", why)
            self.state = "stopping"
            self.stop_event.set()

    async def _drain(self) -> None:
        live = [m for m in self.members if m.proc is not None]
        await self._broadcast("pause", live)            # no new request anywhere, then drain each
        for m in live:
            m.stopping = True
            with contextlib.suppress(ProcessLookupError):
                m.proc.send_signal(signal.SIGTERM)
        limit = self.cfg.fetch.shutdown_grace_s + 60.0
        for m in live:
            proc = m.proc
            if proc is None:
                continue
            try:
                await asyncio.wait_for(proc.wait(), limit)
            except TimeoutError:
                log.error("shard %d did not stop within %.0f s: killed", m.index, limit)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for m in self.members:
            if m.watcher is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await m.watcher

    def reload(self) -> None:
        """SIGHUP: the config file must still be valid; then every shard re-reads it."""
        self.notifier.reloading()
        try:
            configmod.load(self.config_path, self.overrides)
            for m in self.members:
                if m.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        m.proc.send_signal(signal.SIGHUP)
            log.info("reload passed to %d shards", len(self.members))
        except ConfigError as e:
            log.error("reload failed, keeping current config: %s", e)
        finally:
            self.notifier.ready()

    # -- views ----------------------------------------------------------------------------------
    def summaries(self) -> list[dict]:
        out = []
        for m in self.members:
            s = (m.last or {}).get("shards", [{}])[0] if m.last else {}
            state = s.get("state", "down") if m.proc is not None else ("stopped" if m.stopping else "down")
            if m.standby and not m.ready:
                state = "standby"
            out.append({"shard": str(m.index), "pid": m.proc.pid if m.proc is not None else None,
                        "state": state if m.ready or m.proc is None else "starting", "restarts": m.restarts,
                        **{k: s.get(k, 0) for k in ("pages", "pages_per_s_10s", "pages_per_s_60s", "in_flight",
                                                    "leases", "processing", "queued", "hosts_active",
                                                    "working_set_hosts", "sessions_started")},
                        "handoff": s.get("handoff", {}), "loop_lag": s.get("loop_lag", {})})
        return out

    def _family_state(self) -> str:
        if self.state != "running":
            return self.state
        states = {(m.last or {}).get("state") for m in self.members if m.last}
        return "paused" if states == {"paused"} else "running"

    def status_view(self, views: list[dict | None] | None = None, kind: str = "status") -> dict:
        views = [m.last for m in self.members] if views is None else views
        ru = os.times()
        v = aggregate.family_view(views, kind=kind, state=self._family_state(), pid=os.getpid(),
                                  data_dir=self.cfg.crawl.data_dir, uptime_s=time.monotonic() - self.started,
                                  summaries=self.summaries(), retired=self.retired,
                                  own_cpu_s=ru.user + ru.system)
        v["dropped"] = dict(v.get("dropped", {}))
        if self.seeds_invalid:
            v["dropped"]["invalid_seed"] = v["dropped"].get("invalid_seed", 0) + self.seeds_invalid
        if self.clustered:
            from crawlerd.cluster.node import node_of
            v["cluster"] = {"node": node_of(self.cfg), "crawl": self.cfg.cluster.crawl, "shards": self.n,
                            "own": self.own, "standby": [m.index for m in self.members if m.standby],
                            "seeds_sent": getattr(self._seeds_out, "records_sent", 0)}
        return v

    async def _ask_all(self, cmd: str, members=None, **kw) -> list[dict | None]:
        async def one(m: Member):
            if m.proc is None:
                return None
            try:
                r = await control.ask(layout.shard_socket(self.cfg.crawl.data_dir, m.index), cmd,
                                      timeout_s=ASK_TIMEOUT_S, **kw)
            except control.ControlError as e:
                log.warning("shard %d did not answer %s: %s", m.index, cmd, e)
                return None
            return r if r.get("ok") else None
        return list(await asyncio.gather(*(one(m) for m in (members or self.members))))

    async def _broadcast(self, cmd: str, members=None, **kw) -> list[dict | None]:
        return await self._ask_all(cmd, members, **kw)

    def _one(self, req: dict) -> Member | None:
        i = req.get("shard")
        if i is None:
            return None
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.n:
            raise ValueError(f"no shard {i!r}: this crawl has shards 0..{self.n - 1}")
        return self._member(i)

    def _member(self, i: int) -> Member:
        if i not in self._by_index:
            raise ValueError(f"shard {i} is run by another node of the cluster (this node runs "
                             f"{','.join(map(str, self.own))}; `crawlerd cluster status` names its owner)")
        return self._by_index[i]

    def _handlers(self) -> dict:
        async def forward(cmd: str, m: Member, **args) -> dict:
            if m.proc is None:
                raise ValueError(f"shard {m.index} is not running (restarts {m.restarts})")
            r = await control.ask(layout.shard_socket(self.cfg.crawl.data_dir, m.index), cmd,
                                  timeout_s=ASK_TIMEOUT_S, **args)
            if not r.get("ok"):
                raise ValueError(r.get("error", f"shard {m.index}: {cmd} failed"))
            return r

        async def status(req):
            m = self._one(req)
            if m is not None:
                return await forward("status", m)
            return self.status_view(await self._ask_all("status"))

        async def stats(req):
            m = self._one(req)
            if m is not None:
                return await forward("stats", m)
            return self.status_view(await self._ask_all("stats"), kind="stats")

        async def metrics(req):
            m = self._one(req)
            s = (await forward("stats", m)) if m is not None else \
                self.status_view(await self._ask_all("stats"), kind="stats")
            return {"text": render_text(s)}

        async def seed_add(req):
            urls = req.get("urls")
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ValueError("seed_add needs 'urls': a list of strings")
            n = await self.hand_seeds(urls)
            return {"submitted": n, "invalid": len(urls) - n}

        async def url_why(req):
            raw = req.get("url")
            if not isinstance(raw, str) or not raw:
                raise ValueError("url_why needs 'url': a URL")
            url = normalize(raw)
            if url is None:
                raise ValueError(f"not a valid http(s) URL: {raw!r}")
            m = self._one(req)
            m = self._member(shard_of_url(url, self.n)) if m is None else m    # the URL's owner
            return dict(await forward("url_why", m, url=raw), shard=m.index)

        def each(cmd: str, reply: dict):
            async def run(req):
                active = [m for m in self.members if not m.standby]     # (a standby runs nothing)
                answers = await self._broadcast(cmd, active, **({"pattern": req["pattern"]} if "pattern" in req else {}))
                missing = [m.index for m, a in zip(active, answers, strict=True) if a is None]
                if missing:
                    raise ValueError(f"{cmd}: shards {missing} did not answer (not running or restarting)")
                return dict(reply, **({"blocked": answers[0].get("blocked", [])} if cmd.startswith("block") else {}))
            return run

        def stop(_):
            self.request_stop("control")
            return {"state": "stopping"}

        return {"status": status, "stats": stats, "metrics": metrics, "seed_add": seed_add,
                "pause": each("pause", {"state": "paused"}), "resume": each("resume", {"state": "running"}),
                "checkpoint": each("checkpoint", {"checkpointed": True}), "stop": stop,
                "block_add": each("block_add", {}), "block_remove": each("block_remove", {}),
                "block_list": each("block_list", {}), "url_why": url_why}

    # -- the end ------------------------------------------------------------------------------------
    def _write_last_run(self) -> None:
        """last-run.json: every shard's final stats (its own last-run.json) added up."""
        views = []
        for m in self.members:
            path = os.path.join(layout.shard_dir(self.cfg.crawl.data_dir, m.index), "last-run.json")
            try:
                with open(path) as f:
                    views.append(json.load(f))
            except (OSError, ValueError):
                views.append(None)
        for k, m in enumerate(self.members):
            if not views[k] and m.last:         # none, or only the room its start set aside
                views[k] = m.last               # killed before it wrote its own: its last answer
        self._final = self.status_view(views, kind="stats")
        write_last_run(self.cfg.path("last-run.json"), self._final)

    def close(self) -> None:
        if self._slots is not None:
            self._slots.close()
            self._slots = None
        release_data_dir(self._lock_fd)
        self._lock_fd = None
        self.notifier.close()

