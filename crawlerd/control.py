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
            reply = self.dispatch(line)
            if isinstance(reply, Pending):
                reply = await reply.result()
            writer.write(json.dumps(reply, default=str).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    def dispatch(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                raise ValueError("expected a JSON object with a string 'cmd'")
        except ValueError as e:
            return {"ok": False, "error": f"bad request: {e}"}
        handler = self.handlers.get(req["cmd"])
        if handler is None:
            return {"ok": False, "error": f"unknown command {req['cmd']!r}; known: {', '.join(sorted(self.handlers))}"}
        try:
            reply = handler(req)
        except Exception as e:
            return _error_reply(req["cmd"], e)
        if inspect.isawaitable(reply):
            return Pending(req["cmd"], reply)
        reply.setdefault("ok", True)
        return reply


class Pending:
    """The reply of a handler that must wait (it asks other processes): awaited by the server."""

    def __init__(self, cmd: str, awaitable):
        self.cmd = cmd
        self.awaitable = awaitable

    async def result(self) -> dict:
        try:
            reply = await self.awaitable
        except Exception as e:
            return _error_reply(self.cmd, e)
        reply.setdefault("ok", True)
        return reply


def _error_reply(cmd: str, e: Exception) -> dict:
    """A handler's failure as a reply: bad arguments say what; anything else (a store closing at
    shutdown, a full disk) is logged and named, never a crash of the loop."""
    if isinstance(e, (ValueError, KeyError)):
        return {"ok": False, "error": str(e)}
    log.error("control command failed cmd=%s error=%r", cmd, e)
    return {"ok": False, "error": f"{cmd} failed: {type(e).__name__}: {e}"}


async def ask(path: str, cmd: str, timeout_s: float = 10.0, **args) -> dict:
    """``request`` from a running loop: one command to another crawlerd process's socket."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=64 << 20), timeout_s)
    except (FileNotFoundError, ConnectionRefusedError):
        raise NoDaemon(f"nothing answers on {path}") from None
    except (OSError, TimeoutError) as e:
        raise ControlError(f"cannot connect to {path}: {e}") from None
    try:
        writer.write(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
        line = await asyncio.wait_for(reader.readline(), timeout_s)
    except (OSError, TimeoutError, asyncio.LimitOverrunError, ValueError) as e:
        raise ControlError(f"no answer on {path}: {e!r}") from None
    finally:
        writer.close()
    try:
        return json.loads(line)
    except ValueError:
        raise ControlError(f"garbled reply from {path}") from None


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
        s.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
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
    try:
        return json.loads(buf)
    except ValueError:
        raise ControlError(f"garbled reply from {path}") from None
