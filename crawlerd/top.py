"""`crawlerd top`: a live terminal view of a running crawl, redrawn once a second (rich).

Each frame asks the daemon for ``stats`` over the control socket; rates are
differences between two frames (pages/s, requests/s, bytes/s, CPU % per
process, pages/s per host), so the view needs nothing the daemon does not
already count. ``q`` or Ctrl-C quits and restores the terminal.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Callable

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from crawlerd import control
from crawlerd.supervisor import NOT_ERRORS

Fetch = Callable[[], dict]


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_s(s: float) -> str:
    s = int(s)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class TopModel:
    """Two successive ``stats`` snapshots and the rates between them. Key: none (holds the last two frames)."""

    def __init__(self):
        self.prev: dict | None = None
        self.cur: dict = {}
        self.dt = 0.0

    def update(self, stats: dict, now: float) -> None:
        if self.cur:
            self.prev = self.cur
        self.cur = dict(stats, _t=now)
        self.dt = now - self.prev["_t"] if self.prev else 0.0

    def rate(self, get: Callable[[dict], float]) -> float | None:
        """Per-second change of ``get(stats)`` since the last frame (None on the first frame)."""
        if self.prev is None or self.dt <= 0:
            return None
        return max(0.0, (get(self.cur) - get(self.prev)) / self.dt)

    def delta_counts(self, key: str) -> dict[str, int]:
        """Counts of ``stats[key]`` gained since the last frame; totals on the first frame."""
        now = self.cur.get(key, {})
        before = self.prev.get(key, {}) if self.prev else {}
        return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0) > 0}

    def cpu_percent(self, pid: int) -> float | None:
        if self.prev is None or self.dt <= 0:
            return None
        old = {p["pid"]: p["cpu_s"] for p in self.prev.get("processes", [])}
        new = {p["pid"]: p["cpu_s"] for p in self.cur.get("processes", [])}
        if pid not in old or pid not in new:
            return None
        return 100.0 * max(0.0, new[pid] - old[pid]) / self.dt

    def host_rates(self) -> dict[str, float]:
        if self.prev is None or self.dt <= 0:
            return {}
        old = dict(map(tuple, self.prev.get("top_hosts", [])))
        return {h: (n - old[h]) / self.dt for h, n in self.cur.get("top_hosts", []) if h in old}

    def shard_rate(self, shard: str) -> float | None:
        if self.prev is None or self.dt <= 0:
            return None
        old = {s["shard"]: s.get("pages", 0) for s in self.prev.get("shards", [])}
        new = {s["shard"]: s.get("pages", 0) for s in self.cur.get("shards", [])}
        if shard not in old or shard not in new:
            return None
        return max(0.0, new[shard] - old[shard]) / self.dt


def _fmt_rate(v: float | None, unit: str = "/s") -> str:
    return "-" if v is None else f"{v:,.1f}{unit}"


def _bar(share: float, width: int = 20) -> str:
    n = round(share * width)
    return "█" * n + "·" * (width - n)


def render(m: TopModel, interval_s: float = 1.0) -> Group:
    s = m.cur
    head = Text.assemble(
        ("crawlerd top ", "bold"), (s.get("state", "?"), "bold green" if s.get("state") == "running" else "bold yellow"),
        f"  pid {s.get('pid')}  up {human_s(s.get('uptime_s', 0))}  data {s.get('data_dir', '')}  ",
        (time.strftime("%H:%M:%S"), "dim"))
    rates = Table(box=box.SIMPLE_HEAD, expand=True, title="rates", title_justify="left")
    for col in ("pages/s (1 s)", "pages/s (10 s)", "pages/s (60 s)", "requests/s", "received/s", "pages",
                "received", "errors"):
        rates.add_column(col, justify="right")
    rates.add_row(_fmt_rate(m.rate(lambda x: x.get("pages", 0)), ""), f"{s.get('pages_per_s_10s', 0):,.1f}",
                  f"{s.get('pages_per_s_60s', 0):,.1f}", _fmt_rate(m.rate(lambda x: x.get("requests", 0)), ""),
                  "-" if m.prev is None else human_bytes(m.rate(lambda x: x.get("bytes", 0)) or 0) + "/s",
                  f"{s.get('pages', 0):,}", human_bytes(s.get("bytes", 0)), f"{s.get('errors', 0):,}")
    fr = s.get("frontier", {})
    queue = Table(box=box.SIMPLE_HEAD, expand=True, title="work", title_justify="left")
    for col in ("in flight", "queued", "hosts active", "ready", "waiting", "parked", "DRUM pending",
                "budget deferred", "loop lag (10 s max)"):
        queue.add_column(col, justify="right")
    lag = max((sh.get("loop_lag", {}).get("recent_max_s", 0.0) for sh in s.get("shards", [])), default=0.0)
    queue.add_row(f"{s.get('in_flight', 0):,}", f"{s.get('queued', 0):,}", f"{s.get('hosts_active', 0):,}",
                  f"{fr.get('hosts_ready', 0):,}", f"{fr.get('hosts_waiting', 0):,}", f"{fr.get('parked', 0):,}",
                  f"{s.get('seen_pending', 0):,}", f"{s.get('budgets', {}).get('deferred_now', 0):,}",
                  Text(f"{1000 * lag:.0f} ms", style="red" if lag > 0.25 else ""))
    return Group(head, rates, queue, _mix(m), _hosts(m), _shards(m),
                 Text(f"q quit · refresh {interval_s:g} s", style="dim"))


def _mix(m: TopModel) -> Table:
    """Outcome and status mix: since the last frame, and over the whole run."""
    t = Table(box=box.SIMPLE_HEAD, expand=True, title="outcome mix", title_justify="left")
    t.add_column("outcome")
    t.add_column("last frame", justify="right")
    t.add_column("total", justify="right")
    t.add_column("share of total")
    t.add_column("HTTP status")
    t.add_column("total", justify="right")
    outcomes = m.cur.get("outcomes", {})
    recent = m.delta_counts("outcomes") if m.prev else {}
    total = sum(outcomes.values()) or 1
    statuses = sorted(m.cur.get("statuses", {}).items(), key=lambda kv: -kv[1])
    rows = sorted(outcomes.items(), key=lambda kv: -kv[1])[:8]
    for i in range(max(len(rows), min(len(statuses), 8))):
        o = rows[i] if i < len(rows) else None
        st = statuses[i] if i < len(statuses) else None
        style = "" if o is None or o[0] in NOT_ERRORS else "red"
        t.add_row(Text(o[0], style=style) if o else "", f"{recent.get(o[0], 0):,}" if o else "",
                  f"{o[1]:,}" if o else "", f"{_bar(o[1] / total)} {100 * o[1] / total:4.1f}%" if o else "",
                  st[0] if st else "", f"{st[1]:,}" if st else "")
    return t


def _hosts(m: TopModel) -> Table:
    """Busiest hosts (pages, pages/s) beside the most backed-off ones (failures, wait)."""
    t = Table(box=box.SIMPLE_HEAD, expand=True, title="hosts", title_justify="left")
    for col, j in (("busiest host", "left"), ("pages", "right"), ("pages/s", "right"),
                   ("most backed-off host", "left"), ("failures", "right"), ("next try in", "right")):
        t.add_column(col, justify=j)
    rates = m.host_rates()
    busy = sorted(m.cur.get("top_hosts", []), key=lambda hn: (-rates.get(hn[0], 0.0), -hn[1]))[:8]
    backed = m.cur.get("hosts_backed_off", [])[:8]
    for i in range(max(len(busy), len(backed))):
        b = busy[i] if i < len(busy) else None
        k = backed[i] if i < len(backed) else None
        t.add_row(b[0] if b else "", f"{b[1]:,}" if b else "",
                  _fmt_rate(rates.get(b[0]), "") if b else "",
                  Text(k["host"], style="yellow") if k else "", f"{k['failures']}{' (parked)' if k['parked'] else ''}"
                  if k else "", f"{k['wait_s']:.0f} s" if k else "")
    return t


def _shards(m: TopModel) -> Table:
    """One line per shard, then one per process (CPU % since the last frame, RSS)."""
    t = Table(box=box.SIMPLE_HEAD, expand=True, title="shards and processes", title_justify="left")
    for col in ("shard", "process", "pid", "pages", "pages/s", "in flight", "queued", "hosts",
                "loop lag max", "CPU %", "RSS"):
        t.add_column(col, justify="right")
    procs = m.cur.get("processes", [])
    for sh in m.cur.get("shards", []):
        ll = sh.get("loop_lag", {})
        t.add_row(str(sh.get("shard")), "shard", str(sh.get("pid", "")), f"{sh.get('pages', 0):,}",
                  _fmt_rate(m.shard_rate(sh.get("shard")), ""), f"{sh.get('in_flight', 0):,}",
                  f"{sh.get('queued', 0):,}", f"{sh.get('hosts_active', 0):,}",
                  f"{1000 * ll.get('recent_max_s', 0.0):.0f} ms", *_proc_cells(m, procs, sh.get("pid")))
    for p in procs:
        if p["role"] == "shard":
            continue
        t.add_row(p.get("shard", ""), p["role"], str(p["pid"]), "", "", "", "", "", "",
                  *_proc_cells(m, procs, p["pid"]))
    return t


def _proc_cells(m: TopModel, procs: list[dict], pid) -> tuple[str, str]:
    p = next((p for p in procs if p["pid"] == pid), None)
    if p is None:
        return "", ""
    cpu = m.cpu_percent(pid)
    return ("-" if cpu is None else f"{cpu:.0f}"), (human_bytes(p["rss_bytes"]) if p.get("rss_bytes") else "-")


@contextlib.contextmanager
def _keys(stream):
    """cbreak mode on a terminal (keys arrive one by one), restored on exit. Ctrl-C arrives as a key
    too (ISIG off), so it quits even where SIGINT is ignored (a shell's background job, nohup)."""
    if not stream.isatty():
        yield None
        return
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    mode = termios.tcgetattr(fd)
    mode[3] &= ~termios.ISIG            # lflag: ^C is a byte for _quit_pressed, not a signal
    termios.tcsetattr(fd, termios.TCSANOW, mode)
    try:
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(fd: int | None, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for a key; True if it was q or Ctrl-C."""
    if fd is None:
        time.sleep(timeout_s)
        return False
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        r, _, _ = select.select([fd], [], [], left)
        if r:
            key = os.read(fd, 32)
            if not key or b"q" in key.lower() or b"\x03" in key:     # q, Ctrl-C, or the terminal went away
                return True
    return False


def run_top(fetch: Fetch, *, interval_s: float = 1.0, console: Console | None = None, stdin=None) -> int:
    """Draw frames until q, Ctrl-C, or the daemon goes away; 0 in every case (it is how top ends)."""
    console = console or Console()
    model = TopModel()
    model.update(fetch(), time.monotonic())      # no daemon: NoDaemon propagates (exit 3) before drawing
    gone = ""
    try:
        with _keys(stdin or sys.stdin) as fd, Live(render(model, interval_s), console=console, screen=True,
                                                 auto_refresh=False) as live:
            while not _quit_pressed(fd, interval_s):
                try:
                    model.update(fetch(), time.monotonic())
                except control.ControlError as e:
                    gone = str(e)
                    break
                live.update(render(model, interval_s), refresh=True)
    except KeyboardInterrupt:
        pass
    if gone:
        console.print(f"crawlerd top: the daemon stopped answering ({gone})")
    return 0
