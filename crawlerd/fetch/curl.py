"""HTTP fetching with one libcurl multi handle driven by the asyncio (uvloop) event loop.

How a fetch runs. :meth:`Fetcher.fetch` takes a :class:`FetchRequest` whose
address the shard already resolved and checked, takes an idle easy handle
from the pool, pins the address with ``CURLOPT_CONNECT_TO`` (curl never
resolves a name itself) and adds the handle to the multi handle. curl tells
us which sockets to watch (``CURLMOPT_SOCKETFUNCTION`` -> a private epoll
set; the loop watches its one fd); each readiness event or timer runs
``socket_action``, then ``info_read`` collects the transfers that ended
(only when curl's running count says one did). When to wake it is read,
not called back: curl's deadline moves only inside our calls into it
(``add_handle``, ``socket_action``, ``remove_handle``), so after those we
ask ``curl_multi_timeout`` once and keep one loop timer no later than it
(re-armed only when the deadline moves earlier; one that fires early asks
again and sleeps on). A ``CURLMOPT_TIMERFUNCTION`` ran a Python callback
about twice per transfer, each inside curl with the GIL released, so with
the writer, DRUM and sync threads alive each was a GIL hand-over, often a
wait. No thread polls and nothing spins: an idle fetcher costs nothing.

What is kept. Bytes exactly as they crossed the wire: the request head as
sent, the final response's status line and headers (1xx interim answers are
dropped) and the body with its transfer coding (``HTTP_TRANSFER_DECODING=0``
keeps chunk framing; curl still parses it to find the end) and content
coding (curl is not asked to decompress; :mod:`crawlerd.fetch.codec` does that
later, with a cap). Redirects are not followed: a 3xx is a result and the
frontier handles the hop. With a body pool (``body_pool``, the shard's) the
body is written straight into pool blocks and the result carries it as
``pooled`` (``body`` empty; ``FetchResult.content()`` reads it); a body that
finds no free block stays on the heap as ``body``.

The request head. We set every header curl sends, so for an ordinary URL
the fetcher writes the head itself (:mod:`crawlerd.fetch.http_head`) and
``CURLINFO_REQUEST_SIZE`` confirms that curl sent exactly that many bytes;
any other transfer takes the head from curl's debug stream. Verbose mode on
every transfer cost curl its info-text formatting plus about nine Python
callbacks per transfer. Per-transfer state and error classification live in
:mod:`crawlerd.fetch.transfer`.

Limits. Connect and total timeouts, a low-speed cut-off (drip -> too_slow),
a raw body cap (curl's ``MAXFILESIZE``: refused early on a declared
Content-Length, cut off when an undeclared body reaches it: too_large), a
header block cap checked when the transfer ends (headers_too_large; curl's
own 300 KB header limit bounds what arrives before that). Every transfer
ends in exactly one :class:`Outcome`; network trouble never raises.

Sockets. curl opens them through the transfer's open-socket callback
(:mod:`crawlerd.fetch.transfer`: the address guard checks the connected
address again, ARCHITECTURE.md invariant 5) and closes them itself.
No close-socket callback: pycurl can only run it while the easy handle that
opened the connection is in the multi handle, and curl closes idle pooled
connections (dead, too old, over ``MAXCONNECTS``) long after that handle
went back to the pool (pycurl then warned on stderr and leaked the fd).
curl's sockets sit in our own epoll set, never in the loop's: a socket
curl closes behind our back simply leaves the set (the kernel drops a
closed file), where libuv would abort on a closed fd it still watches.
That also lets an idle keep-alive socket stay registered ("parked")
between requests at no risk, so reusing a connection costs one
``epoll_ctl`` instead of the loop's add/remove churn (several syscalls).

Safety (ARCHITECTURE.md invariant 5). Only http and https, for the request and any
redirect; the connected address is checked again by the address guard when
curl opens the socket, and must be the pinned one.
"""

from __future__ import annotations

import asyncio
import logging
import select
import time
from collections import deque

import pycurl

from crawlerd._native.bodypool import BodyPool
from crawlerd.fetch.guard import AddressGuard
from crawlerd.fetch.http_head import (
    CURL_MANAGED,
    HEADER_TOKEN,
    final_head,
    parse_headers,
    request_head,
    status_of,
)
from crawlerd.fetch.transfer import FENCED, Transfer, classify_error
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest, FetchResult

log = logging.getLogger(__name__)

_POLL_IN, _POLL_OUT, _POLL_REMOVE = pycurl.POLL_IN, pycurl.POLL_OUT, pycurl.POLL_REMOVE
_EPOLL_OF = {pycurl.POLL_IN: select.EPOLLIN, pycurl.POLL_OUT: select.EPOLLOUT,
             pycurl.POLL_INOUT: select.EPOLLIN | select.EPOLLOUT}
_EPOLL_READ = select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR
_EPOLL_WRITE = select.EPOLLOUT | select.EPOLLHUP | select.EPOLLERR
_TIMER_SLACK_MS = 1                # a loop timer that fires this close to curl's deadline counts as due
# Ready sockets handed to curl per loop callback. The private epoll set is level-triggered and
# stays readable while sockets are left, so the loop calls back next iteration: its timers and
# other callbacks run between batches. Unbounded, a wave of ~1,000 transfers made one iteration
# of up to ~150 ms (the loop's stalls, bench/RESULTS.md); a batch is a few ms.
READY_EVENTS = 32
# libcurl 8.4 is the first to cut a body off at MAXFILESIZE while it streams (older ones only refuse a
# declared Content-Length), and the body cap relies on it: no Python write callback checks sizes.
_MIN_LIBCURL = 0x080400
# What one idle connection in curl's cache holds, measured by bench/conn_cache_bench.py (libcurl 8.23,
# OpenSSL 3.6): ~1.5 KiB of C heap over HTTP, ~142 KiB over HTTPS (TLS state and buffers). The cache
# is sized in bytes (fetch.connection_cache_bytes) at the HTTPS cost, the worst case.
CONNECTION_BYTES = 144 << 10


def connection_slots(cache_bytes: int) -> int:
    """Idle connections curl may keep (``CURLMOPT_MAXCONNECTS``) within ``cache_bytes``."""
    return max(1, cache_bytes // CONNECTION_BYTES)


def _quiet(op, fd: int, *args) -> None:
    """An epoll_ctl call that may find the fd already closed (curl closes sockets on its own)."""
    try:
        op(fd, *args)
    except OSError:
        pass


class Fetcher:
    """Concurrent HTTP/1.1 fetches over one curl multi handle on the running event loop.

    Key: each in-flight transfer by its easy handle. Invariants: a handle is
    in the multi handle iff it has a pending future (``in_flight`` counts
    them); every future is resolved exactly once with a FetchResult; an fd
    is in ``_watched`` iff curl asked to watch it and has not removed it, and
    then it is in the private epoll set with that mask; a ``_parked`` fd is
    an idle keep-alive socket left in the set, or a number curl has since
    closed (the kernel dropped it from the set; the entry goes when the
    number comes back through the transfer's open-socket callback or
    ``_on_socket``, so both maps stay bounded by the fd numbers in use); after every
    call into curl that can move its deadline the loop timer is armed no later than
    that deadline (``_arm``), so no deadline of curl's passes unserved.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, user_agent: str, guard: AddressGuard,
                 connect_timeout_s: float, timeout_s: float, low_speed_bytes_per_s: int, low_speed_time_s: int,
                 max_body_bytes: int, max_header_bytes: int, max_connections: int, verify_tls: bool,
                 accept_encoding: str = "gzip, deflate, br", ca_file: str = "", max_transfers: int = 0,
                 keep_alive_idle_s: float = 5.0, on_done=None, body_pool: BodyPool | None = None):
        libcurl = pycurl.version_info()
        if libcurl[2] < _MIN_LIBCURL:
            raise RuntimeError(f"libcurl {libcurl[1]} is too old: the fetcher needs 8.4 or newer "
                               "(MAXFILESIZE enforced on streamed bodies)")
        self._loop = loop
        # bodies go into this pool's blocks (fall back to the heap when it is full); None: the heap
        self.body_pool = body_pool
        self.user_agent = user_agent
        self.guard = guard
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.low_speed_bytes_per_s = low_speed_bytes_per_s
        self.low_speed_time_s = low_speed_time_s
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.verify_tls = verify_tls
        self.ca_file = ca_file
        self.keep_alive_idle_s = keep_alive_idle_s      # idle connections older than this are not reused
        # max_transfers: transfers on the wire at once (0: no bound); a fetch over it waits its turn
        self.max_transfers = max_transfers
        self._queue: deque[asyncio.Future] = deque()        # fetches waiting for a transfer slot, FIFO
        self._handed = 0                                    # slots handed to waiters not yet running
        self._on_done = on_done                             # called after each transfer ends (wake the loop)
        self._accept = [f"Accept-Encoding: {accept_encoding}".encode("latin-1")] if accept_encoding else []
        # The User-Agent line curl writes; an empty agent is left to curl's debug stream.
        self._ua_line = f"User-Agent: {user_agent}\r\n".encode() if user_agent and user_agent.isascii() else b""
        self.sockets_opened = 0
        self.heads_built = 0                                # request heads we wrote, confirmed by size
        self.heads_debug = 0                                # request heads taken from curl's debug stream
        self.heads_unconfirmed = 0                          # built heads whose size curl did not confirm
        self.connections_new = 0                            # transfers that opened a connection
        self.connections_reused = 0                         # transfers on a kept-alive connection
        self._share = pycurl.CurlShare()
        self._share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_SSL_SESSION)  # TLS resumption across handles
        self._share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_DNS)          # one address cache (CONNECT_TO)
        m = self._multi = pycurl.CurlMulti()
        m.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)   # no timer function: see _arm
        m.setopt(pycurl.M_MAXCONNECTS, max_connections)   # the keep-alive connection cache
        self._idle: list[Transfer] = []
        self._active: dict[pycurl.Curl, Transfer] = {}
        # curl's sockets live in a private epoll set; the loop watches only its fd (see module doc)
        self._ep = select.epoll()
        self._watched: dict[int, int] = {}                  # fd -> POLL_* mask curl asked for, in _ep
        self._parked: dict[int, int] = {}                   # idle keep-alive fd left in _ep (reading)
        loop.add_reader(self._ep.fileno(), self._on_ready)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0                                # loop time the armed timer fires at
        self._closed = False
        self._released = False
        self._counts: dict[Outcome, int] = {}
        # gate() -> bool, asked before a transfer starts and again once connected, before the
        # request goes out; False ends it ABORTED (a shard's lease fence). None: always open.
        self.gate = None

    @property
    def in_flight(self) -> int:
        return len(self._active)

    @property
    def connections_open(self) -> int:
        """Sockets curl watches or keeps idle (an upper estimate: a parked number may be closed)."""
        return len(self._watched) + len(self._parked)

    @property
    def waiting(self) -> int:
        """Fetches waiting for a transfer slot (``max_transfers``)."""
        return len(self._queue)

    @property
    def counts(self) -> dict[str, int]:
        """Transfers ended, by outcome name."""
        return {o.value: n for o, n in self._counts.items()}

    # -- public API ----------------------------------------------------------
    async def fetch(self, req: FetchRequest) -> FetchResult:
        """Fetch one URL from its pinned address; the result names the outcome (never raises for I/O)."""
        early = self._refuse(req)
        if early is not None:
            self._count(early.outcome)
            return early
        if self.max_transfers and (len(self._active) + self._handed >= self.max_transfers or self._queue):
            turn = self._loop.create_future()
            self._queue.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn in self._queue:
                    self._queue.remove(turn)
                elif turn.done() and not turn.cancelled():
                    self._handed -= 1
                    self._next_turn()                     # pass the slot it was handed on
                raise
            self._handed -= 1
            if self._closed:
                self._count(Outcome.ABORTED)
                return self._early(req, Outcome.ABORTED, "fetcher closed")
        if self.gate is not None and not self.gate():
            return self._early(req, Outcome.ABORTED, FENCED)
        t = self._idle.pop() if self._idle else Transfer(self, self._share)
        c = t.curl
        url = req.url
        try:
            c.setopt(pycurl.URL, url)
        except (pycurl.error, UnicodeError, ValueError) as e:
            self._idle.append(t)
            self._count(Outcome.BAD_URL)
            return self._early(req, Outcome.BAD_URL, f"curl rejected the URL: {e}")
        ip = req.ip
        connect_to = f"::[{ip}]:{req.port}" if ":" in ip else f"::{ip}:{req.port}"
        if connect_to != t.opt_connect_to:
            c.setopt(pycurl.CONNECT_TO, [connect_to])
            t.opt_connect_to = connect_to
        headers = self._accept
        modelled = bool(self._ua_line)
        if req.headers:
            headers = list(headers)
            for k, v in req.headers:
                if "\r" in k or "\n" in k or "\r" in v or "\n" in v or ":" in k:
                    continue                              # never let a header value inject lines
                try:
                    headers.append(f"{k}: {v}".encode("latin-1"))
                except UnicodeEncodeError:
                    continue                              # not sendable as HTTP/1.1 field bytes
                if modelled and (k.lower() in CURL_MANAGED or not v.strip() or not HEADER_TOKEN.match(k)):
                    modelled = False                      # curl rewrites or drops it: take its debug stream
        if headers != t.opt_headers:
            c.setopt(pycurl.HTTPHEADER, headers)
            t.opt_headers = headers
        head = request_head(url, self._ua_line, headers) if modelled else None
        if head is None:
            if not t.verbose:
                c.setopt(pycurl.VERBOSE, 1)               # the debug stream carries the request head as sent
                t.verbose = True
        elif t.verbose:
            c.setopt(pycurl.VERBOSE, 0)
            t.verbose = False
        t.req_head = head or b""
        forbid = not req.keep_alive
        if forbid != t.opt_forbid_reuse:
            c.setopt(pycurl.FORBID_REUSE, 1 if forbid else 0)   # closed when done: not left idle in the cache
            t.opt_forbid_reuse = forbid
        max_body = t.max_body = req.max_body_bytes or self.max_body_bytes
        if max_body != t.opt_max_body:
            c.setopt(pycurl.MAXFILESIZE_LARGE, max_body)  # refused early on Content-Length, else cut at the cap
            t.opt_max_body = max_body
        prereq = self.gate is not None
        if prereq != t.opt_prereq:
            # a Python callback per transfer only when there is a gate to ask (a shard's lease fence)
            c.setopt(pycurl.PREREQFUNCTION, t.on_prereq if prereq else None)
            t.opt_prereq = prereq
        t.req = req
        t.pinned = ip
        t.started_at = time.time()
        # the precise clock, not the loop's time (cached at the start of an iteration): started_at +
        # elapsed_s is then no earlier than when this answer was collected, which the host's gap follows
        t.t0 = time.monotonic()
        fut = t.fut = self._loop.create_future()
        self._active[c] = t
        self._multi.add_handle(c)                         # its deadline is "now": the work starts at the timer
        self._arm()
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
        self._counts[outcome] = self._counts.get(outcome, 0) + 1

    def stats(self) -> dict:
        return {"in_flight": len(self._active), "handles": len(self._active) + len(self._idle),
                "sockets_opened": self.sockets_opened, "watched_fds": len(self._watched),
                "connections": {"new": self.connections_new, "reused": self.connections_reused},
                "request_heads": {"built": self.heads_built, "debug_stream": self.heads_debug,
                                  "unconfirmed": self.heads_unconfirmed},
                "outcomes": self.counts}

    async def close(self, grace_s: float) -> None:
        """Stop taking work; let transfers in flight finish for up to ``grace_s`` seconds,
        then abandon the rest (outcome ``aborted``) and release every handle and socket."""
        if self._closed:
            return
        self._closed = True
        while self._queue:                                # waiting fetches end as aborted
            turn = self._queue.popleft()
            if not turn.done():
                self._handed += 1
                turn.set_result(None)
        pending = [t.fut for t in self._active.values() if t.fut is not None]
        if pending and grace_s > 0:
            await asyncio.wait(pending, timeout=grace_s)
        for c, t in list(self._active.items()):
            self._multi.remove_handle(c)
            self._complete(c, t, Outcome.ABORTED, "abandoned at shutdown")
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # The loop must never hold a closed fd (libuv aborts on one): it holds only the epoll fd.
        self._loop.remove_reader(self._ep.fileno())
        self._released = True                             # from here on curl's socket/timer requests are ignored
        self._watched.clear()
        self._parked.clear()
        self._multi.close()                               # closes every pooled connection
        for t in self._idle:
            t.curl.close()
        self._idle.clear()
        self._share.close()
        self._ep.close()

    # -- event-loop plumbing -------------------------------------------------
    def _on_socket(self, what: int, fd: int, multi, socketp) -> None:
        if self._released:
            return
        watched = self._watched
        ep = self._ep
        if what == _POLL_REMOVE:
            old = watched.pop(fd, 0)
            if old & _POLL_IN:
                # Park it: an idle keep-alive connection stays registered, so its next request
                # costs no epoll_ctl. It leaves the set when it turns readable (the peer closed
                # or spoke out of turn) or when curl closes it (the kernel drops it then).
                if old & _POLL_OUT:
                    _quiet(ep.modify, fd, _EPOLL_OF[_POLL_IN])
                self._parked[fd] = _POLL_IN
            elif old:
                _quiet(ep.unregister, fd)
            return
        old = watched.get(fd, 0)
        if what == old:
            return
        # A parked fd is usually back from idle (modify); if curl closed it meanwhile and a new
        # file has its number, modify finds nothing and it is registered afresh.
        in_set = old or self._parked.pop(fd, 0)
        ev = _EPOLL_OF[what]
        try:
            (ep.modify if in_set else ep.register)(fd, ev)
        except FileNotFoundError:
            ep.register(fd, ev)
        except FileExistsError:
            ep.modify(fd, ev)
        watched[fd] = what

    def forget_fd(self, fd: int) -> None:
        """Drop every record of ``fd``: its number now names a new socket (the old file is closed,
        so the kernel already took it out of the epoll set)."""
        self._watched.pop(fd, None)
        self._parked.pop(fd, None)

    def _on_ready(self) -> None:
        """The private epoll set has events: run curl on up to ``READY_EVENTS`` ready sockets
        (the rest on the loop's next iteration), then collect."""
        if self._released:
            return
        watched = self._watched
        m = self._multi
        running = -1
        for fd, ev in self._ep.poll(0, READY_EVENTS):
            what = watched.get(fd, 0)
            if not what:
                # parked (an idle connection closed or spoke) or already gone: stop watching
                self._parked.pop(fd, None)
                _quiet(self._ep.unregister, fd)
                continue
            bits = 0
            if ev & _EPOLL_READ and what & _POLL_IN:
                bits = pycurl.CSELECT_IN
            if ev & _EPOLL_WRITE and what & _POLL_OUT:
                bits |= pycurl.CSELECT_OUT
            if ev & select.EPOLLERR:
                bits |= pycurl.CSELECT_ERR
            _, running = m.socket_action(fd, bits)
        if 0 <= running < len(self._active):
            self._collect()
        self._arm()

    def _arm(self) -> None:
        """After a call that may have moved curl's deadline: keep the loop timer no later than it.
        A timer already armed for an earlier time is kept (when it fires it asks again and sleeps
        on), so the usual sequence -- "now" for a batch of new handles, then their far-off timeouts
        -- costs one loop timer. ``curl_multi_timeout`` is a plain C call (the GIL is kept)."""
        if self._released:
            return
        timeout_ms = self._multi.timeout()
        if timeout_ms < 0:
            return                                        # nothing to time: a running timer asks again
        loop = self._loop
        due = loop.time() + timeout_ms / 1000.0
        timer = self._timer
        if timer is not None:
            if self._timer_at <= due:
                return
            timer.cancel()
        self._timer_at = due
        self._timer = loop.call_at(due, self._on_timeout)

    def _on_timeout(self) -> None:
        self._timer = None
        if self._released:
            return
        timeout_ms = self._multi.timeout()
        if timeout_ms < 0:
            return                                        # the transfers that wanted it are gone
        if timeout_ms > _TIMER_SLACK_MS:                 # curl's deadline moved later: sleep on
            self._arm()
            return
        _, running = self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
        if running < len(self._active):
            self._collect()
        self._arm()

    def _collect(self) -> None:
        """Finish every transfer curl reports done."""
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
            self._complete(c, t, Outcome.OK, "", c.getinfo(pycurl.RESPONSE_CODE))
        else:
            outcome = classify_error(t, code, msg)
            if outcome is Outcome.TOO_LARGE and code == pycurl.E_FILESIZE_EXCEEDED:
                t.detail = f"body exceeds {t.max_body} bytes"
            self._complete(c, t, outcome, t.detail or msg or f"curl error {code}")

    def _request_head_sent(self, c: pycurl.Curl, t: Transfer) -> bytes:
        """The request head as it went out: ours confirmed by curl's byte count, or curl's debug stream."""
        if t.verbose:
            self.heads_debug += 1
            head = b"".join(t.debug)
            t.debug.clear()
            return head
        sent = c.getinfo(pycurl.REQUEST_SIZE)
        if sent == 0:
            return b""                                    # nothing went out (no connection)
        head = t.req_head
        if sent % len(head):                              # a resend on a dead reused connection counts twice
            self.heads_unconfirmed += 1
            log.warning("request head not confirmed url=%s built_bytes=%d curl_sent_bytes=%d",
                        t.req.url, len(head), sent)
        else:
            self.heads_built += 1
        return head

    def _complete(self, c: pycurl.Curl, t: Transfer, outcome: Outcome, error: str, status: int = 0) -> None:
        del self._active[c]
        req = t.req
        lines = t.head
        body_parts = t.body
        request_head = self._request_head_sent(c, t)
        if lines:
            raw = b"".join(lines)
            lines.clear()
            cap = self.max_header_bytes
            if len(raw) > cap:
                # Checked here, not per line: the lines went straight into a list. Whatever ended the
                # transfer, the head was over the cap first; the cap counts every header line of the
                # exchange, 1xx included. curl's own 300 KB header limit bounds what arrives.
                outcome = Outcome.HEADERS_TOO_LARGE
                error = f"response headers exceed {cap} bytes"
                raw = raw[:cap]
                status = 0
                body_parts.clear()
            head = final_head(raw)
            if status == 0:
                status = status_of(head)
            headers = parse_headers(head)
        else:
            head = b""
            headers = []
        if outcome is Outcome.OK and status == 304:
            outcome = Outcome.NOT_MODIFIED
        if status:
            if c.getinfo(pycurl.NUM_CONNECTS):
                self.connections_new += 1
            else:
                self.connections_reused += 1
        pooled = None
        if isinstance(body_parts, list):
            body = b"".join(body_parts) if body_parts else b""
            body_parts.clear()
        else:
            body = body_parts.finish()                    # the writer is empty again for the next transfer
            if not isinstance(body, bytes):
                body, pooled = b"", body
        res = FetchResult(url=req.url, outcome=outcome, status=status, ip=req.ip, started_at=t.started_at,
                          elapsed_s=time.monotonic() - t.t0, request_head=request_head, response_head=head,
                          body=body, headers=headers, error=error, pooled=pooled)
        self._count(outcome)
        fut = t.fut
        t.fut = None
        t.req = None
        t.req_head = b""
        t.abort = None
        t.detail = ""
        self._idle.append(t)                              # closed in close(), after the multi handle
        if fut is not None and not fut.done():
            fut.set_result(res)
        if self._queue:
            self._next_turn()
        if self._on_done is not None:
            self._on_done()

    def _next_turn(self) -> None:
        """A transfer slot is free: the oldest waiting fetch takes it."""
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                self._handed += 1
                turn.set_result(None)
                return
