"""Durable state of the DUST learner: per-host rules and evidence, the archived set, the skip log.

One LMDB environment (``<data_dir>/dust``), written in one transaction that ``commit()``
makes durable (fsync). A crash loses at most the evidence since the last commit; rules are
then re-derived from new evidence, never assumed.

With a writer attached (``attach_writer``: the shard's ``WriteThread``, during the crawl) no
write transaction (and no fsync) runs on the loop: ``txn()`` is an
:class:`~crawlerd.store.overlay.Overlay` that holds the writes in RAM and answers the loop's reads
(records, the LRU and skip-log cursors, the archived set) as the write transaction would;
``commit()`` hands the layer to the writer thread, which commits (and syncs) it there. A commit
survives ``kill -9`` once it landed; what follows a commit keeps its order (the frontier commit
that requeues a retired rule's skips is made before the DUST commit that forgets them is even
handed over).

Tables (key -> value):

``hosts``     host key -> u64 write sequence (big-endian) + JSON host record (rules with their
              counts, the evidence window, parameters known to change content). Invariant: a
              record is at most ``max_host_bytes`` (plus its 8-byte sequence); all values
              together at most ``max_bytes`` x HOSTS_SHARE: the least recently written hosts are
              evicted first (``lru``). A value that starts with ``{`` is a record written before
              the sequence was kept in it: its sequence is ``meta["seq:" + host]`` (moved into the
              record, and that key deleted, at its next write).
``lru``       u64 write sequence -> host key (oldest first), the sequence the host's value holds.
              ``meta["seq"]`` is the write clock (one tick per host write, and per skip logged).
              A write moves the host to the newest end only when its sequence is more than
              ``touch_slack`` ticks behind the clock (a host written again within that keeps its
              place: the 2 LRU writes of a host write saved, the 4th, ``meta["seq:" + host]``,
              is gone with the sequence in the record): the eviction order is the write order up
              to ``touch_slack`` sequence numbers (1/8 of the host records the bound holds at 512
              B each: 32,768 at the default ``dust.max_bytes``, ~50 s of host writes of a fast
              crawl; exact, 0 or 1, only in a store under 16 KiB). The byte bound is exact
              either way.
``arch0/1``   u64 URL fingerprint -> kind u8, rule slot u8, epoch u32, digest u32, simhash u64
              (of the archived page, to re-validate a rule by a sample): what was archived
              (``URL``: this URL; ``CANON``: a page whose rewrite under the host's trusted
              rules of that epoch is this URL; ``SKEL``: a page with this skeleton). Two
              generations: when the current one holds half of ``max_archived`` entries the
              older is dropped, so the set keeps the most recent captures within its bound.
              In RAM in front of them (``filter_bytes``): one Bloom filter per generation over its
              fingerprints (filled by a scan at open, cleared with its generation), so a page's URL
              that was never archived (nearly every one) is answered without an LMDB read; and the
              entries added since the last commit, written in key order at the commit (one sorted
              ``putmulti`` per generation instead of a put per page).
              In RAM in front of ``hosts``: a Bloom filter over the host keys ever written (filled by
              a scan at open; an evicted host stays in it), so loading a host never written (a
              host's first archived page) reads nothing; and the values read or written last
              (``read_cache_bytes``, a byte-bounded LRU; a host's absence too), so loading a host
              again after the decoded cache dropped it reads no LMDB (on the loop each read is a
              GIL hand-off with the writer thread). Exact: every write of the table is made
              here and goes through it.
``skips``     host key NUL rule NUL u64 seq -> the skipped URL's seen-set record: what
              re-queues a rule's skips when it is retired (at most SKIP_LOG_PER_RULE each).
``meta``      counters (JSON values).
"""

from __future__ import annotations

import json
import os
import struct
from typing import NamedTuple

import lmdb
import orjson
from xxhash import xxh3_64_intdigest

from crawlerd._native import dustobs, dustobs_ref
from crawlerd.bytecache import ByteLRU
from crawlerd.store.lmdb_reserve import WriteBudget
from crawlerd.store.overlay import Overlay
from crawlerd.store.unlanded import UnlandedGate
from crawlerd.store.writer import WriterError, WriteThread

__all__ = ["DustStore", "Archived", "URL", "CANON", "SKEL", "HOSTS_SHARE", "SKIP_LOG_PER_RULE"]


class Archived(NamedTuple):
    kind: int           # URL, CANON or SKEL
    slot: int           # CANON: id of the first rule of the rewrite
    epoch: int          # CANON: the host's rule epoch then
    digest: int         # first 4 bytes of the archived page's payload SHA-1
    simhash: int        # its simhash (0: no text)

URL, CANON, SKEL = 1, 2, 3
HOSTS_SHARE = 0.5                # of max_bytes: host records; the rest: archived set and skip log
ARCHIVED_ENTRY_BYTES = 64        # key + value + LMDB node and page overhead
SKIP_LOG_PER_RULE = 256
# an archived entry not written yet, as the overlay will hold it at the commit: its key and value
# objects (8 and 18 bytes, 33 each) and the slots of a put of a key new to the view (store/overlay.py:
# _PUT_SLOT_BYTES 104 + _VIEW_SLOT_BYTES 96)
PENDING_ARCHIVED_BYTES = 2 * 33 + 8 + 18 + 104 + 96
_ARCH = struct.Struct("<BBIIQ")
_U64 = struct.Struct(">Q")
_SEQ = 8                          # a host value: its u64 write sequence, then its JSON record
TOUCH_SLACK_SHARE = 8             # touch_slack: the host records max_hosts_bytes holds at 512 B, / this


def _split(raw: bytes) -> tuple[bytes | None, bytes]:
    """A stored host value -> (its write sequence, None for a record from before sequences were
    kept in it (``meta["seq:" + host]`` holds it), its JSON record)."""
    if raw[:1] == b"{":
        return None, raw
    return raw[:_SEQ], raw[_SEQ:]


class DustStore:
    """Single-threaded; call from the shard's loop. ``commit()`` is the durability point (with a
    writer attached: once the commit landed, ``commit(then)``).

    Unlanded writes (with a writer): ``gate`` (``store/unlanded.py``) bounds the overlay's layers
    not landed plus the archived entries not written yet by ``unlanded_bytes`` (0: no bound); the
    shard's sliced commit asks it before each slice of host records (``DustGate.commit_sliced``)."""

    def __init__(self, path: str, *, max_bytes: int, max_host_bytes: int, sync: bool = True,
                 write_buffer_bytes: int = 0, filter_bytes: int = 4 << 20, unlanded_bytes: int = 0,
                 read_cache_bytes: int = 0, native: bool = True):
        """``native``: the archived set's RAM side in C (``_native.dustobs``), else its reference."""
        os.makedirs(path, exist_ok=True)
        self._probe, self._put = (dustobs.probe, dustobs.put) if native else (dustobs_ref.probe, dustobs_ref.put)
        self.max_host_bytes = max_host_bytes
        self.max_hosts_bytes = int(max_bytes * HOSTS_SHARE)
        self.touch_slack = self.max_hosts_bytes // 512 // TOUCH_SLACK_SHARE
        # the host keys' filter: 16 bits per host record the bound holds at 512 B, a power of two
        self._hmask = (1 << max(9, (self.max_hosts_bytes // 512 * 16 - 1).bit_length())) - 1
        self._hfilter = bytearray((self._hmask + 1) // 8)
        self.host_reads_skipped = 0      # host loads the filter answered "never written"
        # host key -> its stored value (None: none), as the open transaction has it
        self._reads = ByteLRU(read_cache_bytes) if read_cache_bytes > 0 else None
        self.read_cache_bytes = max(0, read_cache_bytes)
        self.max_archived = max(1024, int(max_bytes * (1 - HOSTS_SHARE) * 0.8) // ARCHIVED_ENTRY_BYTES)
        self.max_skip_bytes = max(64 << 10, int(max_bytes * (1 - HOSTS_SHARE) * 0.2))
        self.env = lmdb.open(path, map_size=max(64 << 20, 4 * max_bytes), max_dbs=8, subdir=True,
                             sync=sync, metasync=sync, lock=True)
        self._budget = WriteBudget(self.env, write_buffer_bytes)
        self._hosts = self.env.open_db(b"hosts")
        self._lru = self.env.open_db(b"lru")
        self._arch = [self.env.open_db(b"arch0"), self.env.open_db(b"arch1")]
        self._skips = self.env.open_db(b"skips")
        self._meta = self.env.open_db(b"meta")
        self._budget.dbs = (self._hosts, self._lru, *self._arch, self._skips, self._meta)
        self._txn: lmdb.Transaction | None = None
        self._overlay: Overlay | None = None
        # host -> (its value's size, its write sequence: None unknown (in meta), b"" none) for the hosts
        # the caller holds (``get_host_sized(remember=True)`` to ``forget``): exact, as every write of
        # a host record or sequence is made here, in this transaction
        self._held: dict[str, tuple[int, bytes | None]] = {}
        raw = self.txn().get(b"counters", db=self._meta)
        self.meta: dict = json.loads(raw) if raw else {}
        self.meta.setdefault("host_bytes", 0)
        self.meta.setdefault("gen", 0)
        self.meta.setdefault("gen_count", [0, 0])
        self.meta.setdefault("seq", 0)
        self.meta.setdefault("skip_bytes", 0)
        self.meta.setdefault("evicted_hosts", 0)
        # archived entries not written yet, per generation: fp -> packed value (see the tables)
        self._pending: list[dict[int, bytes]] = [{}, {}]
        # a step handing more over waits at the bound: an unsynced commit (the next synced one covers it)
        self.gate = UnlandedGate(unlanded_bytes, self._commit_unsynced, self._pending_bytes)
        self.archived_reads = 0          # archived() calls that read LMDB (the filter could not answer)
        self.archived_skipped = 0        # ... that the filter answered "never archived"
        self._filters: list[bytearray] | None = None
        self._fmask = 0
        self.filter_bytes = 0
        half = filter_bytes // 2
        if half >= 8:
            half = 1 << (min(half, 1 << 29).bit_length() - 1)      # a power of two, at most 2**32 bits
            self._fmask = half * 8 - 1
            self._filters = [bytearray(half), bytearray(half)]
            self.filter_bytes = 2 * half
            for g in (0, 1):
                for key in self.txn().cursor(db=self._arch[g]).iternext(values=False):
                    self._fset(g, _U64.unpack(key)[0])
        for key in self.txn().cursor(db=self._hosts).iternext(values=False):
            self._hset(key)

    def txn(self) -> lmdb.Transaction | Overlay:
        if self._overlay is not None:
            return self._overlay
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        return self._txn

    # -- host records ----------------------------------------------------------------------
    def get_host(self, host: str) -> dict | None:
        return self.get_host_sized(host)[0]

    def _hset(self, hk: bytes) -> None:
        h, m = xxh3_64_intdigest(hk), self._hmask
        a, b = h & m, (h >> 32) & m
        f = self._hfilter
        f[a >> 3] |= 1 << (a & 7)
        f[b >> 3] |= 1 << (b & 7)

    def _hin(self, hk: bytes) -> bool:
        """True if ``hk`` may have a record (False: it was never written, since the store opened or before)."""
        h, m = xxh3_64_intdigest(hk), self._hmask
        a, b = h & m, (h >> 32) & m
        f = self._hfilter
        return bool(f[a >> 3] >> (a & 7) & 1 and f[b >> 3] >> (b & 7) & 1)

    def _host_value(self, hk: bytes) -> bytes | None:
        """A host's stored value (None: none): the filter, the read cache, then the table."""
        if not self._hin(hk):
            self.host_reads_skipped += 1
            return None
        c = self._reads
        if c is None:
            return self.txn().get(hk, db=self._hosts)
        raw = c.get(hk, _MISS)
        if raw is _MISS:
            raw = self.txn().get(hk, db=self._hosts)
            c.put(hk, raw, _read_cost(hk, raw))
        return raw

    def get_host_sized(self, host: str, remember: bool = False) -> tuple[dict | None, int]:
        """A host's record and its stored size, bytes ((None, 0) when there is none). ``remember``:
        keep its size and write sequence until ``forget``, so that writing it back reads nothing
        (the caller holds its state cached)."""
        raw = self._host_value(host.encode("utf-8", "surrogateescape"))
        if not raw:
            if remember:
                self._held[host] = (0, b"")
            return None, 0
        seq, body = _split(raw)
        if remember:
            self._held[host] = (len(raw), seq)
        return _loads(body), len(raw)

    def forget(self, host: str) -> None:
        """The caller no longer holds ``host`` (see ``get_host_sized``)."""
        self._held.pop(host, None)

    def put_host(self, host: str, record: dict | bytes) -> list[str]:
        """Write a record, or its encoding (``encode``; the caller kept it under max_host_bytes);
        returns the hosts evicted to stay within the bound."""
        txn, hk = self.txn(), host.encode("utf-8", "surrogateescape")
        raw = record if isinstance(record, bytes) else _dumps(record)
        held = self._held.get(host)
        if held is None:
            old = self._host_value(hk)
            old_size, old_seq = (len(old), _split(old)[0]) if old else (0, b"")
        else:
            old_size, old_seq = held
        seq, writes = self._touch(hk, old_seq)
        if not old_size:
            self._hset(hk)          # a host with a record has its bits (the filter is never cleared)
        value = seq + raw
        self.meta["host_bytes"] += len(value) - old_size
        txn.put(hk, value, db=self._hosts)
        if self._reads is not None:
            self._reads.put(hk, value, _read_cost(hk, value))
        if held is not None:
            self._held[host] = (len(value), seq)
        evicted = self._evict_hosts(keep=host)
        self._wrote(1 + writes + 4 * len(evicted))
        return evicted

    def encoded_size(self, record: dict) -> int:
        return len(_dumps(record))

    @staticmethod
    def encode(record: dict) -> bytes:
        """A host record as ``put_host`` stores it (encode once to size and write it)."""
        return _dumps(record)

    def _touch(self, hk: bytes, old: bytes | None) -> tuple[bytes, int]:
        """A write of ``hk``: the write clock (``meta["seq"]``) ticks, and the host becomes the most
        recently written unless its write sequence ``old`` is within ``touch_slack`` ticks of it
        (b"": none; None: in meta, a record from before sequences were kept in it, moved into
        the record now). Returns (the sequence its value keeps, the writes made)."""
        self.meta["seq"] += 1           # the write clock: one tick per host write
        if old and self.meta["seq"] - _U64.unpack(old)[0] <= self.touch_slack:
            return old, 0
        txn, writes = self.txn(), 1
        if old is None:
            mkey = b"seq:" + hk
            old = txn.get(mkey, db=self._meta)
            if old is not None:
                txn.delete(mkey, db=self._meta)
                writes += 1
        if old:
            txn.delete(old, db=self._lru)
            writes += 1
        seq = _U64.pack(self.meta["seq"])
        txn.put(seq, hk, db=self._lru)
        return seq, writes

    def _evict_hosts(self, keep: str) -> list[str]:
        if self.meta["host_bytes"] <= self.max_hosts_bytes:
            return []
        txn = self.txn()
        cur = txn.cursor(db=self._lru)
        keep_b = keep.encode("utf-8", "surrogateescape")
        victims = []
        over = self.meta["host_bytes"] - self.max_hosts_bytes
        for seq, hk in cur:
            if over <= 0:
                break
            if hk == keep_b:
                continue
            raw = self._host_value(hk)
            over -= len(raw) if raw else 0
            victims.append((seq, hk))
        out = [hk.decode("utf-8", "surrogateescape") for _seq, hk in victims]
        for host in out:
            self.delete_host(host)
        return out

    def delete_host(self, host: str) -> None:
        txn, hk = self.txn(), host.encode("utf-8", "surrogateescape")
        self._held.pop(host, None)
        raw = self._host_value(hk)
        if self._reads is not None:
            self._reads.pop(hk)
        seq = None
        if raw is not None:
            seq = _split(raw)[0]
            self.meta["host_bytes"] -= len(raw)
            txn.delete(hk, db=self._hosts)
            self.meta["evicted_hosts"] += 1
        if seq is None:                     # a record from before sequences were kept in it
            seq = txn.get(b"seq:" + hk, db=self._meta)
            if seq is not None:
                txn.delete(b"seq:" + hk, db=self._meta)
        if seq:
            txn.delete(seq, db=self._lru)
        for rule_key in self._skip_rules(hk):
            self.pop_skips(host, rule_key)

    def hosts(self):
        """(host, record) for every stored host (a scan: for stats and start-up)."""
        for k, v in self.txn().cursor(db=self._hosts):
            yield k.decode("utf-8", "surrogateescape"), _loads(_split(v)[1])

    # -- archived set ----------------------------------------------------------------------
    def _fset(self, g: int, fp: int) -> None:
        f, m = self._filters[g], self._fmask
        a, b = fp & m, (fp >> 32) & m
        f[a >> 3] |= 1 << (a & 7)
        f[b >> 3] |= 1 << (b & 7)

    def _in(self, g: int, fp: int) -> bool:
        """True if generation ``g`` may hold ``fp`` (False: it does not; a filter never misses one)."""
        f = self._filters
        if f is None:
            return True
        f, m = f[g], self._fmask
        a, b = fp & m, (fp >> 32) & m
        return bool(f[a >> 3] >> (a & 7) & 1 and f[b >> 3] >> (b & 7) & 1)

    def archived(self, fp: int) -> Archived | None:
        """What the archived set says about a fingerprint, current generation first: the entries
        not written yet and the filters first (``dustobs.probe``, one call), the table only where
        a filter may hold it."""
        g = self.meta["gen"]
        r = self._probe(self._pending, self._filters, self._fmask, g, fp)
        if r is None:
            self.archived_skipped += 1
            return None
        if r.__class__ is bytes:
            return Archived(*_ARCH.unpack(r))
        for gen in ((g, 1 - g) if r == g else (r,)):
            raw = self._pending[gen].get(fp) if gen != r else None
            if raw is None and (gen == r or self._in(gen, fp)):
                self.archived_reads += 1
                raw = self.txn().get(_U64.pack(fp), db=self._arch[gen])
            if raw:
                return Archived(*_ARCH.unpack(raw))
        if self._filters is not None:
            self.archived_skipped += 1
        return None

    def add_archived(self, fp: int, kind: int, slot: int = 0, epoch: int = 0, digest: int = 0,
                     simhash: int = 0) -> None:
        """Record ``fp``; a stronger kind (URL over CANON over SKEL) is never overwritten by a weaker one."""
        prev = self.archived(fp)
        if prev is not None and prev[0] < kind:
            return
        g = self.meta["gen"]
        self._put(self._pending[g], self._filters[g] if self._filters is not None else None, self._fmask, fp,
                  _ARCH.pack(kind, slot, epoch, digest, simhash))
        if prev is None:
            self.meta["gen_count"][g] += 1
        if self.meta["gen_count"][g] >= self.max_archived // 2:
            other = 1 - g
            self.txn().drop(self._arch[other], delete=False)
            self._pending[other].clear()
            if self._filters is not None:
                self._filters[other] = bytearray(len(self._filters[other]))
            self.meta["gen_count"][other] = 0
            self.meta["gen"] = other
        self._wrote(1)

    def _write_archived(self) -> None:
        txn = self.txn()
        for g, pending in enumerate(self._pending):
            if pending:
                txn.cursor(db=self._arch[g]).putmulti([(_U64.pack(fp), pending[fp]) for fp in sorted(pending)])
                pending.clear()

    def memory(self) -> dict[str, int]:
        """The archived-set filters against their cap (`crawlerd stats`; beside them the host keys'
        filter, ``host_filter_bytes``: 16 bits per 512 B of the hosts' share of ``max_bytes``); ``pending``: entries added
        since the last commit (bounded by the commit cadence and the write budget, not by this cap)."""
        return {"bytes": self.filter_bytes, "cap_bytes": self.filter_bytes, "host_filter_bytes": len(self._hfilter),
                "pending": sum(len(p) for p in self._pending), "entries": sum(self.meta["gen_count"]), "evictions": 0,
                "reads": self.archived_reads, "reads_skipped": self.archived_skipped,
                "host_reads_skipped": self.host_reads_skipped}

    def read_cache_memory(self) -> dict[str, int]:
        """The host values' read cache against ``read_cache_bytes`` (`crawlerd stats`)."""
        if self._reads is None:
            return {"bytes": 0, "cap_bytes": 0, "entries": 0, "evictions": 0}
        return self._reads.memory()

    def unlanded(self) -> dict[str, int]:
        """Its overlay's writes not landed yet (``Overlay.memory``; empty without a writer)."""
        return self._overlay.memory() if self._overlay is not None else {}

    def _wrote(self, writes: int) -> None:
        """A top-level write is done (no cursor of this transaction is open): an early commit once
        the transaction's writes could fill the reserved page buffers (``WriteBudget``). It makes
        durable what a commit a moment later would have: a crash loses less evidence, never more."""
        self._budget.spend(writes)
        if self._budget.full:
            self.commit()

    # -- skip log ----------------------------------------------------------------------------
    @staticmethod
    def _skip_prefix(host: str, rule: str) -> bytes:
        return host.encode("utf-8", "surrogateescape") + b"\0" + rule.encode() + b"\0"

    def log_skip(self, host: str, rule: str, record: bytes, logged: int) -> int:
        """Remember a skipped URL's record under its rule, which has ``logged`` records so far;
        returns the new count (unchanged: not kept, the log is full). The oldest go first."""
        if self.meta["skip_bytes"] + len(record) > self.max_skip_bytes:
            return logged
        txn, prefix = self.txn(), self._skip_prefix(host, rule)
        self.meta["seq"] += 1
        txn.put(prefix + _U64.pack(self.meta["seq"]), record, db=self._skips)
        self.meta["skip_bytes"] += len(record)
        logged += 1
        if logged > SKIP_LOG_PER_RULE:
            cur = txn.cursor(db=self._skips)
            if cur.set_range(prefix) and cur.key().startswith(prefix):
                self.meta["skip_bytes"] -= len(cur.value())
                cur.delete()
                logged -= 1
        return logged

    def pop_skips(self, host: str, rule: str) -> list[bytes]:
        """Take every logged skip of ``host``'s ``rule`` out of the log."""
        txn, prefix = self.txn(), self._skip_prefix(host, rule)
        cur = txn.cursor(db=self._skips)
        out = []
        if cur.set_range(prefix):
            while cur.key().startswith(prefix):
                out.append(bytes(cur.value()))
                self.meta["skip_bytes"] -= len(cur.value())
                if not cur.delete():
                    break
        return out

    def _skip_rules(self, hk: bytes) -> list[str]:
        cur = self.txn().cursor(db=self._skips)
        rules: list[str] = []
        prefix = hk + b"\0"
        if cur.set_range(prefix):
            for k in cur.iternext(values=False):
                if not k.startswith(prefix):
                    break
                r = k[len(prefix):].split(b"\0", 1)[0].decode()
                if not rules or rules[-1] != r:
                    rules.append(r)
        return rules

    # -- durability ----------------------------------------------------------------------------
    def _commit_unsynced(self) -> None:
        self.commit(sync=False)

    def _pending_bytes(self) -> int:
        return (len(self._pending[0]) + len(self._pending[1])) * PENDING_ARCHIVED_BYTES

    def commit(self, then=None, *, sync: bool = True) -> None:
        """Commit (durable: fsync'd; ``sync=False`` with a writer: not synced, a step the next
        synced commit covers). With a writer attached the commit is handed over and ``then`` runs
        on the loop once it landed; without one, ``then`` runs now."""
        self._write_archived()
        txn = self.txn()
        txn.put(b"counters", _dumps(self.meta), db=self._meta)     # with the priors' table: orjson
        if self._overlay is not None:
            self._overlay.commit(then, sync=sync)
            self._budget.committed()
            return
        txn.commit()
        self._txn = None
        self._budget.committed()
        if then is not None:
            then()

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write on ``writer`` from now on (the open transaction commits here first); None: detach,
        once every commit handed over landed (else WriterError)."""
        if writer is not None:
            if self._overlay is None:
                self.commit()
                self._overlay = Overlay(self.env, writer, self._budget)
                self.gate.attach(self._overlay)
        elif self._overlay is not None:
            self.gate.detach(self._overlay)
            self._overlay.close()
            self._overlay = None

    @property
    def overlay(self) -> Overlay | None:
        return self._overlay

    def barrier(self, then) -> None:
        """Run ``then`` on the loop once every commit made so far landed (now, without a writer)."""
        if self._overlay is not None:
            self._overlay.barrier(then)
        else:
            then()

    def close(self) -> None:
        if self.env is None:
            return
        if self._overlay is not None:      # its writer stopped (a failed write): what it held is lost
            self._overlay = None
            self.env.close()
            self.env = None
            raise WriterError("dust store closed with commits handed over and not written")
        self.commit()
        self.env.close()
        self.env = None


_MISS = object()


def _read_cost(hk: bytes, raw: bytes | None) -> int:
    """Estimated bytes of a read-cache entry: its key and value objects (the map's own in ByteLRU)."""
    return 33 + len(hk) + (0 if raw is None else 33 + len(raw))


def _loads(body: bytes) -> dict:
    """A record ``_dumps`` wrote: orjson, or ``json`` for what ``_dumps`` had to write with it (orjson
    rejects the ``\\udcXX`` escape of a lone surrogate)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def _dumps(record: dict) -> bytes:
    """A host record (or the meta record, at each commit) as compact JSON: orjson (a record is
    read, and one written back, per archived page whose host misses the decoded cache; ``json``
    took 4-6 times as long both ways on a 2 KB record), ``json`` for what orjson refuses (a lone
    surrogate, an integer past 64 bits)."""
    try:
        return orjson.dumps(record)
    except orjson.JSONEncodeError:
        return json.dumps(record, separators=(",", ":")).encode()
