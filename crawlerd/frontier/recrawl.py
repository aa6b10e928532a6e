"""Recrawl: when to fetch a URL again, and the validators that make the next fetch conditional.

The DRUM seen-set lets a URL into the frontier once. A URL that was fetched is
remembered here instead, in an LMDB environment of its own (RAM does not grow
with the number of URLs, ARCHITECTURE.md invariant 4), and comes back through :meth:`Recrawl.due`
when its next visit is due; the shard adds it to the frontier directly (it was
seen already) and sends ``If-None-Match`` / ``If-Modified-Since`` from
:meth:`Recrawl.validators` (RFC 9110 §13.1.2, §13.1.3).

Visit policy (deterministic but for a small injected jitter)
    Cho and Garcia-Molina ("Estimating frequency of change", ACM TOIT 2003)
    model a page's changes as a Poisson process and revisit at the estimated
    change rate. A per-URL multiplicative estimate of that rate is enough
    here: the first interval is ``initial_interval_s``; a visit that found the
    page changed (a new payload digest) halves it, one that found it unchanged
    (a 304, or the same digest) doubles it, clamped to [``min_interval_s``,
    ``max_interval_s``]. A visit that cannot tell (no digest to compare) keeps
    it. The next visit is ``fetched_at + interval x (1 ± jitter)``: the jitter
    spreads URLs found together so they do not all come due in the same second.

Errors
    A URL enters recrawl with its first answer below 400. A final 4xx/5xx
    answer (or status 0: none) clears its validators and sets the next visit
    ``max_interval_s`` away; 410 Gone (RFC 9110 §15.5.11: "likely permanent") drops it at once, as
    do ``drop_after_errors`` consecutive errors. A hand-out that was never
    answered by ``record`` (the frontier dead-lettered or dropped it) counts as
    an error too, so a URL the crawl can no longer fetch leaves recrawl. Any
    answer below 400 resets the count. A dropped URL that is fetched again
    (found anew, or still queued) re-enters with ``initial_interval_s``.

Hand-out invariant
    ``due`` returns a URL at most once per ``reissue_timeout_s`` until ``record``
    is called for it: handing out moves its due-index entry to
    ``now + reissue_timeout_s`` and flags it. The shard adds the URLs to the
    frontier (which commits) and then commits here: a crash in between hands
    them out again at once (fetched twice: at least once, as in the frontier);
    a hand-out whose URL the frontier lost comes back after the timeout.
    ``reissue_timeout_s`` should exceed the longest a URL waits in the
    frontier, or it is queued and fetched twice (wasteful, not wrong).

Tables (big-endian keys, so LMDB byte order is time order):

``urls``  fp u64 -> URL state (:class:`RecrawlState` without the fp).
``due``   due ms u64 | fp u64 -> b"". Invariant: every ``urls`` entry has exactly
          one ``due`` entry, whose time is the entry's ``due_ms``, and no other
          entries exist. ``due`` is a range scan from the start of the table.
``meta``  counters (same transaction as the state, so they agree after a crash).

Durability: one write transaction at a time, committed every ``group_ops``
writes, as soon as its writes could have changed as many pages as the store reserved
(``store.lmdb_reserve.WriteBudget``: LMDB's dirty-page buffers never outgrow the reservation),
and by ``commit()``.
``kill -9`` loses only the open transaction; ``record`` is idempotent (a
visit whose ``fetched_at`` is not newer than the stored one is ignored), so
replaying lost visits is harmless. With a writer attached (``attach_writer``, the
shard's ``WriteThread``, during the crawl) no write transaction runs on the loop:
the transaction is a :class:`~crawlerd.store.overlay.Overlay` (reads see the
loop's writes from RAM until they land) and a commit is handed over, on disk
once its ``then`` ran (``commit(flush=True)``: fdatasync'd there too).
"""

from __future__ import annotations

import os
import random
import struct
import time
from dataclasses import dataclass

import lmdb

from crawlerd.frontier.key_filter import KeyFilter, packed_chunks
from crawlerd.frontier.recrawl_record import (
    MAX_VALIDATOR_BYTES,  # noqa: F401  (this module's API too)
    RecrawlState,
    decode,
    encode,
    to_ms,
    validator,
)
from crawlerd.store.lmdb_reserve import WriteBudget
from crawlerd.store.overlay import Overlay
from crawlerd.store.writer import WriteThread

GiB = 1 << 30
DAY_S = 86400.0
STATUS_GONE = 410

_U64 = struct.Struct(">Q")
_DKEY = struct.Struct(">QQ")
_COUNTERS = ("recorded", "changed", "unchanged", "not_modified", "errors", "dropped", "handed_out",
             "reissued", "ignored", "out")
_META = struct.Struct("<" + "Q" * len(_COUNTERS))


@dataclass(slots=True)
class RecrawlItem:
    """A URL whose next visit is due: add it to the frontier (it bypasses the seen-set)."""

    url: str
    fp: int
    host_key: str
    depth: int = 0


class Recrawl:
    """Per-URL recrawl state and due index in LMDB (tables and invariants: see the module docstring).

    Single-threaded: call it from one thread (the write transaction is bound to it). With a writer
    attached, the URL states read (present or absent) are kept in a read cache of ``read_cache_bytes``
    (0: off): a URL's state is read at its lease (validators) and again at its answer (``record``).
    """

    def __init__(self, path: str, *, enabled: bool = True, initial_interval_s: float = 7 * DAY_S,
                 min_interval_s: float = DAY_S, max_interval_s: float = 90 * DAY_S,
                 reissue_timeout_s: float = DAY_S, drop_after_errors: int = 3, jitter: float = 0.1,
                 clock=time.time, rng: random.Random | None = None, map_size_bytes: int = 64 * GiB,
                 sync: bool = True, group_ops: int = 4096, write_buffer_bytes: int = 0,
                 read_cache_bytes: int = 0, key_filter_bytes: int = 0):
        if not 0 < min_interval_s <= initial_interval_s <= max_interval_s:
            raise ValueError("recrawl intervals: expected 0 < min_interval_s <= initial_interval_s "
                             f"<= max_interval_s, got {min_interval_s}, {initial_interval_s}, {max_interval_s}")
        if not reissue_timeout_s > 0:
            raise ValueError(f"reissue_timeout_s = {reissue_timeout_s}: expected > 0")
        if not 1 <= drop_after_errors <= 255:
            raise ValueError(f"drop_after_errors = {drop_after_errors}: expected 1..255")
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"jitter = {jitter}: expected 0 <= jitter < 1")
        if group_ops < 1:
            raise ValueError(f"group_ops = {group_ops}: expected >= 1")
        self.enabled = enabled
        self.initial_interval_s = float(initial_interval_s)
        self.min_interval_s = float(min_interval_s)
        self.max_interval_s = float(max_interval_s)
        self._reissue_ms = max(1, to_ms(reissue_timeout_s))
        self._drop_after = drop_after_errors
        self._jitter = jitter
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._group_ops = group_ops
        self._read_cache_bytes = read_cache_bytes
        self._ops = 0
        self._txn: lmdb.Transaction | None = None
        self._overlay: Overlay | None = None
        self._c = dict.fromkeys(_COUNTERS, 0)
        self._env = None
        self._filter: KeyFilter | None = None
        # record_many's writes not handed to the overlay yet: urls key -> value (None: deleted),
        # and the due index's (key, value or None) in order; None outside record_many
        self._pending: tuple[dict[bytes, bytes | None], list[tuple[bytes, bytes | None]]] | None = None
        self.reads_skipped = 0          # state reads the key filter answered "absent" without a read
        if not enabled:
            return
        os.makedirs(path, exist_ok=True)
        self._sync = sync
        self._env = lmdb.open(path, map_size=map_size_bytes, max_dbs=3, sync=sync, metasync=False,
                              readahead=False, meminit=False)
        self._budget = WriteBudget(self._env, write_buffer_bytes)
        self._urls = self._env.open_db(b"urls")
        self._due = self._env.open_db(b"due")
        self._meta = self._env.open_db(b"meta")
        self._budget.dbs = (self._urls, self._due)
        raw = self._w().get(b"counters", db=self._meta)
        if raw is not None:
            self._c.update(zip(_COUNTERS, _META.unpack(raw), strict=True))
        if key_filter_bytes > 0:
            self._filter = self._build_filter(key_filter_bytes)

    def _build_filter(self, size_bytes: int) -> KeyFilter:
        """The key filter over every URL tracked now (one pass over the ``urls`` keys, vectorised);
        ``_put`` adds each key written from here on. A table with more keys than the filter holds
        usefully (``KeyFilter.scan_keys``: it would read ~5 % of absent keys, and the scan would take
        seconds) is not scanned: the filter says "maybe" to all, every lookup reads as without it."""
        kf = KeyFilter(size_bytes)
        txn = self._w()
        if txn.stat(self._urls)["entries"] > kf.scan_keys:
            kf.saturated = True
            return kf
        kf.add_packed(packed_chunks(txn.cursor(db=self._urls).iternext(values=False)))
        return kf

    # == transactions ==========================================================
    def _w(self) -> lmdb.Transaction | Overlay:
        if self._overlay is not None:
            return self._overlay
        if self._txn is None:
            self._txn = self._env.begin(write=True)
        return self._txn

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write on ``writer`` from now on (the open transaction commits here first); None: detach,
        once every commit handed over landed, back to transactions of this thread."""
        if self._env is None:
            return
        if writer is not None:
            self._commit()
            self._overlay = Overlay(self._env, writer, self._budget, read_cache={self._urls: self._read_cache_bytes})
        elif self._overlay is not None:
            self._overlay.close()
            self._overlay = None

    def _wrote(self, writes: int) -> None:
        """One record changed with ``writes`` puts and deletes: commit after ``group_ops`` records, or
        once the transaction's writes could fill the reserved page buffers."""
        self._ops += 1
        self._budget.spend(writes)
        if self._ops >= self._group_ops or self._budget.full:
            self._commit()

    def _commit(self, then=None, sync: bool = False) -> bool:
        """Commit the open transaction; True if it was handed to the writer (``then`` runs there)."""
        self._ops = 0
        ov = self._overlay
        if ov is not None:
            self._hand_pending()
            if ov.dirty:
                ov.put(b"counters", _META.pack(*(self._c[k] for k in _COUNTERS)), db=self._meta)
            ov.commit(then, sync=sync)
            self._budget.committed()
            return True
        if self._txn is not None:
            self._txn.put(b"counters", _META.pack(*(self._c[k] for k in _COUNTERS)), db=self._meta)
            txn, self._txn = self._txn, None
            txn.commit()
            self._budget.committed()
        return False

    def commit(self, *, flush: bool = True, then=None) -> None:
        """Make everything so far durable (fsync even when sync=False). ``flush=False``: commit
        only; ``flush()`` then makes it power-safe, from any thread. With a writer attached both
        happen there; ``then`` runs on the loop once the commit is written (at once without one)."""
        if self._env is None:
            if then is not None:
                then()
            return
        if self._commit(then, sync=flush and not self._sync):
            return
        if flush and not self._sync:
            self._env.sync(True)
        if then is not None:
            then()

    def flush(self) -> None:
        """fdatasync what is committed (thread-safe beside the loop's write transactions)."""
        if self._env is not None:
            self._env.sync(True)

    def close(self) -> None:
        """Commit and close. URLs handed out and not yet recorded stay handed out (see the invariant)."""
        if self._env is None:
            return
        self.attach_writer(None)        # raises if a commit handed over was not written
        self.commit()
        self._env.close()
        self._env = None

    # == state ===================================================================
    def _get(self, fp: int) -> tuple[RecrawlState, int] | None:
        kf = self._filter
        if kf is not None and not kf.maybe(fp):
            self.reads_skipped += 1
            return None                 # never written here: no read (key_filter module)
        key = _U64.pack(fp & 0xFFFFFFFFFFFFFFFF)
        pending = self._pending
        if pending is not None and key in pending[0]:
            raw = pending[0][key]       # written earlier in this record_many
        else:
            raw = self._w().get(key, db=self._urls)
        return None if raw is None else decode(fp & 0xFFFFFFFFFFFFFFFF, raw)

    def _put(self, st: RecrawlState, old_due_ms: int | None, due_ms: int, fetched_ms: int,
             captured_ms: int) -> None:
        fpk = _U64.pack(st.fp)
        if old_due_ms is None and self._filter is not None:
            self._filter.add(st.fp)     # before the write: the filter never misses a stored key
        pending = self._pending
        if pending is not None:         # record_many: handed to the overlay at its end
            urls, due = pending
            if old_due_ms is not None:
                due.append((_DKEY.pack(old_due_ms, st.fp), None))
            due.append((_DKEY.pack(due_ms, st.fp), b""))
            urls[fpk] = encode(st, due_ms, fetched_ms, captured_ms)
            self._wrote(2 if old_due_ms is None else 3)
            return
        txn = self._w()
        if old_due_ms is not None:
            txn.delete(_DKEY.pack(old_due_ms, st.fp), db=self._due)
        txn.put(_DKEY.pack(due_ms, st.fp), b"", db=self._due)
        txn.put(fpk, encode(st, due_ms, fetched_ms, captured_ms), db=self._urls)
        self._wrote(2 if old_due_ms is None else 3)

    def _drop(self, st: RecrawlState, due_ms: int) -> None:
        pending = self._pending
        if pending is not None:
            pending[1].append((_DKEY.pack(due_ms, st.fp), None))
            pending[0][_U64.pack(st.fp)] = None
        else:
            txn = self._w()
            txn.delete(_DKEY.pack(due_ms, st.fp), db=self._due)
            txn.delete(_U64.pack(st.fp), db=self._urls)
        if st.handed_out:
            self._c["out"] -= 1
        self._c["dropped"] += 1
        self._wrote(2)

    def state(self, fp: int) -> RecrawlState | None:
        """Everything known about one URL, or None if it is not tracked."""
        if self._env is None:
            return None
        got = self._get(fp)
        return None if got is None else got[0]

    def validators(self, fp: int) -> tuple[str | None, str | None]:
        """(ETag, Last-Modified) of the URL's last answer: send them as If-None-Match / If-Modified-Since."""
        st = self.state(fp)
        return (None, None) if st is None else (st.etag, st.last_modified)

    def last_digest(self, fp: int) -> str | None:
        """Payload digest of the last capture: a 304 is archived as a revisit of it."""
        st = self.state(fp)
        return None if st is None else st.digest

    def last_capture(self, fp: int) -> tuple[str, float] | None:
        """(digest, captured_at) of the last capture, for a revisit's WARC-Refers-To-Date."""
        st = self.state(fp)
        if st is None or st.digest is None:
            return None
        return st.digest, st.captured_at

    # == visits ====================================================================
    def _next_due_ms(self, fetched_at: float, interval_s: float) -> int:
        f = 1.0 + self._jitter * (2.0 * self._rng.random() - 1.0) if self._jitter else 1.0
        return to_ms(fetched_at + interval_s * f)

    def record(self, url: str, fp: int, host_key: str, *, fetched_at: float, status: int,
               etag: str | None, last_modified: str | None, digest: str | None, changed: bool | None,
               depth: int = 0) -> bool:
        """Record one visit and schedule the next (policy: see the module docstring).

        ``status`` is the final HTTP status (0: no answer). ``changed`` overrides
        the digest comparison when not None (a 304 is unchanged either way).
        On a 304, validators that are None keep their stored values (RFC 9110
        §15.4.5: a 304 repeats the validators a 200 would send) and ``digest``
        is ignored (the capture is the stored one). Returns False when the
        visit is ignored: not newer than the stored one, or an error for an
        untracked URL.
        """
        if self._env is None:
            return False
        fp &= 0xFFFFFFFFFFFFFFFF
        fetched_ms = to_ms(fetched_at)
        got = self._get(fp)
        if got is None:
            # 304 here answers a conditional GET we did not send: nothing to revisit from
            if status >= 400 or status <= 0 or status == 304:
                self._c["ignored"] += 1
                return False
            st = RecrawlState(fp, url, host_key, depth, 0.0, 0.0, 0.0, self.initial_interval_s, status, 0,
                              False, validator(etag), validator(last_modified), digest or None)
            self._c["recorded"] += 1
            self._put(st, None, self._next_due_ms(fetched_at, st.interval_s), fetched_ms, fetched_ms)
            return True
        st, old_due = got
        if fetched_ms <= to_ms(st.fetched_at):
            self._c["ignored"] += 1
            return False
        self._c["recorded"] += 1
        if st.handed_out:
            st.handed_out = False
            self._c["out"] -= 1
        st.url, st.host_key, st.status, st.depth = url, host_key, status, depth
        captured_ms = to_ms(st.captured_at)
        if status >= 400 or status <= 0:
            self._c["errors"] += 1
            st.errors = min(st.errors + 1, 255)
            if status == STATUS_GONE or st.errors >= self._drop_after:
                self._drop(st, old_due)
                return True
            st.etag = st.last_modified = None       # an error page's validators validate nothing
            self._put(st, old_due, to_ms(fetched_at + self.max_interval_s), fetched_ms, captured_ms)
            return True
        st.errors = 0
        if status == 304:
            self._c["not_modified"] += 1
            changed = False
            st.etag = validator(etag) or st.etag
            st.last_modified = validator(last_modified) or st.last_modified
        else:
            if changed is None and digest and st.digest:
                changed = digest != st.digest
            st.etag, st.last_modified = validator(etag), validator(last_modified)
            if digest:
                st.digest = digest
                captured_ms = fetched_ms
        if changed is True:
            self._c["changed"] += 1
            st.interval_s = max(self.min_interval_s, st.interval_s / 2.0)
        elif changed is False:
            if status != 304:
                self._c["unchanged"] += 1
            st.interval_s = min(self.max_interval_s, st.interval_s * 2.0)
        st.interval_s = min(self.max_interval_s, max(self.min_interval_s, st.interval_s))  # bounds may change
        self._put(st, old_due, self._next_due_ms(fetched_at, st.interval_s), fetched_ms, captured_ms)
        return True

    def record_many(self, visits: list[tuple]) -> None:
        """``record`` or ``forget`` for each visit, in order: ``(url, fp, host_key, fetched_at,
        status, etag, last_modified, digest, depth)`` records a visit (``changed=None``), ``(None,
        fp)`` forgets the URL. The same state, counters, jitter draws and commit points as those
        calls one by one; with a writer, the writes reach the overlay in one pass per table
        (``Overlay.put_many``) at the end, or before a commit falling inside the visits (reads in
        between see them)."""
        if self._env is None:
            return
        if self._overlay is not None:
            self._pending = ({}, [])
        try:
            record, forget = self.record, self.forget
            for v in visits:
                if v[0] is None:
                    forget(v[1])
                else:
                    url, fp, host_key, fetched_at, status, etag, last_modified, digest, depth = v
                    record(url, fp, host_key, fetched_at=fetched_at, status=status, etag=etag,
                           last_modified=last_modified, digest=digest, changed=None, depth=depth)
        finally:
            self._hand_pending()
            self._pending = None

    def _hand_pending(self) -> None:
        """``record_many``'s writes so far into the overlay (the due index's first: deletes and puts
        of different keys, in their order), then record_many goes on with empty lists."""
        pending = self._pending
        if pending is None:
            return
        urls, due = pending
        if due:
            self._overlay.put_many(due, db=self._due)
            due.clear()
        if urls:
            self._overlay.put_many(urls.items(), db=self._urls)
            urls.clear()

    def forget(self, fp: int) -> bool:
        """Stop recrawling a URL (robots.txt now disallows it, its host is blocked). False if untracked."""
        if self._env is None:
            return False
        got = self._get(fp)
        if got is None:
            return False
        self._drop(*got)
        return True

    def due(self, now_wall: float | None = None, limit: int = 1000) -> list[RecrawlItem]:
        """Hand out up to ``limit`` URLs whose next visit is at or before ``now_wall``, earliest first.

        Each is marked handed out and not returned again until ``record`` is
        called for it or ``reissue_timeout_s`` passes (then it counts as an
        error, and is dropped after ``drop_after_errors``).
        """
        if self._env is None or limit <= 0:
            return []
        now_ms = to_ms(self._clock() if now_wall is None else now_wall)
        out: list[RecrawlItem] = []
        while len(out) < limit:
            keys = []
            cur = self._w().cursor(db=self._due)
            if cur.first():
                for key in cur.iternext(values=False):
                    if _DKEY.unpack(key)[0] > now_ms or len(keys) >= limit - len(out):
                        break
                    keys.append(key)
            if not keys:
                break
            for key in keys:
                due_ms, fp = _DKEY.unpack(key)
                raw = self._w().get(_U64.pack(fp), db=self._urls)
                if raw is None:           # cannot happen while the table invariant holds; heal it
                    self._w().delete(key, db=self._due)
                    continue
                st, _ = decode(fp, raw)
                if st.handed_out:             # never answered: a miss
                    st.errors = min(st.errors + 1, 255)
                    if st.errors >= self._drop_after:
                        self._drop(st, due_ms)
                        continue
                    self._c["reissued"] += 1
                else:
                    st.handed_out = True
                    self._c["out"] += 1
                self._c["handed_out"] += 1
                self._put(st, due_ms, now_ms + self._reissue_ms, to_ms(st.fetched_at), to_ms(st.captured_at))
                out.append(RecrawlItem(st.url, fp, st.host_key, st.depth))
        return out

    def next_due_at(self) -> float | None:
        """Earliest due time in the index (handed-out URLs included), None when nothing is tracked."""
        if self._env is None:
            return None
        cur = self._w().cursor(db=self._due)
        return _DKEY.unpack(cur.key())[0] / 1000.0 if cur.first() else None

    # == accounting ==================================================================
    def stats(self) -> dict:
        """Counters (since the environment was created) and gauges."""
        if self._env is None:
            return {"enabled": False}
        out = {"enabled": True, "tracked": self._w().stat(self._urls)["entries"],
               "next_due_at": self.next_due_at()}
        out.update(self._c)
        if self._overlay is not None and self._read_cache_bytes:
            ov = self._overlay.stats()["read_cache"]
            out["read_cache"] = ov
        if self._filter is not None:
            out["key_filter"] = self._filter.stats() | {"reads_skipped": self.reads_skipped}
        out["handed_out_now"] = out.pop("out")
        return out

    @property
    def overlay(self) -> Overlay | None:
        return self._overlay

    def unlanded(self) -> dict[str, int]:
        """Its overlay's writes not landed yet (``Overlay.memory``; empty without a writer)."""
        return self._overlay.memory() if self._overlay is not None else {}

    def memory(self) -> dict[str, int]:
        """The read cache's estimated bytes against its cap (`crawlerd stats`; zeros without a writer)."""
        if self._overlay is None:
            return {"bytes": 0, "cap_bytes": self._read_cache_bytes, "entries": 0, "evictions": 0}
        return self._overlay.cache_memory() | {"cap_bytes": self._read_cache_bytes}

    def check_invariants(self) -> None:
        """Full scan (tests, ``crawlerd`` self-checks): the ``due`` index mirrors ``urls`` exactly."""
        if self._env is None:
            return
        txn = self._w()
        index = {}
        for key in txn.cursor(db=self._due).iternext(values=False):
            due_ms, fp = _DKEY.unpack(key)
            if fp in index:
                raise AssertionError(f"recrawl: fp {fp:016x} has two due entries")
            index[fp] = due_ms
        out = 0
        for fpk, raw in txn.cursor(db=self._urls):
            fp = _U64.unpack(fpk)[0]
            st, due_ms = decode(fp, raw)
            if index.pop(fp, None) != due_ms:
                raise AssertionError(f"recrawl: fp {fp:016x} due entry missing or at the wrong time")
            out += st.handed_out
        if index:
            raise AssertionError(f"recrawl: {len(index)} due entries without a URL")
        if out != self._c["out"]:
            raise AssertionError(f"recrawl: {out} URLs flagged handed out, counter says {self._c['out']}")
