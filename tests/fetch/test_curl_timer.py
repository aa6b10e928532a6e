"""The fetcher's loop timer: curl's deadline is read after each call into curl (no timer callback
runs inside curl), and the loop timer is always armed no later than that deadline."""

import asyncio

import pycurl

from crawlerd.outcome import Outcome
from tests.fetch.test_curl import req, run

LATE_S = 0.05          # a loop timer may be this much later than curl's deadline as read now


def _watch(f, broken: list) -> None:
    """Between every two loop callbacks: if curl has a deadline, a timer is armed no later than it."""
    loop = asyncio.get_running_loop()

    def check():
        if f._released:
            return
        ms = f._multi.timeout()
        if ms >= 0 and (f._timer is None or f._timer_at > loop.time() + ms / 1000.0 + LATE_S):
            broken.append((ms, f._timer is not None and f._timer_at - loop.time(), f.in_flight))
        loop.call_soon(check)
    loop.call_soon(check)


def test_loop_timer_is_never_later_than_curls_deadline_and_timeouts_are_served(silent_port):
    broken: list = []

    async def scenario(f, server, port):
        _watch(f, broken)
        pages = [req(port, f"/page?size={2000 + i}", host=f"h{i}.test", keep_alive=i % 2 == 0) for i in range(40)]
        slow = [req(port, "/drip", host="drip.test"), req(silent_port, "/ok", host="silent.test")]
        # bounded: with a deadline left unarmed, transfers may never start
        return await asyncio.wait_for(asyncio.gather(*(f.fetch(r) for r in pages + slow)), 30.0)
    out = run(scenario, connect_timeout_s=0.3, low_speed_bytes_per_s=100, low_speed_time_s=1)
    assert [r.outcome for r in out[:40]] == [Outcome.OK] * 40
    assert [r.outcome for r in out[40:]] == [Outcome.TOO_SLOW, Outcome.CONNECT_TIMEOUT]
    assert broken == []


def test_no_python_timer_callback_runs_inside_curl(monkeypatch):
    """The multi handle gets a socket function only: a timer function would be called inside curl,
    with the GIL released around it (a hand-over to any thread waiting for it), twice a transfer."""
    set_opts = []
    real = pycurl.CurlMulti

    class Recording:
        def __init__(self):
            self._m = real()

        def setopt(self, opt, value):
            set_opts.append(opt)
            return self._m.setopt(opt, value)

        def __getattr__(self, name):
            return getattr(self._m, name)

    monkeypatch.setattr(pycurl, "CurlMulti", Recording)

    async def scenario(f, server, port):
        return await f.fetch(req(port, "/ok"))
    assert run(scenario).outcome is Outcome.OK
    assert pycurl.M_SOCKETFUNCTION in set_opts and pycurl.M_TIMERFUNCTION not in set_opts
