"""Asynchronous DNS with a TTL-bounded cache (aiodns over c-ares).

IRLbot (§6) found DNS the first wall a single-box crawler hits; the answer is
an asynchronous resolver with many queries in flight and a local cache. This
resolver asks for A records (and AAAA when IPv6 is on), caches answers for
their TTL clamped to ``[min_ttl_s, max_ttl_s]``, caches NXDOMAIN, SERVFAIL
and no-address answers for ``negative_ttl_s``, coalesces concurrent lookups of
one name into one query, and caps the queries in flight. Timeouts and other
errors (``dns_error``) are not cached: c-ares fails every lookup pending on a
server when that server sends one garbled reply, so an error is not evidence
about the name itself; the next lookup asks again. The resolver only names addresses; the address guard decides whether
they may be used.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import aiodns
import orjson
import pycares
from aiodns.error import DNSError
from pycares import errno as ares_errno

from crawlerd.bytecache import INT_BYTES, TUPLE_BASE, ByteLRU, slots_bytes, str_bytes
from crawlerd.outcome import Outcome

RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024    # bursts of answers must not overflow the UDP socket


@dataclass(slots=True)
class Resolution:
    outcome: Outcome            # ok or one of the dns_* outcomes
    ips: list[str]              # addresses, IPv4 first; empty unless ok
    ttl_s: float                # how much longer this answer may be used, seconds
    error: str = ""             # detail for non-ok outcomes


@dataclass(slots=True)
class _Entry:
    expires_at: float
    resolution: Resolution


def _entry_bytes(key: str, r: Resolution) -> int:
    """Estimated bytes of a cache entry: key, _Entry, Resolution, the ips list and strs, a float."""
    return (str_bytes(key) + slots_bytes(2) + INT_BYTES + slots_bytes(4) + TUPLE_BASE + 8 * len(r.ips)
            + sum(str_bytes(ip) for ip in r.ips) + str_bytes(r.error) + INT_BYTES)


@dataclass(slots=True)
class _Stats:
    lookups: int = 0            # resolve() calls
    literal: int = 0            # answered as IP literals or static hosts
    hits: int = 0               # answered from the cache
    coalesced: int = 0          # joined a query already in flight
    queries: int = 0            # lookups sent to c-ares (A and AAAA count once together)
    outcomes: dict[str, int] = field(default_factory=dict)


_NEGATIVE = frozenset({Outcome.DNS_NXDOMAIN, Outcome.DNS_SERVFAIL})


def _outcome_of(code: int) -> Outcome:
    if code in (ares_errno.ARES_ENOTFOUND, ares_errno.ARES_ENODATA, ares_errno.ARES_ENONAME):
        return Outcome.DNS_NXDOMAIN
    if code == ares_errno.ARES_ESERVFAIL:
        return Outcome.DNS_SERVFAIL
    if code == ares_errno.ARES_ETIMEOUT:
        return Outcome.DNS_TIMEOUT
    return Outcome.DNS_ERROR


class _Gate:
    """Admits at most ``limit`` holders at once, waiters in FIFO order.

    asyncio.Semaphore scans all its waiters on every release (Python 3.11), which is
    quadratic with thousands of lookups queued; this hands a freed slot straight to
    the oldest live waiter. Invariant: free slots + holders == limit, and free > 0
    only when no live waiter is queued.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, limit: int):
        self._free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()                   # a slot was handed over just before the cancel
            raise

    def release(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)             # the slot passes directly to this waiter
                return
        self._free += 1


def _literal(host: str) -> str | None:
    # a host name's last label is never all digits (RFC 1123 §2.1), so only these can be IP literals
    if not host or not (host[-1].isdigit() or host[0] == "[" or ":" in host):
        return None
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


class Resolver:
    """Host name -> addresses, cached.

    Cache key: lower-case host name without trailing dot. Invariant: an entry
    is served only while ``clock() < expires_at``; positive entries live
    ``clamp(min record TTL, min_ttl_s, max_ttl_s)``, negative ones
    ``negative_ttl_s``; the entries' estimated bytes (``_entry_bytes``) stay
    within ``cache_bytes``, the least recently used evicted first in O(1) (an
    expired entry goes when it is next asked for, or by age). At most one query
    per name is in flight, and at most ``max_in_flight`` in all.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, nameservers: list[str], timeout_s: float, tries: int,
                 min_ttl_s: float, max_ttl_s: float, negative_ttl_s: float, max_in_flight: int,
                 static_hosts: dict[str, str], ipv6: bool, clock: Callable[[], float] = time.monotonic,
                 cache_bytes: int = 32 << 20):
        self._loop = loop
        self._min_ttl_s = min_ttl_s
        self._max_ttl_s = max_ttl_s
        self._negative_ttl_s = negative_ttl_s
        self._ipv6 = ipv6
        self._clock = clock
        self._static = {self._key(k): str(ipaddress.ip_address(v)) for k, v in static_hosts.items()}
        self._resolver = aiodns.DNSResolver(
            nameservers or None, loop, timeout=timeout_s, tries=tries,
            socket_receive_buffer_size=RECEIVE_BUFFER_BYTES,
            flags=pycares.ARES_FLAG_NOSEARCH,    # crawl names are absolute: never try search domains
        )
        self._gate = _Gate(max_in_flight)
        self._cache = ByteLRU(cache_bytes)
        self._pending: dict[str, asyncio.Future[Resolution]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._stats = _Stats()
        self._closed = False

    @staticmethod
    def _key(host: str) -> str:
        return host.strip().rstrip(".").lower()

    async def resolve(self, host: str) -> Resolution:
        """Addresses of ``host``. Never raises for DNS trouble: the outcome says what happened."""
        st = self._stats
        st.lookups += 1
        key = self._key(host)
        ip = _literal(key)
        if ip is not None or key in self._static:
            st.literal += 1
            return Resolution(Outcome.OK, [ip or self._static[key]], self._max_ttl_s)
        entry = self._cache.get(key)
        if entry is not None:
            left = entry.expires_at - self._clock()
            if left > 0:
                st.hits += 1
                r = entry.resolution
                return Resolution(r.outcome, list(r.ips), left, r.error)
            self._cache.pop(key)
        fut = self._pending.get(key)
        if fut is not None:
            st.coalesced += 1
            r = await asyncio.shield(fut)                # a cancelled waiter leaves the query running
        elif self._closed:
            return Resolution(Outcome.DNS_ERROR, [], 0.0, "resolver closed")
        else:
            # The first caller runs the query itself (no task: this is the hot path).
            fut = self._pending[key] = self._loop.create_future()
            r = await self._run(key, fut)
        return Resolution(r.outcome, list(r.ips), r.ttl_s, r.error)

    async def _run(self, key: str, fut: asyncio.Future[Resolution]) -> Resolution:
        """Query ``key`` and publish the answer on ``fut`` for the callers coalesced on it."""
        try:
            r = await self._query(key)
        except asyncio.CancelledError:
            # the caller running the query was cancelled: its waiters get an error (not cached)
            fut.set_result(Resolution(Outcome.DNS_ERROR, [], 0.0, "lookup cancelled"))
            raise
        except Exception as e:   # channel trouble must not strand the callers waiting on fut
            r = Resolution(Outcome.DNS_ERROR, [], 0.0, f"resolver failure: {e!r}")
        finally:
            self._pending.pop(key, None)
        st = self._stats
        st.outcomes[r.outcome.value] = st.outcomes.get(r.outcome.value, 0) + 1
        self._store(key, r)
        fut.set_result(r)
        return r

    async def _query(self, name: str) -> Resolution:
        await self._gate.acquire()
        try:
            self._stats.queries += 1
            if self._ipv6:
                a, aaaa = await asyncio.gather(self._ask(name, "A"), self._ask(name, "AAAA"))
            else:
                a, aaaa = await self._ask(name, "A"), None
        finally:
            self._gate.release()
        if aaaa is None or (aaaa.outcome is not Outcome.OK and a.outcome is Outcome.OK):
            return a
        if a.outcome is not Outcome.OK:
            return aaaa if aaaa.outcome is Outcome.OK else a
        return Resolution(Outcome.OK, a.ips + aaaa.ips, min(a.ttl_s, aaaa.ttl_s))

    async def _ask(self, name: str, qtype: str) -> Resolution:
        try:
            result = await self._resolver.query_dns(name, qtype)
        except DNSError as e:
            code = e.args[0] if e.args else ares_errno.ARES_EBADRESP
            detail = e.args[1] if len(e.args) > 1 else str(e)
            return Resolution(_outcome_of(code), [], 0.0, f"{qtype}: {detail}")
        except (ValueError, UnicodeError) as e:
            return Resolution(Outcome.DNS_ERROR, [], 0.0, f"{qtype}: bad name: {e}")
        want = pycares.QUERY_TYPE_A if qtype == "A" else pycares.QUERY_TYPE_AAAA
        ips: list[str] = []
        ttl = None
        # the answer may start with a CNAME chain; every record in it bounds the TTL
        for rec in result.answer:
            ttl = rec.ttl if ttl is None else min(ttl, rec.ttl)
            if rec.type == want and rec.data.addr not in ips:
                ips.append(rec.data.addr)
        if not ips:
            return Resolution(Outcome.DNS_NXDOMAIN, [], 0.0, f"{qtype}: no address records")
        ttl_s = min(max(float(ttl or 0), self._min_ttl_s), self._max_ttl_s)
        return Resolution(Outcome.OK, ips, ttl_s)

    def _store(self, key: str, r: Resolution) -> None:
        if r.outcome is Outcome.OK:
            life = r.ttl_s
        elif r.outcome in _NEGATIVE:
            life = r.ttl_s = self._negative_ttl_s
        else:
            return
        if life <= 0:
            return
        self._cache.put(key, _Entry(self._clock() + life, r), _entry_bytes(key, r))

    def cached(self, host: str) -> Resolution | None:
        """The cached answer for ``host`` if still fresh, without querying."""
        entry = self._cache.peek(self._key(host))
        if entry is None:
            return None
        left = entry.expires_at - self._clock()
        if left <= 0:
            return None
        r = entry.resolution
        return Resolution(r.outcome, list(r.ips), left, r.error)

    def save(self, path: str, now_wall: float) -> int:
        """Write the fresh cache entries to ``path`` now (``write_snapshot`` of ``snapshot``)."""
        return write_snapshot(path, self.snapshot(now_wall))

    def snapshot(self, now_wall: float) -> tuple[list, float, float]:
        """The cache as ``save`` writes it, for ``write_snapshot`` on another thread: one C-level
        copy of the entry references (~1 ms for 20,000 hosts, where formatting and writing them
        took ~95 ms of the loop). Entries are replaced, never changed, so the copy stays whole."""
        now = self._clock()
        return list(self._cache.items()), now, now_wall - now

    def load(self, path: str, now_wall: float) -> int:
        """Take back the entries a previous run saved that are still within their TTL; returns how many.

        A missing or damaged file loads what it can (lines that do not parse are skipped)."""
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return 0
        n = 0
        for line in lines:
            try:
                key, expires_wall, outcome, ips = json.loads(line)
                outcome = Outcome(outcome)
                left = float(expires_wall) - now_wall
                if not isinstance(key, str) or not all(isinstance(ip, str) for ip in ips):
                    continue
                if outcome is Outcome.OK:
                    ips = [str(ipaddress.ip_address(ip)) for ip in ips]
                    if not ips:
                        continue
                elif outcome not in _NEGATIVE:
                    continue
            except (ValueError, TypeError):
                continue
            # never longer than this run's own limits allow
            left = min(left, self._max_ttl_s if outcome is Outcome.OK else self._negative_ttl_s)
            if left > 0:        # the byte cap keeps the most recently saved answers
                r = Resolution(outcome, ips, left)
                self._cache.put(self._key(key), _Entry(self._clock() + left, r), _entry_bytes(self._key(key), r))
                n += 1
        return n

    def prefetch(self, host: str) -> None:
        """Start resolving ``host`` in the background so a later resolve() hits the cache."""
        key = self._key(host)
        if self._closed or key in self._pending or _literal(key) or key in self._static:
            return
        if self.cached(key) is None:
            fut = self._pending[key] = self._loop.create_future()
            task = self._loop.create_task(self._run(key, fut))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def stats(self) -> dict:
        st = self._stats
        return {
            "lookups": st.lookups, "literal": st.literal, "cache_hits": st.hits, "coalesced": st.coalesced,
            "queries": st.queries, "in_flight": len(self._pending), "cache_entries": len(self._cache),
            "outcomes": dict(st.outcomes),
        }

    def memory(self) -> dict[str, int]:
        """The cache's estimated bytes against its cap."""
        return self._cache.memory()

    async def close(self) -> None:
        """Cancel lookups in flight and release the c-ares channel."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._resolver.close()


def write_snapshot(path: str, snap: tuple[list, float, float]) -> int:
    """Write a ``Resolver.snapshot``'s fresh entries to ``path`` (JSON lines, wall-clock expiry;
    temp name, rename); safe on any thread. No fsync: losing the file loses only lookups, which
    are asked again. Returns entries written."""
    items, now, off = snap
    lines = [orjson.dumps([key, round(e.expires_at + off, 3), e.resolution.outcome.value, e.resolution.ips])
             for key, e in items if e.expires_at > now]
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"\n".join(lines) + (b"\n" if lines else b""))
    os.replace(tmp, path)
    return len(lines)
