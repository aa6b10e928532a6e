"""`crawlerd top` under a pseudo-terminal: it draws, refreshes, and exits 0 on q and on Ctrl-C."""

import asyncio
import copy
import json
import re
import subprocess
import threading

import pytest

from crawlerd.control import ControlServer
from tests.idle_daemon import crawlerd
from tests.pty_terminal import Terminal


@pytest.fixture(scope="module")
def daemon(idle_crawlerd):
    data, _status = idle_crawlerd
    r = subprocess.run(crawlerd("stats", "--json", "--data-dir", data), capture_output=True, text=True)
    return data, json.loads(r.stdout)


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
