"""simweb's transport: a small HTTP/1.1 server (RFC 9112) on asyncio/uvloop, plus the control port.

One listening socket serves every host; the Host header says which host was asked, and the
local address of the connection is recorded as the IP (in a private network namespace the server
binds 0.0.0.0 and each host's 127.x.y.z reaches it). Requests on a connection are answered in
order (keep-alive, pipelining tolerated); a delayed answer holds the requests queued behind it.

Every request is entered in the :class:`~crawlerd.simweb.ledger.Ledger` when its head is
parsed (stamped with the arrival of its first bytes), and closed when the answer is handed to the
kernel: stamped just before the write when the kernel takes it whole (the usual case on loopback),
else when the transport's buffer drains (``resume_writing``; write-buffer limits are zero).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import sys
import time
from typing import Any

from crawlerd.simweb.farm import ROLE_FARM
from crawlerd.simweb.handler import ACTION_HOLD, ACTION_RESET, Handler, Reply, host_name
from crawlerd.simweb.ledger import Ledger, LedgerEntry
from crawlerd.simweb.site import Site

MAX_HEAD_BYTES = 16 * 1024      # request line + headers; more is 431 (RFC 6585 §5)
MAX_TARGET_BYTES = 8 * 1024     # longer targets are 414 (RFC 9110 §15.5.15)
IDLE_TIMEOUT_S = 60.0           # keep-alive connections idle this long are closed
_SWEEP_EVERY_S = 5.0

REASONS = {200: "OK", 301: "Moved Permanently", 304: "Not Modified", 400: "Bad Request", 401: "Unauthorized",
           403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 414: "URI Too Long",
           421: "Misdirected Request", 429: "Too Many Requests", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable",
           505: "HTTP Version Not Supported"}
_INTERESTING = frozenset({b"host", b"user-agent", b"if-none-match", b"if-modified-since", b"accept-encoding",
                          b"connection", b"content-length", b"transfer-encoding"})


class _Clock:
    """Caches the IMF-fixdate for the Date header (RFC 9110 §6.6.1), recomputed once a second."""
    __slots__ = ("_sec", "_text")

    def __init__(self) -> None:
        self._sec = -1
        self._text = ""

    def date(self) -> str:
        now = int(time.time())
        if now != self._sec:
            self._sec = now
            self._text = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now))
        return self._text


class _Request:
    __slots__ = ("method", "target", "version", "headers", "error")

    def __init__(self) -> None:
        self.method = ""
        self.target = ""
        self.version = ""
        self.headers: dict[bytes, str] = {}
        self.error = 0          # HTTP status to answer a malformed request with (then close)


def parse_head(head: bytes) -> _Request:
    """Parse a request line and header fields (no body). Never raises: errors go in ``.error``."""
    req = _Request()
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        req.error = 400
        return req
    req.method = parts[0].decode("latin-1")
    req.target = parts[1].decode("latin-1")
    req.version = parts[2].decode("latin-1")
    if req.version not in ("HTTP/1.1", "HTTP/1.0"):
        req.error = 505 if req.version.startswith("HTTP/") else 400
        return req
    if len(parts[1]) > MAX_TARGET_BYTES:
        req.error = 414
        return req
    headers = req.headers
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in b" \t":   # RFC 9112 §5.1: no space before the colon
            req.error = 400
            return req
        name = name.lower()
        if name in _INTERESTING:
            headers[name] = value.strip(b" \t").decode("latin-1")
    if req.target.startswith(("http://", "https://")):   # absolute-form (RFC 9112 §3.2.2)
        rest = req.target.split("://", 1)[1]
        authority, slash, path = rest.partition("/")
        headers[b"host"] = authority
        req.target = "/" + path
    elif not req.target.startswith("/"):
        req.error = 400
    elif req.version == "HTTP/1.1" and b"host" not in headers:
        req.error = 400                                   # RFC 9112 §3.2: Host is required
    return req


class SimHttpProtocol(asyncio.Protocol):
    """One client connection. Invariant: at most one answer is being prepared at a time
    (``busy``); requests behind it wait in ``buf`` and are answered in order."""

    def __init__(self, app: SimServer) -> None:
        self.app = app
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.conn_id = app.next_conn_id()
        self.local_ip = ""
        self.t_first = 0.0           # monotonic time the oldest unparsed byte arrived
        self.t_first_wall = 0.0
        self.last_active = 0.0
        self.busy = False
        self.closed = False
        self.undrained: list[LedgerEntry] = []   # answered, bytes still in the write buffer
        self.deferred: asyncio.Task | None = None
        self.closed_event = asyncio.Event()

    # --- asyncio callbacks ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.local_ip = (transport.get_extra_info("sockname") or ("",))[0]
        transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]
        self.last_active = time.monotonic()
        self.app.conns.add(self)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self.buf:
            self.t_first, self.t_first_wall = now, time.time()
        self.buf += data
        self.last_active = now
        if not self.busy:
            self._process()

    def pause_writing(self) -> None:
        pass   # the ledger entries in self.undrained are closed in resume_writing

    def resume_writing(self) -> None:
        self._drained("")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.closed_event.set()
        self._drained("client_closed" if exc is None else "connection_lost")
        self.app.conns.discard(self)

    # --- internals ---
    def _drained(self, note: str) -> None:
        if not self.undrained:
            return
        now, wall = time.monotonic(), time.time()
        for e in self.undrained:
            e.t_end, e.t_end_wall = now, wall
            if note:
                e.note = note
        self.undrained.clear()

    def _process(self) -> None:
        buf = self.buf
        while not self.busy and not self.closed and buf:
            while buf[:2] == b"\r\n":                       # RFC 9112 §2.2: ignore leading CRLF
                del buf[:2]
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._reject(self._open_entry(_Request(), ""), 431)
                return
            if end > MAX_HEAD_BYTES:
                self._reject(self._open_entry(_Request(), ""), 431)
                return
            req = parse_head(bytes(buf[:end]))
            body_len = 0
            if not req.error:
                if b"transfer-encoding" in req.headers:
                    req.error = 501                         # request bodies are not used by a crawler
                else:
                    cl = req.headers.get(b"content-length", "0")
                    if not cl.isdigit():
                        req.error = 400
                    else:
                        body_len = int(cl)
                        if len(buf) < end + 4 + body_len:
                            return                          # wait for the rest of the body
            del buf[:end + 4 + body_len]
            entry = self._open_entry(req, req.headers.get(b"host", ""))
            # bytes left over arrived in the current read: the next request starts now
            self.t_first, self.t_first_wall = time.monotonic(), time.time()
            if req.error:
                self._reject(entry, req.error)
                return
            self._answer(req, entry)

    def _open_entry(self, req: _Request, host_header: str) -> LedgerEntry:
        h = req.headers
        return self.app.ledger.open(
            conn=self.conn_id, host=host_name(host_header), ip=self.local_ip, method=req.method, target=req.target,
            user_agent=h.get(b"user-agent", ""), if_none_match=h.get(b"if-none-match", ""),
            if_modified_since=h.get(b"if-modified-since", ""), t_start=self.t_first,
            t_start_wall=self.t_first_wall)

    def _reject(self, entry: LedgerEntry, status: int) -> None:
        entry.note = "bad_request"
        self._send(entry, Reply(status, f"{status} {REASONS.get(status, '')}\n".encode(), "text/plain"),
                   head_only=False, keep_alive=False)
        self.close()

    def _answer(self, req: _Request, entry: LedgerEntry) -> None:
        h = req.headers
        conn_tokens = h.get(b"connection", "").lower()
        if req.version == "HTTP/1.1":
            keep_alive = "close" not in conn_tokens
        else:
            keep_alive = "keep-alive" in conn_tokens
        if req.method not in ("GET", "HEAD"):
            reply = Reply(405, b"only GET and HEAD\n", "text/plain", (("Allow", "GET, HEAD"),))
        else:
            _, reply = self.app.handler.handle(
                h.get(b"host", ""), req.target, h.get(b"if-none-match", ""), h.get(b"if-modified-since", ""),
                "gzip" in h.get(b"accept-encoding", ""))
        head_only = req.method == "HEAD"
        if reply.action == ACTION_RESET:
            self._reset(entry)
            return
        if reply.action or reply.delay_s > 0:
            self.busy = True
            self.deferred = asyncio.get_running_loop().create_task(
                self._deferred(entry, reply, head_only, keep_alive))
            return
        self._send(entry, reply, head_only, keep_alive)
        if not keep_alive:
            self.close()

    async def _deferred(self, entry: LedgerEntry, reply: Reply, head_only: bool, keep_alive: bool) -> None:
        try:
            await asyncio.wait_for(self.closed_event.wait(), reply.delay_s)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            entry.t_end, entry.t_end_wall, entry.note = time.monotonic(), time.time(), "aborted"  # shutdown
            raise
        if self.closed:
            entry.t_end, entry.t_end_wall, entry.note = time.monotonic(), time.time(), "client_closed"
            return
        if reply.action == ACTION_HOLD:
            entry.t_end, entry.t_end_wall, entry.note = time.monotonic(), time.time(), "held"
            self.close()
            return
        self.busy = False
        self._send(entry, reply, head_only, keep_alive)
        if not keep_alive:
            self.close()
        elif self.buf:
            self._process()

    def _send(self, entry: LedgerEntry, reply: Reply, head_only: bool, keep_alive: bool) -> None:
        status = reply.status
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\nDate: {self.app.clock.date()}\r\n"
                 "Server: simweb\r\n"]
        if status != 304:
            if reply.content_type:
                lines.append(f"Content-Type: {reply.content_type}\r\n")
            lines.append(f"Content-Length: {len(reply.body)}\r\n")
        for k, v in reply.headers:
            lines.append(f"{k}: {v}\r\n")
        if not keep_alive:
            lines.append("Connection: close\r\n")
        lines.append("\r\n")
        data = "".join(lines).encode("latin-1")
        if not head_only and status != 304:
            data += reply.body
        entry.status, entry.bytes, entry.retry_after_s = status, len(data), reply.retry_after_s
        transport = self.transport
        if transport is None or transport.is_closing():
            entry.t_end, entry.t_end_wall, entry.note = time.monotonic(), time.time(), "client_closed"
            return
        # Stamp before writing: if the kernel takes every byte at once, the client cannot have read
        # the last one before this moment, so a server-side gap never exceeds what the client saw,
        # however long this process is descheduled after the write (the machine is shared).
        t_end, t_end_wall = time.monotonic(), time.time()
        transport.write(data)
        if transport.get_write_buffer_size() == 0:
            entry.t_end, entry.t_end_wall = t_end, t_end_wall
        else:
            self.undrained.append(entry)

    def _reset(self, entry: LedgerEntry) -> None:
        """Abort with a TCP RST: SO_LINGER on with a zero timeout makes close() send RST."""
        sock = self.transport.get_extra_info("socket") if self.transport else None
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        entry.t_end, entry.t_end_wall, entry.note = time.monotonic(), time.time(), "reset"
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close the connection once written data is flushed (abort: at once)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.deferred is not None:
            self.deferred.cancel()
        if self.transport is not None:
            self.transport.abort()


class ControlProtocol(asyncio.Protocol):
    """The control port: GET /ledger[?since=N], GET /site, GET /health, POST /reset-ledger.
    One request per connection; its traffic is not entered in the ledger."""

    def __init__(self, app: SimServer) -> None:
        self.app = app
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                self._reply(431, {"error": "head too large"})
            return
        req = parse_head(bytes(self.buf[:end]))
        cl = req.headers.get(b"content-length", "0")
        if cl.isdigit() and len(self.buf) < end + 4 + int(cl):
            return
        if req.error:
            self._reply(req.error, {"error": "bad request"})
            return
        path, _, query = req.target.partition("?")
        params = dict(p.partition("=")[::2] for p in query.split("&") if p)
        app = self.app
        if req.method == "GET" and path == "/ledger":
            since = int(params.get("since", "0") or 0)
            entries = app.ledger.since(since)
            self._reply(200, {"next_seq": app.ledger.next_seq, "entries": [e.to_dict() for e in entries]})
        elif req.method == "GET" and path == "/site":
            self._reply(200, app.site_description())
        elif req.method == "GET" and path == "/health":
            self._reply(200, {"ok": True, "connections": len(app.conns), "requests": app.ledger.next_seq,
                              "ledger_entries": len(app.ledger.entries), "ledger_dropped": app.ledger.dropped})
        elif req.method == "POST" and path == "/reset-ledger":
            self._reply(200, {"cleared": app.ledger.reset(), "next_seq": app.ledger.next_seq})
        else:
            self._reply(404, {"error": f"no such endpoint: {req.method} {path}"})

    def _reply(self, status: int, obj: Any) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        assert self.transport is not None
        self.transport.write(head + body)
        self.transport.close()


class SimServer:
    """The running synthetic web: site model, handler, ledger, and the two listening sockets."""

    def __init__(self, site: Site, cache_bytes: int = 64 << 20, ledger_max_entries: int = 0,
                 tls=None) -> None:
        self.site = site
        self.tls = tls                        # a simweb.tls.TestCA: serve HTTPS (else plain HTTP)
        self.scheme = "https" if tls is not None else "http"
        self.cache_bytes = cache_bytes
        self.ledger = Ledger(ledger_max_entries)
        self.clock = _Clock()
        self.conns: set[SimHttpProtocol] = set()
        self.handler: Handler | None = None   # built once the port is known (links carry it)
        self.port = 0
        self.bind = ""
        self.control_port = 0
        self._servers: list[asyncio.base_events.Server] = []
        self._sweeper: asyncio.Task | None = None
        self._conn_seq = 0

    def next_conn_id(self) -> int:
        self._conn_seq += 1
        return self._conn_seq

    async def start(self, bind: str, port: int = 0, control_port: int = 0,
                    control_bind: str = "127.0.0.1") -> None:
        loop = asyncio.get_running_loop()
        ssl_ctx = self.tls.server_context() if self.tls is not None else None
        server = await loop.create_server(lambda: SimHttpProtocol(self), bind, port, reuse_address=True,
                                          backlog=1024, ssl=ssl_ctx)
        self._servers.append(server)
        self.bind = bind
        self.port = server.sockets[0].getsockname()[1]
        self.handler = Handler(self.site, self.port, self.cache_bytes, scheme=self.scheme)
        control = await loop.create_server(lambda: ControlProtocol(self), control_bind, control_port,
                                           reuse_address=True)
        self._servers.append(control)
        self.control_port = control.sockets[0].getsockname()[1]
        self._sweeper = loop.create_task(self._sweep_idle())

    async def _sweep_idle(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_EVERY_S)
            limit = time.monotonic() - IDLE_TIMEOUT_S
            for conn in [c for c in self.conns if not c.busy and c.last_active < limit]:
                conn.close()

    def static_hosts(self) -> dict[str, str]:
        """Name -> address to connect to: the designed 127.x.y.z when bound to every address (private
        namespace), else the bound address for every host."""
        if self.bind == "0.0.0.0":
            return {h.name: h.ip for h in self.site.hosts}
        return {h.name: self.bind for h in self.site.hosts}

    def site_description(self) -> dict:
        desc = self.site.describe(self.port)
        desc["bind"] = self.bind
        desc["static_hosts"] = self.static_hosts()
        return desc

    def announcement(self) -> dict:
        """The one JSON line printed on stdout once listening."""
        default = 443 if self.scheme == "https" else 80
        authority = "" if self.port == default else f":{self.port}"
        out = {"port": self.port, "bind": self.bind, "control_port": self.control_port, "scheme": self.scheme,
               "hosts": {h.name: h.ip for h in self.site.hosts},
               "seeds": [f"{self.scheme}://{h.name}{authority}/" for h in self.site.hosts if h.role != ROLE_FARM],
               "static_hosts": self.static_hosts(), "pid": os.getpid()}
        if self.tls is not None:
            out["ca_file"] = self.tls.ca_file
        return out

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for s in self._servers:
            s.close()
        for conn in list(self.conns):
            conn.abort()
        for s in self._servers:
            await s.wait_closed()


def log(msg: str) -> None:
    print(f"simweb: {msg}", file=sys.stderr, flush=True)
