"""A deliberately hostile HTTP server on loopback, for fetcher tests (ARCHITECTURE.md invariant 6).

It speaks HTTP/1.1 over raw asyncio streams so it can break every rule. The
behaviour is chosen by the request path (the Host header is recorded, not
used), so one server on one port covers every case:

    /ok, /page?size=N        well-formed keep-alive answers (N bytes of body)
    /close-after             a keep-alive answer, then the server closes the idle connection
    /chunked                 a well-formed chunked body
    /echo                    the body is the request head exactly as received
    /status/NNN              an empty answer with that status
    /etag                    304 when If-None-Match matches, else 200 with an ETag
    /continue                a 100 Continue interim answer, then 200
    /drip                    headers, then the body at 1 byte per second
    /drip-headers            the header block itself at 1 byte per second
    /gzip-bomb, /br-bomb     a small body that decompresses to ``bomb_bytes``
    /endless-chunked         chunks forever (until the client leaves or a bound is hit)
    /huge-headers            a header block of ``huge_header_bytes``
    /bad-chunked             Transfer-Encoding: chunked with a non-hex chunk size
    /garbage                 bytes that are not HTTP, then close
    /empty                   close without answering
    /close-early             Content-Length promises more than is sent, then close
    /reset                   part of the body, then a TCP reset (SO_LINGER 0)
    /redirect-loop           302 to itself, forever
    /redirect?to=URL         302 to URL (e.g. a name that resolves to a forbidden address)

Every endless behaviour is bounded by ``max_stream_bytes`` and
``max_stream_s`` so a broken client cannot make the server run forever.
``log`` records (peer, local address, Host, target) per request; ``connections`` counts
accepted connections (keep-alive reuse shows as fewer connections than
requests).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import struct
import zlib
from urllib.parse import parse_qs, urlsplit

import brotli

_REASONS = {200: "OK", 204: "No Content", 301: "Moved Permanently", 302: "Found", 304: "Not Modified",
            404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}


def _zeros_gzip(n: int) -> bytes:
    co = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    out = [co.compress(block) for _ in range(n >> 20)]
    out.append(co.compress(bytes(n & ((1 << 20) - 1))))
    out.append(co.flush())
    return b"".join(out)


def _zeros_brotli(n: int) -> bytes:
    c = brotli.Compressor(quality=5)
    block = bytes(1 << 20)
    out = [c.process(block) for _ in range(n >> 20)]
    out.append(c.process(bytes(n & ((1 << 20) - 1))))
    out.append(c.finish())
    return b"".join(out)


class HostileServer:
    """Loopback HTTP server with hostile behaviours chosen by path.

    Invariant: every connection handler ends within ``max_stream_s`` seconds
    of its last request, and sends at most ``max_stream_bytes`` per response.
    """

    def __init__(self, *, bomb_bytes: int = 64 << 20, huge_header_bytes: int = 1 << 20,
                 max_stream_bytes: int = 256 << 20, max_stream_s: float = 120.0):
        self.bomb_bytes = bomb_bytes
        self.huge_header_bytes = huge_header_bytes
        self.max_stream_bytes = max_stream_bytes
        self.max_stream_s = max_stream_s
        self.log: list[tuple[str, str, str, str]] = []     # (peer, local address, Host, target)
        self.connections = 0
        self._logged = asyncio.Event()
        self._all_closed = asyncio.Event()
        self._server: asyncio.base_events.Server | None = None
        self._gzip_bomb: bytes | None = None
        self._br_bomb: bytes | None = None
        self._handlers: set[asyncio.Task] = set()
        self.address: tuple[str, int] | None = None

    @property
    def gzip_bomb(self) -> bytes:
        if self._gzip_bomb is None:
            self._gzip_bomb = _zeros_gzip(self.bomb_bytes)
        return self._gzip_bomb

    @property
    def br_bomb(self) -> bytes:
        if self._br_bomb is None:
            self._br_bomb = _zeros_brotli(self.bomb_bytes)
        return self._br_bomb

    async def start(self, host: str = "127.0.0.1", port: int = 0, ssl=None) -> tuple[str, int]:
        """Listen (TLS when ``ssl`` is an SSLContext); returns the bound (host, port)."""
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True, ssl=ssl)
        sockname = self._server.sockets[0].getsockname()
        self.address = (sockname[0], sockname[1])
        return self.address

    async def wait_requests(self, n: int) -> None:
        """Return once at least ``n`` requests have been received."""
        while len(self.log) < n:
            self._logged.clear()
            await self._logged.wait()

    async def wait_all_closed(self) -> None:
        """Return once no client connection is open (each one ended by either side)."""
        while self._handlers:
            await self._all_closed.wait()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._handlers):
            task.cancel()

    # -- connection handling ------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._handlers.add(task)
        self._all_closed.clear()
        self.connections += 1
        peer = writer.get_extra_info("peername")
        local = writer.get_extra_info("sockname")
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.max_stream_s)
                except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                keep = await asyncio.wait_for(self._respond(head, writer, peer, local), self.max_stream_s)
                if not keep:
                    return
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._handlers.discard(task)
            if not writer.transport.is_closing():
                writer.close()
            if not self._handlers:
                self._all_closed.set()

    async def _respond(self, head: bytes, writer: asyncio.StreamWriter, peer, local) -> bool:
        """Answer one request; return False to close the connection."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        target = parts[1] if len(parts) > 1 else "/"
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        url = urlsplit(target)
        path, query = url.path, parse_qs(url.query)
        self.log.append((f"{peer[0]}:{peer[1]}" if peer else "", local[0] if local else "",
                         headers.get("host", ""), target))
        self._logged.set()
        close = headers.get("connection", "").lower() == "close"
        w = writer.write

        def answer(status: int, body: bytes = b"", extra: list[str] = ()) -> None:
            hdrs = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", f"Content-Length: {len(body)}",
                    "Content-Type: text/html", *extra]
            w(("\r\n".join(hdrs) + "\r\n\r\n").encode("latin-1") + body)

        if path in ("/", "/ok"):
            answer(200, b"<html><body>ok</body></html>")
        elif path == "/close-after":
            answer(200, b"then the server drops the idle connection")
            await writer.drain()
            return False
        elif path == "/page":
            size = int(query.get("size", ["20000"])[0])
            answer(200, b"x" * min(size, self.max_stream_bytes))
        elif path == "/echo":
            answer(200, head, ["Content-Type: text/plain"])
        elif path.startswith("/status/"):
            answer(int(path.rsplit("/", 1)[1]))
        elif path == "/etag":
            if headers.get("if-none-match") == '"v1"':
                w(b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\n\r\n')
            else:
                answer(200, b"versioned", ['ETag: "v1"'])
        elif path == "/continue":
            w(b"HTTP/1.1 100 Continue\r\n\r\n")
            answer(200, b"after continue")
        elif path == "/chunked":
            w(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
              b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n")
        elif path == "/drip":
            w(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            await self._drip(writer, b"x" * 100000)
            return False
        elif path == "/drip-headers":
            await self._drip(writer, b"HTTP/1.1 200 OK\r\n" + b"X-Slow: y\r\n" * 1000 + b"\r\n")
            return False
        elif path == "/gzip-bomb":
            answer(200, self.gzip_bomb, ["Content-Encoding: gzip"])
        elif path == "/br-bomb":
            answer(200, self.br_bomb, ["Content-Encoding: br"])
        elif path == "/endless-chunked":
            w(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"4000\r\n" + b"z" * 0x4000 + b"\r\n"
            sent = 0
            while sent < self.max_stream_bytes:
                w(chunk)
                sent += len(chunk)
                await writer.drain()
            return False
        elif path == "/huge-headers":
            pad = "X-Pad: " + "p" * 1000
            n = self.huge_header_bytes // (len(pad) + 2) + 1
            answer(200, b"big head", [pad] * n)
        elif path == "/bad-chunked":
            w(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz-not-hex\r\nhello\r\n0\r\n\r\n")
            await writer.drain()
            return False
        elif path == "/garbage":
            w(b"\x00\x01SSH-2.0-not-http\xff\xfe" + bytes(range(256)) * 4)
            await writer.drain()
            return False
        elif path == "/empty":
            return False
        elif path == "/close-early":
            w(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"y" * 10)
            await writer.drain()
            return False
        elif path == "/reset":
            w(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"r" * 5000)
            await writer.drain()
            sock = writer.get_extra_info("socket")
            # SO_LINGER {on, 0 s}: close() sends RST instead of FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        elif path == "/redirect-loop":
            answer(302, b"", ["Location: /redirect-loop"])
        elif path == "/redirect":
            answer(302, b"", [f"Location: {query.get('to', ['/'])[0]}"])
        else:
            answer(404, b"not found")
        await writer.drain()
        return not close

    async def _drip(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        # one byte per second: bounded by max_stream_s through the caller's wait_for
        for i in range(len(data)):
            writer.write(data[i:i + 1])
            await writer.drain()
            await asyncio.sleep(1.0)


async def _main(host: str, port: int) -> None:
    server = HostileServer()
    bound = await server.start(host, port)
    print(f"{bound[0]} {bound[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description="Hostile HTTP server on loopback (prints 'HOST PORT').")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    try:
        asyncio.run(_main(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
