"""Control socket: one JSON request line in, one JSON reply line out, over a Unix socket.

The daemon listens on ``control.socket`` (mode 0600, so only its user can
drive it). A request is ``{"cmd": NAME, ...args}``; the reply is
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. Commands are
registered by the shard/supervisor as plain callables (a handler may return an awaitable:
a family supervisor asks its shards before it answers), so this module knows nothing about
crawling. ``ask`` is the client for a process that runs a loop itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import json
import logging
import os
import socket
from collections.abc import Callable

MAX_REQUEST_BYTES = 1 << 20
log = logging.getLogger("crawlerd.control")


class ControlError(Exception):
    """Socket trouble the CLI reports in one line (exit 3 when no daemon answers)."""


class NoDaemon(ControlError):
    pass


Handler = Callable[[dict], dict]


class ControlServer:
    """Serves registered commands. Key: command name -> handler(request) -> reply dict."""

    def __init__(self, path: str, handlers: dict[str, Handler]):
        self.path = path
        self.handlers = handlers
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        _claim_socket_path(self.path)
        old = os.umask(0o177)      # socket file created 0600
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=self.path,
                                                           limit=MAX_REQUEST_BYTES)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=10)
            reply = await self.dispatch_async(line)
            writer.write(json.dumps(reply, default=str).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    def dispatch(self, line: bytes) -> dict:
        """Answer one request whose handler is synchronous (an asynchronous one is refused here)."""
        req, reply = self._parse(line)
        if reply is None:
            reply = self._call(req, lambda: self.handlers[req["cmd"]](req))
            if inspect.isawaitable(reply):
                reply.close()
                return {"ok": False, "error": f"{req['cmd']} needs the event loop"}
        return reply

    async def dispatch_async(self, line: bytes) -> dict:
        """Answer one request; a handler may return an awaitable (it runs on the loop, e.g. asks a thread)."""
        req, reply = self._parse(line)
        if reply is not None:
            return reply
        reply = self._call(req, lambda: self.handlers[req["cmd"]](req))
        if inspect.isawaitable(reply):
            coro = reply
            reply = await self._acall(req, coro)
        return reply

    def _parse(self, line: bytes) -> tuple[dict, dict | None]:
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                raise ValueError("expected a JSON object with a string 'cmd'")
        except ValueError as e:
            return {}, {"ok": False, "error": f"bad request: {e}"}
        if req["cmd"] not in self.handlers:
            return req, {"ok": False,
                         "error": f"unknown command {req['cmd']!r}; known: {', '.join(sorted(self.handlers))}"}
        return req, None

    @staticmethod
    def _done(reply: dict) -> dict:
        reply.setdefault("ok", True)
        return reply

    def _call(self, req: dict, fn):
        try:
            reply = fn()
        except Exception as e:
            return _failed(req, e)
        return reply if inspect.isawaitable(reply) else self._done(reply)

    async def _acall(self, req: dict, coro) -> dict:
        try:
            return self._done(await coro)
        except Exception as e:
            return _failed(req, e)


def _failed(req: dict, e: Exception) -> dict:
    """The answer to a handler that raised: a bad argument (ValueError, KeyError) in its own words;
    anything else (a store closing at shutdown, a full disk) logged and named, never crashing the loop."""
    if isinstance(e, (ValueError, KeyError)):
        return {"ok": False, "error": str(e)}
    log.error("control command failed cmd=%s error=%r", req["cmd"], e)
    return {"ok": False, "error": f"{req['cmd']} failed: {type(e).__name__}: {e}"}


def _request_line(cmd: str, args: dict) -> bytes:
    return json.dumps({"cmd": cmd, **args}).encode() + b"\n"


def _reply(raw: bytes, path: str) -> dict:
    """The daemon's answer line, parsed (ControlError when it is not JSON)."""
    try:
        return json.loads(raw)
    except ValueError:
        raise ControlError(f"garbled reply from {path}") from None


async def ask(path: str, cmd: str, timeout_s: float = 10.0, **args) -> dict:
    """``request`` from a running loop: one command to another crawlerd process's socket."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=64 << 20), timeout_s)
    except (FileNotFoundError, ConnectionRefusedError):
        raise NoDaemon(f"nothing answers on {path}") from None
    except (OSError, TimeoutError) as e:
        raise ControlError(f"cannot connect to {path}: {e}") from None
    try:
        writer.write(_request_line(cmd, args))
        line = await asyncio.wait_for(reader.readline(), timeout_s)
    except (OSError, TimeoutError, asyncio.LimitOverrunError, ValueError) as e:
        raise ControlError(f"no answer on {path}: {e!r}") from None
    finally:
        writer.close()
    return _reply(line, path)


def _claim_socket_path(path: str) -> None:
    """Remove a stale socket; refuse if a live daemon answers on it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)            # stale: nobody listening
        return
    finally:
        probe.close()
    raise ControlError(f"control socket {path} is in use by a running crawlerd")


def request(path: str, cmd: str, timeout_s: float = 10.0, **args) -> dict:
    """Send one command to the daemon and return its reply (blocking; used by the CLI)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    try:
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NoDaemon(f"no crawlerd is running (no answer on {path})") from None
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ECONNREFUSED):
                raise NoDaemon(f"no crawlerd is running (no answer on {path})") from None
            raise ControlError(f"cannot connect to {path}: {e.strerror}") from None
        s.sendall(_request_line(cmd, args))
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except TimeoutError:
        raise ControlError(f"crawlerd did not answer on {path} within {timeout_s:g}s") from None
    finally:
        s.close()
    return _reply(buf, path)
