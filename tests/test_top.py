"""`crawlerd top` under a pseudo-terminal: it draws, refreshes, and exits 0 on q and on Ctrl-C."""

import asyncio
import copy
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from crawlerd.control import ControlServer
from tests.conftest import ROOT
from tests.idle_daemon import crawlerd, idle_daemon

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]")


class Terminal:
    """A child process on a pty of 48 rows x 170 columns; collects everything it writes."""

    def __init__(self, argv: list[str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                                   # child: size the terminal, become crawlerd top
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 170, 0, 0))
            env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=ROOT)
            env.pop("COLUMNS", None)
            env.pop("LINES", None)
            os.execve(sys.executable, [sys.executable, "-m", "crawlerd", *argv], env)
        self.raw = b""

    def text(self) -> str:
        return ANSI.sub(b"", self.raw).decode("utf-8", "replace")

    def read_until(self, cond, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond(self):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; screen so far:\n{self.text()[-3000:]}"
            r, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if r:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:        # EIO: the child closed the terminal
                    chunk = b""
                if not chunk:
                    assert cond(self), f"terminal closed; screen:\n{self.text()[-3000:]}"
                    return
                self.raw += chunk

    def frames(self) -> int:
        return self.raw.count(b"crawlerd top")

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout_s: float = 20.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:                                            # drain so the child never blocks on a full pty
                r, _, _ = select.select([self.fd], [], [], 0.1)
                if r:
                    self.raw += os.read(self.fd, 65536)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"crawlerd top did not exit; screen:\n{self.text()[-3000:]}")

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    data = str(tmp_path_factory.mktemp("top") / "data")
    with idle_daemon(data):
        r = subprocess.run(crawlerd("stats", "--json", "--data-dir", data), capture_output=True, text=True)
        yield data, json.loads(r.stdout)


def test_top_against_a_running_daemon_draws_refreshes_and_quits_on_q(daemon):
    data, _stats = daemon
    term = Terminal(["top", "--data-dir", data])
    try:
        term.read_until(lambda t: "q quit" in t.text())      # the last line of a frame
        screen = term.text()
        for want in ("running", "rates", "outcome mix", "busiest host", "most backed-off host", "worker"):
            assert want in screen, want
        term.read_until(lambda t: t.frames() >= 3)           # refreshed once a second
        term.send(b"q")
        assert term.wait() == 0
        assert term.raw.rstrip(b"\r\n").endswith(b"\x1b[?1049l")   # left the alternate screen
    finally:
        term.close()


class FakeDaemon(threading.Thread):
    """A control socket speaking the real protocol (crawlerd.control.ControlServer) with two shards,
    failing hosts and pages that grow by 100 per request."""

    def __init__(self, path: str, base: dict):
        super().__init__(daemon=True)
        self.path, self.base, self.n = path, base, 0
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None

    def stats(self, _req) -> dict:
        self.n += 1
        s = copy.deepcopy(self.base)
        one = s["shards"][0]
        s.update(pages=100 * self.n, requests=110 * self.n, bytes=2**20 * self.n, in_flight=12, queued=5000,
                 outcomes={"ok": 90 * self.n, "timeout": 10 * self.n}, statuses={"200": 85 * self.n, "503": 5},
                 top_hosts=[["http://busy.example", 60 * self.n], ["http://calm.example", 5 * self.n]],
                 hosts_backed_off=[{"host": "http://failing.example", "failures": 7, "wait_s": 340.0,
                                    "parked": False}])
        s["shards"] = [dict(one, shard="0", pages=60 * self.n), dict(one, shard="1", pages=40 * self.n, pid=4242)]
        return s

    def run(self) -> None:
        async def main():
            self.loop = asyncio.get_running_loop()
            self.stop_event = asyncio.Event()
            srv = ControlServer(self.path, {"stats": self.stats})
            await srv.start()
            self.ready.set()
            await self.stop_event.wait()
            await srv.close()
        asyncio.run(main())

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.join(10)


def test_top_shows_shards_rates_and_backed_off_hosts_and_quits_on_ctrl_c(daemon, tmp_path):
    _data, stats = daemon
    fake = FakeDaemon(str(tmp_path / "control.sock"), stats)
    fake.start()
    assert fake.ready.wait(10)
    term = Terminal(["top", "--data-dir", str(tmp_path)])
    try:
        term.read_until(lambda t: fake.n >= 3 and t.text().count("q quit") >= 2)
        screen = term.text()
        assert "busy.example" in screen and "timeout" in screen
        assert re.search(r"\b1\s+shard\s+4242\b", screen), screen[-3000:]      # the second shard's line
        term.send(b"\x03")                                                  # Ctrl-C
        assert term.wait() == 0
    finally:
        term.close()
        fake.stop()


def test_top_without_a_daemon_exits_3(tmp_path):
    r = subprocess.run(crawlerd("top", "--data-dir", str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "no crawlerd is running" in r.stderr
