"""The Prometheus scrape endpoint (``metrics.listen``): a minimal HTTP/1.1 server on the daemon's loop.

It answers ``GET /metrics`` (and ``HEAD``) with the exposition of a fresh
stats snapshot, taken on the loop that owns the crawl state, so no locks are
needed; ``/`` answers with a one-line pointer, anything else 404/405. One
request per connection (``Connection: close``), request head bounded in size
and time, so a stuck or hostile client costs one socket for a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from crawlerd.config import parse_listen

log = logging.getLogger("crawlerd.metrics")

MAX_HEAD_BYTES = 16 << 10
HEAD_TIMEOUT_S = 5.0

Render = Callable[[str], tuple[bytes, str]]      # Accept header -> (body, content type)


class MetricsServer:
    """Serves ``render(accept)`` at ``/metrics``. Key: one listening socket per ``listen`` address."""

    def __init__(self, listen: str, render: Render):
        self.host, self.port = parse_listen(listen)
        self.render = render
        self._server: asyncio.AbstractServer | None = None
        self.scrapes = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=MAX_HEAD_BYTES)
        if self.port == 0:      # tests bind an ephemeral port and read it back
            self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=HEAD_TIMEOUT_S)
            status, ctype, body, is_head = self._answer(head)
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + (b"" if is_head else body))
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, str, bytes, bool]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", "text/plain", b"bad request line\n", False
        method, target = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET and HEAD\n", False
        is_head = method == "HEAD"
        if target == "/metrics":
            accept = next((ln.split(":", 1)[1].strip() for ln in lines[1:]
                           if ln.lower().startswith("accept:")), "")
            try:
                body, ctype = self.render(accept)
            except Exception as e:       # a store closing at shutdown: answer 503, never crash the loop
                log.error("metrics render failed: %r", e)
                return "503 Service Unavailable", "text/plain", f"stats unavailable: {e}\n".encode(), is_head
            self.scrapes += 1
            return "200 OK", ctype, body, is_head
        if target == "/":
            return "200 OK", "text/plain", b"crawlerd: metrics at /metrics\n", is_head
        return "404 Not Found", "text/plain", b"not found; metrics are at /metrics\n", is_head
