"""One transfer: a reusable curl easy handle, the state of the request it runs, and how its end
is named.

Per-transfer Python work is kept off the byte path: curl appends header lines straight into a
list (``list.append`` as the callback, no Python frame per line), joined once when the transfer
ends (:class:`crawlerd.fetch.curl.Fetcher`). Body chunks go the same way into a list, or, when the
fetcher has a body pool, into a native :class:`~crawlerd._native.bodypool.BodyWriter` that copies
each chunk straight into the transfer's pool blocks (no chunk list, no join, no C heap). Sockets: curl opens them through
the open-socket callback, where the address guard checks the connected address again and it
must be the pinned one (ARCHITECTURE.md invariant 5). :func:`classify_error` turns curl's error
code and message into one :class:`Outcome`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import TYPE_CHECKING

import pycurl

from crawlerd._native.bodypool import BodyWriter
from crawlerd.outcome import Outcome
from crawlerd.records import FetchRequest, FetchResult

if TYPE_CHECKING:
    from crawlerd.fetch.curl import Fetcher

_INFOTYPE_HEADER_OUT = 2
_BUFFER_BYTES = 64 * 1024          # receive buffer per transfer (curl shares one per multi)
_E_TOO_LARGE = 100                 # CURLE_TOO_LARGE (curl >= 8.6): its own header size limit
FENCED = "fenced: this process no longer holds its shard's lease"
_TLS_ERRORS = frozenset({35, 51, 53, 54, 58, 59, 60, 64, 66, 77, 80, 82, 83, 90, 91, 98})


class Transfer:
    """One reusable easy handle plus the state of the request it runs.

    Invariant: ``fut`` is set iff the handle is in the multi handle (in
    flight); an idle transfer holds no request data (``head``, ``body``
    and ``debug`` are empty). ``head`` and ``body`` are the very objects curl
    writes to (a list's ``append``, or the pool's body writer itself, is the
    callback), so they are cleared, never replaced. ``opt_*`` mirror what is set on the handle, so a
    setting that did not change is not set again.
    """

    __slots__ = ("curl", "fetcher", "fut", "req", "pinned", "started_at", "t0", "body", "head", "debug",
                 "req_head", "verbose", "abort", "detail", "max_body", "opt_connect_to", "opt_headers",
                 "opt_max_body", "opt_forbid_reuse", "opt_prereq")

    def __init__(self, fetcher: Fetcher, share: pycurl.CurlShare):
        self.fetcher = fetcher
        self.fut: asyncio.Future[FetchResult] | None = None
        self.req: FetchRequest | None = None
        self.body: list[bytes] | BodyWriter = [] if fetcher.body_pool is None else BodyWriter(fetcher.body_pool)
        self.head: list[bytes] = []
        self.debug: list[bytes] = []
        self.pinned = ""
        self.started_at = 0.0
        self.t0 = 0.0
        self.req_head = b""
        self.verbose = False
        self.abort: Outcome | None = None
        self.detail = ""
        self.max_body = 0
        self.opt_connect_to = ""
        self.opt_headers: list[bytes] | None = None
        self.opt_max_body = -1
        self.opt_forbid_reuse = False
        self.opt_prereq = True             # the pre-request callback is set (the fetcher unsets it without a gate)
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
        # curl never resolves a name (CONNECT_TO pins an address literal), so its DNS cache holds
        # only those literals; with a timeout it prunes the whole cache on every transfer.
        c.setopt(pycurl.DNS_CACHE_TIMEOUT, 0)
        c.setopt(pycurl.USERAGENT, f.user_agent)
        c.setopt(pycurl.CONNECTTIMEOUT_MS, int(f.connect_timeout_s * 1000))
        c.setopt(pycurl.TIMEOUT_MS, int(f.timeout_s * 1000))
        c.setopt(pycurl.LOW_SPEED_LIMIT, f.low_speed_bytes_per_s)
        c.setopt(pycurl.LOW_SPEED_TIME, f.low_speed_time_s)
        c.setopt(pycurl.BUFFERSIZE, _BUFFER_BYTES)
        c.setopt(pycurl.TCP_NODELAY, 1)
        c.setopt(pycurl.MAXAGE_CONN, max(1, round(f.keep_alive_idle_s)))     # idle longer: closed, not reused
        c.setopt(pycurl.SSL_VERIFYPEER, 1 if f.verify_tls else 0)
        c.setopt(pycurl.SSL_VERIFYHOST, 2 if f.verify_tls else 0)
        if f.ca_file:
            c.setopt(pycurl.CAINFO, f.ca_file)            # a private CA instead of the system store
        c.setopt(pycurl.WRITEFUNCTION, self.body.append if isinstance(self.body, list) else self.body)
        c.setopt(pycurl.HEADERFUNCTION, self.head.append)
        c.setopt(pycurl.DEBUGFUNCTION, self._on_debug)   # runs only while VERBOSE is on (unmodelled heads)
        c.setopt(pycurl.OPENSOCKETFUNCTION, self._on_open_socket)
        c.setopt(pycurl.PREREQFUNCTION, self.on_prereq)   # only while the fetcher has a gate

    # -- curl callbacks (run inside socket_action) -------------------------
    def _on_debug(self, kind: int, data: bytes) -> None:
        if kind == _INFOTYPE_HEADER_OUT:
            if data.startswith(b"GET "):
                self.debug.clear()                       # curl may resend on a dead reused connection
            self.debug.append(data)

    def on_prereq(self, conn_primary_ip, conn_local_ip, conn_primary_port, conn_local_port) -> int:
        # connected, request not sent yet: the last moment the fetcher's gate (a shard's lease
        # fence) can stop a request that was queued before the gate closed
        gate = self.fetcher.gate
        if gate is not None and not gate():
            self.abort = Outcome.ABORTED
            self.detail = FENCED
            return pycurl.PREREQFUNC_ABORT
        return pycurl.PREREQFUNC_OK

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
        try:
            fd = socket.socket(address.family, address.socktype, address.protocol).detach()
        except OSError as e:                             # e.g. EMFILE: an outcome, never a traceback on stderr
            self.abort = Outcome.NETWORK_ERROR
            self.detail = f"cannot open a socket: {e}"
            return pycurl.SOCKET_BAD
        f.forget_fd(fd)                                  # records left by a socket curl closed on its own
        f.sockets_opened += 1
        return fd                                        # pycurl hands an int to curl as is; curl closes it


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def classify_error(t: Transfer, code: int, msg: str) -> Outcome:
    """The outcome of a transfer curl ended with error ``code``; an abort a callback recorded wins."""
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
