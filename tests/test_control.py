import asyncio
import os
import stat
import threading

import pytest

from crawlerd import control


def _serve(path, handlers, body):
    async def main():
        srv = control.ControlServer(path, handlers)
        await srv.start()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, body)
        finally:
            await srv.close()
    return asyncio.run(main())


def test_round_trip_and_socket_mode(tmp_path):
    path = str(tmp_path / "c.sock")
    seen = []

    def body():
        mode = stat.S_IMODE(os.stat(path).st_mode)
        r = control.request(path, "echo", value=41)
        bad = control.request(path, "nosuch")
        seen.append(mode)
        return r, bad

    r, bad = _serve(path, {"echo": lambda req: {"value": req["value"] + 1}}, body)
    assert seen == [0o600]
    assert r == {"ok": True, "value": 42}
    assert bad["ok"] is False and "unknown command 'nosuch'" in bad["error"]
    assert not os.path.exists(path), "socket removed on close"


def test_handler_value_error_becomes_reply(tmp_path):
    def handler(req):
        raise ValueError("needs 'urls'")
    r = _serve(str(tmp_path / "c.sock"), {"x": handler}, lambda: control.request(str(tmp_path / "c.sock"), "x"))
    assert r == {"ok": False, "error": "needs 'urls'"}


def test_no_daemon(tmp_path):
    with pytest.raises(control.NoDaemon, match="no crawlerd is running"):
        control.request(str(tmp_path / "absent.sock"), "status")


def test_stale_socket_is_replaced_but_live_one_refused(tmp_path):
    import socket
    path = str(tmp_path / "c.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)          # bound but never listening: stale
    s.close()
    r = _serve(path, {"ping": lambda req: {}}, lambda: control.request(path, "ping"))
    assert r["ok"]

    started, release = threading.Event(), threading.Event()

    def first():
        async def main():
            srv = control.ControlServer(path, {})
            await srv.start()
            started.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait)
            await srv.close()
        asyncio.run(main())

    t = threading.Thread(target=first)
    t.start()
    try:
        assert started.wait(10)
        with pytest.raises(control.ControlError, match="in use by a running crawlerd"):
            asyncio.run(control.ControlServer(path, {}).start())
    finally:
        release.set()
        t.join(10)


def test_garbage_request_gets_error():
    srv = control.ControlServer("/nonexistent", {})
    assert srv.dispatch(b"not json\n")["ok"] is False
    assert srv.dispatch(b"[1,2]\n")["ok"] is False
