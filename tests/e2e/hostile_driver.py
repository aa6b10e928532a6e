"""Hostile-web crawl driver, run inside a private network namespace by tests/e2e/test_hostile_crawl.py.

Serves the hostile hosts (``HostileServer`` on 0.0.0.0, one name per 127.0.1.x address), a DNS
server on 127.0.0.1 that maps those names and misbehaves for a few others, and a sentinel listener
on 127.200.0.1, an address outside ``network.allow`` that nothing may ever connect to. Then runs
the real daemon twice as a subprocess:

1. **hostile**: every hostile seed once (``frontier.max_attempts=1``, so each URL is fetched at
   most once and a retryable failure is dead-lettered under its outcome);
2. **drip-stop**: the drip URL (and a redirect to a name whose DNS answer is garbage), with the speed and time limits far beyond ``--duration``, so
   the transfer is still open when the duration elapses.

While each daemon runs, the peak RSS (VmHWM) of it and of its workers (its children) is sampled
from /proc. After each run the frontier is opened post mortem for the URLs it dropped or
dead-lettered. Everything the test judges is written as one JSON report.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

from crawlerd.frontier import Frontier
from crawlerd.simweb.dns import DnsServer
from crawlerd.simweb.hostile import HostileServer

ALLOW = "127.0.0.0/16"
FORBIDDEN_IP = "127.200.0.1"          # loopback, but outside ALLOW: the address guard refuses it
BOMB_BYTES = 256 << 20                # decoded size of the gzip/brotli bombs (raw: ~255 KiB / ~400 B)
MAX_BODY_BYTES = 1 << 20
MAX_DECODED_BYTES = 1 << 20
MAX_HEADER_BYTES = 16 << 10
MAX_REDIRECTS = 2
GRACE_S = 1.0

# name -> path served by HostileServer. Each name gets its own address so that per-IP politeness
# does not serialise the cases.
PAGES = {
    "ok.test": "/ok",
    "drip.test": "/drip",
    "driphead.test": "/drip-headers",
    "gzip.test": "/gzip-bomb",
    "brotli.test": "/br-bomb",
    "endless.test": "/endless-chunked",
    "hugehead.test": "/huge-headers",
    "badchunk.test": "/bad-chunked",
    "garbage.test": "/garbage",
    "reset.test": "/reset",
    "empty.test": "/empty",
    "closeearly.test": "/close-early",
    "loop.test": "/redirect-loop",
    # MAX_REDIRECTS + 2 hops before /ok: the chain is cut before its end
    "chain.test": "/redirect?to=" * (MAX_REDIRECTS + 2) + "/ok",
    "redirforbidden.test": "/redirect?to=http://forbidden-b.test:{sentinel}/secret",
    # the garbled name is reached late, through a redirect: a garbage DNS reply fails every query
    # still in flight on the same resolver socket (c-ares), so it must not overlap another lookup
    "togarbled.test": "/redirect?to=http://garbled.test:{port}/ok",
}
FORBIDDEN = ("forbidden-a.test", "forbidden-b.test")    # resolve to FORBIDDEN_IP
NXDOMAIN, SILENT, GARBLED = "gone.test", "mute.test", "garbled.test"


class Servers:
    """The hostile hosts, DNS and the sentinel, on an event loop in a background thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.hostile = HostileServer(bomb_bytes=BOMB_BYTES, max_stream_s=90.0)
        records = {name: ([f"127.0.1.{i + 1}"], 300) for i, name in enumerate(PAGES)}
        records.update({name: ([FORBIDDEN_IP], 300) for name in FORBIDDEN})
        self.dns = DnsServer(records, nxdomain=[NXDOMAIN], silent=[SILENT], garbage=[GARBLED])
        self.sentinel_hits: list[str] = []     # peers that connected to FORBIDDEN_IP
        self._sentinel = None

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> tuple[int, int]:
        _, port = await self.hostile.start("0.0.0.0", 0)
        await self.dns.start("127.0.0.1", 0)

        async def hit(reader, writer):
            peer = writer.get_extra_info("peername")
            self.sentinel_hits.append(f"{peer[0]}:{peer[1]}" if peer else "?")
            writer.close()

        self._sentinel = await asyncio.start_server(hit, FORBIDDEN_IP, 0)
        return port, self._sentinel.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self.hostile.close()
        self.dns.close()
        if self._sentinel is not None:
            self._sentinel.close()

    def __enter__(self) -> Servers:
        # build the bombs now: compressing 256 MiB must not stall the server loop mid-crawl
        _ = self.hostile.gzip_bomb, self.hostile.br_bomb
        self.thread.start()
        self.port, self.sentinel_port = self._call(self._start())
        return self

    def __exit__(self, *exc) -> None:
        self._call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10.0)

    def snapshot(self) -> dict:
        async def snap():
            return {"log": [list(e) for e in self.hostile.log], "connections": self.hostile.connections,
                    "sentinel_hits": list(self.sentinel_hits), "dns_queries": dict(self.dns.queries)}
        return self._call(snap())


def seed_urls(port: int, sentinel_port: int) -> dict[str, str]:
    """Case name -> seed URL."""
    seeds = {name: f"http://{name}:{port}{path.format(sentinel=sentinel_port, port=port)}"
             for name, path in PAGES.items()}
    seeds["forbidden-a.test"] = f"http://forbidden-a.test:{sentinel_port}/secret"
    for name in (NXDOMAIN, SILENT):
        seeds[name] = f"http://{name}:{port}/ok"
    return seeds


# the second run crawls these; the first crawls every seed but SECOND_ONLY
SECOND_RUN = ("drip.test", "togarbled.test")
SECOND_ONLY = ("togarbled.test",)


# -- observing the daemon --------------------------------------------------------------------
def _proc_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        return out
    return out


def _family(pid: int) -> list[int]:
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.append(p)
            todo += _children(p)
    return seen


def _stop_requested_at(stderr: str) -> float | None:
    """Wall time of the daemon's "stop requested" log line (its own UTC timestamp)."""
    for line in stderr.splitlines():
        if "stop requested" in line:
            stamp = line.split(" ", 1)[0].rstrip("Z")
            return datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()
    return None


def read_events(data_dir: str) -> list[dict]:
    events_dir = os.path.join(data_dir, "events")
    out = []
    for name in sorted(os.listdir(events_dir)) if os.path.isdir(events_dir) else ():
        with open(os.path.join(events_dir, name)) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def post_mortem(data_dir: str) -> dict:
    """What the frontier holds after the run: dropped and dead-lettered URLs with reasons, counters."""
    fr = Frontier(os.path.join(data_dir, "shards", "0", "frontier"))
    try:
        stats = fr.stats()
        dead = [[q.url, tag] for q, tag in fr.dead_letters(1000)]
        dropped = [[q.url, reason] for q, reason in fr.drain_dropped(1000)]
    finally:
        fr.close()
    return {"stats": stats, "dead_letters": dead, "dropped": dropped}


def run_daemon(data_dir: str, seeds: list[str], duration_s: float, nameserver: str, extra: list[str]) -> dict:
    os.makedirs(data_dir, exist_ok=True)
    seeds_path = os.path.join(data_dir, "seeds.txt")
    with open(seeds_path, "w") as f:
        f.write("\n".join(seeds) + "\n")
    sets = ["crawl.user_agent=crawlerd-test/0.1 (+e2e hostile; operator: test@localhost)",
            f'network.allow=["{ALLOW}"]', f'dns.nameservers=["{nameserver}"]',
            "dns.timeout_s=0.5", "dns.tries=1", "process.workers=1",
            "politeness.min_delay_s=0.2", "politeness.delay_factor=1.0",
            f"fetch.max_body_bytes={MAX_BODY_BYTES}", f"fetch.max_decoded_bytes={MAX_DECODED_BYTES}",
            f"fetch.max_header_bytes={MAX_HEADER_BYTES}", f"fetch.max_redirects={MAX_REDIRECTS}",
            f"fetch.shutdown_grace_s={GRACE_S}", "fetch.connect_timeout_s=2.0", "frontier.max_attempts=1",
            *extra]
    argv = [sys.executable, "-m", "crawlerd", "run", "--seeds", seeds_path, "--data-dir", data_dir,
            "--duration", str(duration_s)]
    for s in sets:
        argv += ["-s", s]
    peak: dict[int, int] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # drain the pipes in threads so a chatty daemon never blocks on a full pipe while we sample
    pipes: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, p=p: pipes.__setitem__(n, p.read()), daemon=True)
               for n, p in (("stdout", proc.stdout), ("stderr", proc.stderr))]
    for r in readers:
        r.start()
    deadline = t0 + duration_s + 60.0      # the test fails on time far earlier; this only bounds a hang
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in _family(proc.pid):
            hwm = _proc_kib(pid, "VmHWM")
            if hwm is not None and hwm > peak.get(pid, 0):
                peak[pid] = hwm
        time.sleep(0.05)
    killed = proc.poll() is None
    if killed:
        proc.kill()
    proc.wait()
    wall_s = time.monotonic() - t0
    for r in readers:
        r.join(10.0)
    stderr = pipes.get("stderr", "")
    last_path = os.path.join(data_dir, "last-run.json")
    last = None
    if os.path.exists(last_path):
        with open(last_path) as f:
            last = json.load(f)
    return {"rc": proc.returncode, "killed": killed, "wall_s": wall_s, "stderr": stderr[-20000:],
            "stop_requested_at": _stop_requested_at(stderr), "last_run": last,
            "crawl_pid": proc.pid, "peak_hwm_kib": {str(k): v for k, v in peak.items()},
            "events": read_events(data_dir), "frontier": post_mortem(data_dir)}


def main() -> int:
    out_path, base = sys.argv[1], sys.argv[2]
    duration1, duration2 = float(sys.argv[3]), float(sys.argv[4])
    report: dict = {}
    with Servers() as srv:
        seeds = seed_urls(srv.port, srv.sentinel_port)
        report.update(port=srv.port, sentinel_port=srv.sentinel_port, seeds=seeds, forbidden_ip=FORBIDDEN_IP,
                      max_redirects=MAX_REDIRECTS, grace_s=GRACE_S, max_body_bytes=MAX_BODY_BYTES,
                      bomb_bytes=BOMB_BYTES)
        # drips end by the low-speed limit (2 s under 256 B/s) well before the whole-transfer timeout
        report["hostile"] = run_daemon(
            os.path.join(base, "hostile"), [u for n, u in seeds.items() if n not in SECOND_ONLY], duration1,
            srv.dns.nameserver,
            ["fetch.timeout_s=20.0", "fetch.low_speed_time_s=2", "fetch.low_speed_bytes_per_s=256"])
        report["hostile_server"] = srv.snapshot()
        # a drip that nothing but the shutdown can end
        report["drip_stop"] = run_daemon(
            os.path.join(base, "drip-stop"), [seeds[n] for n in SECOND_RUN], duration2, srv.dns.nameserver,
            ["fetch.timeout_s=600.0", "fetch.low_speed_time_s=600", "fetch.low_speed_bytes_per_s=1"])
        report["drip_server"] = srv.snapshot()
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
