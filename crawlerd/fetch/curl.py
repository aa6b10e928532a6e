"""HTTP fetching with one libcurl multi handle driven by the asyncio (uvloop) event loop.

How a fetch runs. :meth:`Fetcher.fetch` takes a :class:`FetchRequest` whose
address the shard already resolved and checked, takes an idle easy handle
from the pool, pins the address with ``CURLOPT_CONNECT_TO`` (curl never
resolves a name itself) and adds the handle to the multi handle. curl tells
us which sockets to watch (``CURLMOPT_SOCKETFUNCTION`` -> ``loop.add_reader``
/ ``add_writer``) and when to wake it (``CURLMOPT_TIMERFUNCTION`` ->
``loop.call_later``); each readiness event or timer runs
``socket_action``, then ``info_read`` collects the transfers that ended. No
thread polls and nothing spins: an idle fetcher costs nothing.

What is kept. Bytes exactly as they crossed the wire: the request head as
sent (from curl's debug stream), the final response's status line and
headers (1xx interim answers are dropped) and the body with its transfer
coding (``HTTP_TRANSFER_DECODING=0`` keeps chunk framing; curl still parses
it to find the end) and content coding (curl is not asked to decompress;
:mod:`crawlerd.codec` does that later, with a cap). Redirects are not
followed: a 3xx is a result and the frontier handles the hop.

Limits. Connect and total timeouts, a low-speed cut-off (drip -> too_slow),
a raw body cap enforced in the write callback (too_large), a header block
cap in the header callback (headers_too_large). Every transfer ends in
exactly one :class:`Outcome`; network trouble never raises.

Safety (DESIGN §1.5). Only http and https, for the request and any
redirect; the connected address is checked again by the address guard when
curl opens the socket, and must be the pinned one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import time
import warnings

import pycurl

from crawlerd.fetch.guard import AddressGuard
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest, FetchResult

_INFOTYPE_HEADER_OUT = 2
_BUFFER_BYTES = 64 * 1024          # receive buffer per transfer (curl shares one per multi)
_E_TOO_LARGE = 100                 # CURLE_TOO_LARGE (curl >= 8.6): its own header size limit
_TLS_ERRORS = frozenset({35, 51, 53, 54, 58, 59, 60, 64, 66, 77, 80, 82, 83, 90, 91, 98})
_BLANK = (b"\r\n", b"\n")


def _status_of(line: bytes) -> int:
    parts = line.split(None, 2)
    if len(parts) >= 2 and parts[1].isdigit():
        return int(parts[1])
    return 0


def _parse_headers(lines: list[bytes]) -> list[tuple[str, str]]:
    """Header fields of a head (status line first), in order; obs-fold lines join the previous value."""
    out: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line in _BLANK:
            break
        if line[:1] in (b" ", b"\t"):
            if out:
                k, v = out[-1]
                out[-1] = (k, f"{v} {line.strip().decode('latin-1')}")
            continue
        name, sep, value = line.partition(b":")
        if sep:
            out.append((name.strip().decode("latin-1"), value.strip().decode("latin-1")))
    return out


class _Transfer:
    """One reusable easy handle plus the state of the request it runs.

    Invariant: ``fut`` is set iff the handle is in the multi handle (in
    flight); an idle transfer holds no request data.
    """

    __slots__ = ("curl", "fetcher", "fut", "req", "pinned", "started_at", "t0", "body", "body_bytes",
                 "max_body", "head", "head_bytes", "head_done", "req_head", "abort", "detail")

    def __init__(self, fetcher: Fetcher, share: pycurl.CurlShare):
        self.fetcher = fetcher
        self.fut: asyncio.Future[FetchResult] | None = None
        self.req: FetchRequest | None = None
        self._clear()
        c = self.curl = pycurl.Curl()
        f = fetcher
        c.setopt(pycurl.SHARE, share)
        c.setopt(pycurl.NOSIGNAL, 1)
        c.setopt(pycurl.PROXY, "")                       # never an environment proxy
        c.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        c.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        c.setopt(pycurl.FOLLOWLOCATION, 0)
        c.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)   # raw HTTP/1.1 bytes go to WARC
        c.setopt(pycurl.HTTP_TRANSFER_DECODING, 0)
        c.setopt(pycurl.PATH_AS_IS, 1)                   # request the URL the frontier normalised, as is
        c.setopt(pycurl.USERAGENT, f.user_agent)
        c.setopt(pycurl.CONNECTTIMEOUT_MS, int(f.connect_timeout_s * 1000))
        c.setopt(pycurl.TIMEOUT_MS, int(f.timeout_s * 1000))
        c.setopt(pycurl.LOW_SPEED_LIMIT, f.low_speed_bytes_per_s)
        c.setopt(pycurl.LOW_SPEED_TIME, f.low_speed_time_s)
        c.setopt(pycurl.BUFFERSIZE, _BUFFER_BYTES)
        c.setopt(pycurl.TCP_NODELAY, 1)
        c.setopt(pycurl.SSL_VERIFYPEER, 1 if f.verify_tls else 0)
        c.setopt(pycurl.SSL_VERIFYHOST, 2 if f.verify_tls else 0)
        c.setopt(pycurl.WRITEFUNCTION, self._on_body)
        c.setopt(pycurl.HEADERFUNCTION, self._on_header)
        c.setopt(pycurl.VERBOSE, 1)                      # the debug stream carries the request head as sent
        c.setopt(pycurl.DEBUGFUNCTION, self._on_debug)
        c.setopt(pycurl.OPENSOCKETFUNCTION, self._on_open_socket)
        c.setopt(pycurl.CLOSESOCKETFUNCTION, fetcher._on_close_socket)

    def _clear(self) -> None:
        self.pinned = ""
        self.started_at = 0.0
        self.t0 = 0.0
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.max_body = 0
        self.head: list[bytes] = []
        self.head_bytes = 0
        self.head_done = False
        self.req_head: list[bytes] = []
        self.abort: Outcome | None = None
        self.detail = ""

    # -- curl callbacks (run inside socket_action) -------------------------
    def _on_body(self, data: bytes):
        n = self.body_bytes + len(data)
        if n > self.max_body:
            self.abort = Outcome.TOO_LARGE
            self.detail = f"body exceeds {self.max_body} bytes"
            return 0                                     # short write: curl aborts (CURLE_WRITE_ERROR)
        self.body_bytes = n
        self.body.append(data)
        return None

    def _on_header(self, line: bytes):
        self.head_bytes += len(line)
        if self.head_bytes > self.fetcher.max_header_bytes:
            self.abort = Outcome.HEADERS_TOO_LARGE
            self.detail = f"response headers exceed {self.fetcher.max_header_bytes} bytes"
            return 0
        if line.startswith(b"HTTP/"):
            self.head = [line]                           # a new response: forget any 1xx before it
            self.head_done = False
        elif not self.head_done:
            self.head.append(line)
            if line in _BLANK and _status_of(self.head[0]) >= 200:
                self.head_done = True
        return None

    def _on_debug(self, kind: int, data: bytes) -> None:
        if kind == _INFOTYPE_HEADER_OUT:
            if data.startswith(b"GET "):
                self.req_head = [data]                   # curl may resend on a dead reused connection
            else:
                self.req_head.append(data)

    def _on_open_socket(self, purpose: int, address):
        ip = address.addr[0]
        f = self.fetcher
        if ip != self.pinned and not _same_ip(ip, self.pinned):
            self.abort = Outcome.BLOCKED_ADDRESS
            self.detail = f"curl tried {ip}, not the pinned {self.pinned}"
            return pycurl.SOCKET_BAD
        if not f.guard.allowed(ip):
            self.abort = Outcome.BLOCKED_ADDRESS
            self.detail = f"address {ip} is {f.guard.reason(ip)}"
            return pycurl.SOCKET_BAD
        fd = socket.socket(address.family, address.socktype, address.protocol).detach()
        if fd in f._watched:
            f._unwatch(fd)                               # a registration left by a socket closed behind our back
        st = os.fstat(fd)
        f._own[fd] = (st.st_dev, st.st_ino)              # pycurl uses an int as is (no dup)
        f.sockets_opened += 1
        return fd


def _close_if_same(fd: int, ident: tuple[int, int]) -> None:
    """Close ``fd`` only if it is still the socket we opened (the number may have been reused)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return
    if (st.st_dev, st.st_ino) == ident:
        os.close(fd)


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def _classify_error(t: _Transfer, code: int, msg: str) -> Outcome:
    if t.abort is not None:
        return t.abort
    low = msg.lower()
    if code == pycurl.E_OPERATION_TIMEDOUT:
        if "too slow" in low:
            return Outcome.TOO_SLOW
        if "connection timed out" in low or ("connect" in low and "timed out" in low):
            return Outcome.CONNECT_TIMEOUT
        return Outcome.TIMEOUT
    if code == pycurl.E_COULDNT_CONNECT:
        return Outcome.CONNECT_REFUSED
    if code == pycurl.E_FILESIZE_EXCEEDED:
        return Outcome.TOO_LARGE
    if code == _E_TOO_LARGE:
        return Outcome.HEADERS_TOO_LARGE if "header" in low else Outcome.TOO_LARGE
    if code in (pycurl.E_RECV_ERROR, pycurl.E_SEND_ERROR):
        if "chunk" in low:
            return Outcome.BAD_RESPONSE
        if "header" in low and ("large" in low or "size" in low):
            return Outcome.HEADERS_TOO_LARGE
        if "reset" in low or "broken pipe" in low or "closed" in low:
            return Outcome.CONNECTION_RESET
        return Outcome.NETWORK_ERROR
    if code in (pycurl.E_PARTIAL_FILE, pycurl.E_GOT_NOTHING):
        return Outcome.CONNECTION_RESET                  # closed before the answer was complete
    if code in (pycurl.E_UNSUPPORTED_PROTOCOL, 8):       # 8: CURLE_WEIRD_SERVER_REPLY; 1: HTTP/0.9
        return Outcome.BAD_RESPONSE
    if code in _TLS_ERRORS:
        return Outcome.TLS_ERROR
    if code == pycurl.E_URL_MALFORMAT:
        return Outcome.BAD_URL
    if code == pycurl.E_COULDNT_RESOLVE_HOST:
        return Outcome.DNS_ERROR
    return Outcome.NETWORK_ERROR


class Fetcher:
    """Concurrent HTTP/1.1 fetches over one curl multi handle on the running event loop.

    Key: each in-flight transfer by its easy handle. Invariants: a handle is
    in the multi handle iff it has a pending future (``in_flight`` counts
    them); every future is resolved exactly once with a FetchResult; a
    watched fd is registered with the loop iff curl asked for it and has not
    removed it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, user_agent: str, guard: AddressGuard,
                 connect_timeout_s: float, timeout_s: float, low_speed_bytes_per_s: int, low_speed_time_s: int,
                 max_body_bytes: int, max_header_bytes: int, max_connections: int, verify_tls: bool,
                 accept_encoding: str = "gzip, deflate, br"):
        self._loop = loop
        self.user_agent = user_agent
        self.guard = guard
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.low_speed_bytes_per_s = low_speed_bytes_per_s
        self.low_speed_time_s = low_speed_time_s
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.verify_tls = verify_tls
        self._accept = f"Accept-Encoding: {accept_encoding}" if accept_encoding else ""
        self.sockets_opened = 0
        self._share = pycurl.CurlShare()
        self._share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_SSL_SESSION)  # TLS resumption across handles
        self._share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_DNS)
        m = self._multi = pycurl.CurlMulti()
        m.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        m.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        m.setopt(pycurl.M_MAXCONNECTS, max_connections)   # the keep-alive connection cache
        self._idle: list[_Transfer] = []
        self._active: dict[pycurl.Curl, _Transfer] = {}
        self._watched: dict[int, int] = {}                  # fd -> POLL_* mask registered with the loop
        self._own: dict[int, tuple[int, int]] = {}          # fd we opened -> (st_dev, st_ino) of its socket
        self._parked: set[int] = set()                      # own idle keep-alive fds left registered
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._released = False
        self.counts: dict[str, int] = {}

    @property
    def in_flight(self) -> int:
        return len(self._active)

    # -- public API ----------------------------------------------------------
    async def fetch(self, req: FetchRequest) -> FetchResult:
        """Fetch one URL from its pinned address; the result names the outcome (never raises for I/O)."""
        early = self._refuse(req)
        if early is not None:
            self._count(early.outcome)
            return early
        t = self._idle.pop() if self._idle else _Transfer(self, self._share)
        c = t.curl
        try:
            c.setopt(pycurl.URL, req.url)
        except (pycurl.error, UnicodeError, ValueError) as e:
            self._idle.append(t)
            return self._early(req, Outcome.BAD_URL, f"curl rejected the URL: {e}")
        ip = req.ip
        host = f"[{ip}]" if ":" in ip else ip
        c.setopt(pycurl.CONNECT_TO, [f"::{host}:{req.port}"])
        headers = [self._accept] if self._accept else []
        for k, v in req.headers:
            if "\r" in k or "\n" in k or "\r" in v or "\n" in v or ":" in k:
                continue                                  # never let a header value inject lines
            headers.append(f"{k}: {v}")
        c.setopt(pycurl.HTTPHEADER, headers)
        t.max_body = req.max_body_bytes or self.max_body_bytes
        c.setopt(pycurl.MAXFILESIZE_LARGE, t.max_body)    # refuse early on a declared Content-Length
        t.req = req
        t.pinned = ip
        t.started_at = time.time()
        t.t0 = self._loop.time()
        fut = t.fut = self._loop.create_future()
        self._active[c] = t
        self._multi.add_handle(c)                         # curl asks for a timer; the work starts there
        try:
            return await fut
        except asyncio.CancelledError:
            if t.fut is fut:                              # the caller gave up: release the transfer now
                self._multi.remove_handle(c)
                self._complete(c, t, Outcome.ABORTED, "fetch cancelled")
            raise

    def _refuse(self, req: FetchRequest) -> FetchResult | None:
        if self._closed:
            return self._early(req, Outcome.ABORTED, "fetcher closed")
        scheme = req.url.split(":", 1)[0].lower()
        if scheme not in ("http", "https"):
            return self._early(req, Outcome.UNSUPPORTED_SCHEME, f"scheme {scheme!r} is not http(s)")
        if not self.guard.allowed(req.ip):
            return self._early(req, Outcome.BLOCKED_ADDRESS, f"address {req.ip} is {self.guard.reason(req.ip)}")
        return None

    @staticmethod
    def _early(req: FetchRequest, outcome: Outcome, error: str) -> FetchResult:
        return FetchResult(url=req.url, outcome=outcome, ip=req.ip, started_at=time.time(), error=error)

    def _count(self, outcome: Outcome) -> None:
        self.counts[outcome.value] = self.counts.get(outcome.value, 0) + 1

    def stats(self) -> dict:
        return {"in_flight": len(self._active), "handles": len(self._active) + len(self._idle),
                "sockets_opened": self.sockets_opened, "watched_fds": len(self._watched),
                "outcomes": dict(self.counts)}

    async def close(self, grace_s: float) -> None:
        """Stop taking work; let transfers in flight finish for up to ``grace_s`` seconds,
        then abandon the rest (outcome ``aborted``) and release every handle and socket."""
        if self._closed:
            return
        self._closed = True
        pending = [t.fut for t in self._active.values() if t.fut is not None]
        if pending and grace_s > 0:
            await asyncio.wait(pending, timeout=grace_s)
        for c, t in list(self._active.items()):
            self._multi.remove_handle(c)
            self._complete(c, t, Outcome.ABORTED, "abandoned at shutdown")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Stop watching before curl closes its cached connections, so the loop never holds a
        # closed fd (libuv aborts on one). pycurl cannot run the close-socket callback outside a
        # transfer (it warns and skips it). The easy handles go last (their callbacks may run).
        for fd in list(self._watched):
            self._unwatch(fd)
        self._released = True                             # from here on curl's socket/timer requests are ignored
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self._multi.close()
        for fd, ident in self._own.items():
            _close_if_same(fd, ident)                     # the ones pycurl could not hand to our callback
        self._own.clear()
        for t in self._idle:
            t.curl.close()
        self._idle.clear()
        self._share.close()

    # -- event-loop plumbing -------------------------------------------------
    def _on_socket(self, what: int, fd: int, multi, socketp) -> None:
        if self._released:
            return
        old = self._watched.get(fd, 0)
        if what == pycurl.POLL_REMOVE:
            if fd in self._own and old & pycurl.POLL_IN:
                # An idle keep-alive connection: keep the reader registered ("parked") so the
                # next request on it costs no loop (epoll) calls. A parked socket that turns
                # readable (peer closed it) is unregistered at once; curl closes its own
                # sockets through _on_close_socket, which unregisters before the fd is freed.
                if old & pycurl.POLL_OUT:
                    self._loop.remove_writer(fd)
                    self._watched[fd] = pycurl.POLL_IN
                self._parked.add(fd)
            elif old:
                self._unwatch(fd)
            return
        if self._parked:
            self._parked.discard(fd)
        if what == old:
            return
        loop = self._loop
        if what & pycurl.POLL_IN and not old & pycurl.POLL_IN:
            loop.add_reader(fd, self._on_readable, fd)
        elif not what & pycurl.POLL_IN and old & pycurl.POLL_IN:
            loop.remove_reader(fd)
        if what & pycurl.POLL_OUT and not old & pycurl.POLL_OUT:
            loop.add_writer(fd, self._on_writable, fd)
        elif not what & pycurl.POLL_OUT and old & pycurl.POLL_OUT:
            loop.remove_writer(fd)
        self._watched[fd] = what

    def _unwatch(self, fd: int) -> None:
        self._parked.discard(fd)
        old = self._watched.pop(fd, 0)
        if old & pycurl.POLL_IN:
            self._loop.remove_reader(fd)
        if old & pycurl.POLL_OUT:
            self._loop.remove_writer(fd)

    def _on_close_socket(self, fd: int) -> int:
        if fd in self._watched:
            self._unwatch(fd)
        self._own.pop(fd, None)
        try:
            os.close(fd)
        except OSError:
            return 1
        return 0

    def _on_timer(self, timeout_ms: int) -> None:
        # Called by curl; never call socket_action from inside it (curl docs), schedule instead.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if timeout_ms >= 0 and not self._released:
            self._timer = self._loop.call_later(timeout_ms / 1000.0, self._on_timeout)

    def _on_timeout(self) -> None:
        self._timer = None
        self._act(pycurl.SOCKET_TIMEOUT, 0)

    def _on_readable(self, fd: int) -> None:
        if fd in self._parked:
            self._unwatch(fd)                             # idle connection closed or spoke: stop watching
            return
        self._act(fd, pycurl.CSELECT_IN)

    def _on_writable(self, fd: int) -> None:
        self._act(fd, pycurl.CSELECT_OUT)

    def _act(self, fd: int, events: int) -> None:
        if self._closed and not self._active:
            return
        self._multi.socket_action(fd, events)
        m = self._multi
        while True:
            queued, ok, failed = m.info_read()
            for c in ok:
                self._finish(c, 0, "")
            for c, code, msg in failed:
                self._finish(c, code, msg)
            if not queued:
                break

    def _finish(self, c: pycurl.Curl, code: int, msg: str) -> None:
        t = self._active.get(c)
        if t is None:
            return
        self._multi.remove_handle(c)
        if code == 0:
            status = c.getinfo(pycurl.RESPONSE_CODE)
            outcome = Outcome.NOT_MODIFIED if status == 304 else Outcome.OK
            self._complete(c, t, outcome, "", status)
        else:
            self._complete(c, t, _classify_error(t, code, msg), t.detail or msg or f"curl error {code}")

    def _complete(self, c: pycurl.Curl, t: _Transfer, outcome: Outcome, error: str, status: int = 0) -> None:
        del self._active[c]
        req = t.req
        if status == 0 and t.head:
            status = _status_of(t.head[0])
        head = b"".join(t.head)
        res = FetchResult(
            url=req.url, outcome=outcome, status=status, ip=req.ip, started_at=t.started_at,
            elapsed_s=self._loop.time() - t.t0, request_head=b"".join(t.req_head), response_head=head,
            body=b"".join(t.body), headers=_parse_headers(t.head) if t.head else [], error=error,
        )
        self._count(outcome)
        fut = t.fut
        t.fut = None
        t.req = None
        t._clear()
        self._idle.append(t)                              # closed in close(), after the multi handle
        if fut is not None and not fut.done():
            fut.set_result(res)
