"""Exact-duplicate payload digests, for WARC revisit records.

A payload whose SHA-1 digest was seen before is written as a ``revisit``
record (WARC 1.1 §6.7.2, profile identical-payload-digest) that refers to the
first capture: its URL (WARC-Refers-To-Target-URI), date (WARC-Refers-To-Date)
and record id (WARC-Refers-To). This set remembers that first capture per digest.

It lives in an LMDB environment in its own directory, owned by one process
(an exclusive flock on ``owner.lock``; a second opener gets a clear error).
Each ``add`` is its own committed transaction, so ``kill -9`` loses nothing
that ``add`` returned for; ``durable=False`` (the default) skips the fsync per
commit, and ``flush()`` at checkpoints makes everything survive a power loss.
Other processes (the processing workers) read it through :class:`DigestView`:
LMDB serves any number of read-only openers beside its one writer.

With a writer thread attached (``attach_writer``, the shard's ``WriteThread``), ``add`` only
hands the entry over: the write transaction is begun and committed on that thread (py-lmdb
write transactions are thread-affine), grouped with the other entries of its group. Until it
lands the entry is in a RAM overlay (``_unwritten``) that ``owner``/``add`` consult first, so
the loop's answers are exactly those of a synchronous write; a worker's ``DigestView`` sees the
entry once committed (a copy archived in that window is a whole response, not a revisit: a
duplicate kept, never a capture lost). A ``kill -9`` loses at most the overlay: entries whose
captures are archived but which a later copy will not be a revisit of. A failed write is
raised by the next ``add``.
"""

from __future__ import annotations

import binascii
import fcntl
import functools
import os
from pathlib import Path

import lmdb

from crawlerd.store.lmdb_reserve import WriteBudget
from crawlerd.store.writer import WriteThread

_SHA1_BYTES = 20
_MAX_DATE_BYTES = 254
_V2 = 0xFF              # first value byte of an entry with a record id (a date length is <= 254)


# base32 (RFC 4648, either case) -> the digits of int(..., 32); anything else -> "!", which int() refuses
_B32_DIGITS = {c: "!" for c in range(128)} | {
    ord(ch): "0123456789abcdefghijklmnopqrstuv"[i]
    for alphabet in ("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", "abcdefghijklmnopqrstuvwxyz234567")
    for i, ch in enumerate(alphabet)}


def _b32_20(text: str) -> bytes:
    """The 20 bytes of 32 base32 characters (160 bits, no padding), as ``base64.b32decode`` reads
    them with ``casefold``, in one int conversion: ``b32decode`` is pure Python (~8 us a digest,
    once per archived page). ValueError for any other character."""
    if not text.isascii():          # int() would take non-ASCII digits
        raise ValueError("not base32")
    return int(text.translate(_B32_DIGITS), 32).to_bytes(_SHA1_BYTES, "big")


def digest_key(digest: bytes | bytearray | memoryview | str) -> bytes:
    """The 20 raw bytes of a SHA-1 digest given raw, as hex, or as base32 (``sha1:`` prefix optional)."""
    if isinstance(digest, (bytes, bytearray, memoryview)):
        raw = bytes(digest)
    elif isinstance(digest, str):
        text = digest.strip()
        if text[:5].lower() == "sha1:":
            text = text[5:]
        try:
            if len(text) == 32:
                raw = _b32_20(text)
            elif len(text) == 40:
                raw = bytes.fromhex(text)
            else:
                raw = b""
        except (binascii.Error, ValueError):
            raw = b""
    else:
        raise TypeError(f"digest must be bytes or str, not {type(digest).__name__}")
    if len(raw) != _SHA1_BYTES:
        raise ValueError(f"not a SHA-1 digest (20 bytes, 40 hex or 32 base32 chars): {digest!r}")
    return raw


def _encode(url: str, date: str, record_id: str = "") -> bytes:
    d = date.encode("utf-8")
    r = record_id.encode("utf-8")
    if len(d) > _MAX_DATE_BYTES or len(r) > 255:
        raise ValueError(f"date longer than {_MAX_DATE_BYTES} or record id longer than 255 bytes: "
                         f"{date!r}, {record_id!r}")
    if not r:
        return bytes([len(d)]) + d + url.encode("utf-8")
    return bytes([_V2, len(d)]) + d + bytes([len(r)]) + r + url.encode("utf-8")


def _decode(value: bytes) -> tuple[str, str, str]:
    if value[0] != _V2:
        n = value[0]
        return value[1 + n :].decode("utf-8"), value[1 : 1 + n].decode("utf-8"), ""
    n = value[1]
    m = value[2 + n]
    return (value[3 + n + m :].decode("utf-8"), value[2 : 2 + n].decode("utf-8"),
            value[3 + n : 3 + n + m].decode("utf-8"))


class DigestSet:
    """Map payload digest -> (first URL, first fetch date, its WARC-Record-ID), insert-only.

    Key: the 20-byte SHA-1 payload digest (``digest_key``). Value: one byte of
    date length, the date, the URL (UTF-8); with a record id: 0xFF, date length,
    date, record id length, record id, URL (entries written before record ids
    were kept decode with an empty id).
    Invariant: an entry is never overwritten, so it always names the first
    capture of that payload. With a writer: every key in ``_unwritten`` was handed to the
    writer and is not yet known to be committed; the entries the loop sees are the committed
    ones, then ``_unwritten`` for keys not committed (``record`` does not look first, so its
    overlay entry may name a later capture than the store's, which the writer then keeps).
    """

    def __init__(self, directory: str | os.PathLike, *, map_size_bytes: int = 64 * 2**30,
                 durable: bool = False, write_buffer_bytes: int = 0) -> None:
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self._dir / "owner.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise RuntimeError(f"digest set {self._dir} is already open by another owner") from None
        try:
            # sync=False still writes every commit to the file before it returns
            # (a process crash loses nothing); only the fsync waits for flush().
            self._env = lmdb.open(str(self._dir), map_size=map_size_bytes, subdir=True, max_dbs=0,
                                  sync=durable, metasync=durable, readahead=False, lock=True)
        except BaseException:
            os.close(self._lock_fd)
            raise
        try:
            # the writer thread's groups commit within these page buffers (lmdb_reserve): a group
            # of random digests changes about a page per entry, and a buffer LMDB adds for a
            # larger group than any before stays allocated until the set closes
            self._budget = WriteBudget(self._env, write_buffer_bytes)
        except BaseException:
            self._env.close()
            os.close(self._lock_fd)
            raise
        self._writer: WriteThread | None = None
        self._unwritten: dict[bytes, bytes] = {}
        self._write_failed: BaseException | None = None

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Write through ``writer`` from now on (None: write on the caller's thread again; the
        writer must have written everything first, i.e. be closed)."""
        self._writer = writer

    def get(self, digest: bytes | str) -> tuple[str, str] | None:
        """(first URL, first date) for a digest seen before, else None."""
        got = self.owner(digest)
        return None if got is None else got[:2]

    def owner(self, digest: bytes | str) -> tuple[str, str, str] | None:
        """(first URL, first date, its WARC-Record-ID or "") for a digest seen before, else None."""
        key = digest_key(digest)
        with self._env.begin() as txn:
            value = txn.get(key)
        if value is None:               # committed first: an overlay entry may be a later capture (record)
            value = self._unwritten.get(key)
        return None if value is None else _decode(value)

    def record(self, digest: bytes | str, url: str, date: str, record_id: str = "") -> None:
        """``add`` without its answer and, with a writer, without reading the store on the caller's
        thread: the writer keeps the entry only if the digest is absent, so the store still names
        the first capture (``owner`` reads the store before the overlay)."""
        if self._writer is None:
            self.add(digest, url, date, record_id)
            return
        if self._write_failed is not None:
            err, self._write_failed = self._write_failed, None
            raise err
        k = digest_key(digest)
        if k not in self._unwritten:
            self._unwritten[k] = _encode(url, date, record_id)
            self._writer.submit(self._write, (k, self._unwritten[k]), functools.partial(self._unwritten.pop, k, None))

    def record_many(self, entries: list[tuple[bytes | str, str, str, str]]) -> None:
        """``record`` for each (digest, url, date, record id), in order, in one hand-over to the
        writer (a repeat within them is kept once, as by ``record``)."""
        if self._writer is None:
            self.add_many(entries)
            return
        if self._write_failed is not None:
            err, self._write_failed = self._write_failed, None
            raise err
        unwritten, keys, items = self._unwritten, [], []
        for digest, url, date, record_id in entries:
            k = digest_key(digest)
            if k not in unwritten:
                v = unwritten[k] = _encode(url, date, record_id)
                keys.append(k)
                items.append((k, v))
        if items:
            self._writer.submit_many(self._write, items, functools.partial(self._forget_written, keys))

    def _forget_written(self, keys: list[bytes]) -> None:
        # on the loop, once they landed: the store answers for them now
        unwritten = self._unwritten
        for k in keys:
            unwritten.pop(k, None)

    def add(self, digest: bytes | str, url: str, date: str, record_id: str = "") -> bool:
        """Record the first capture of a payload; False (and no change) if the digest is present."""
        return self.add_many([(digest, url, date, record_id)])[0]

    def add_many(self, items: list[tuple]) -> list[bool]:
        """``add`` for several (digest, url, date[, record id]) in one transaction (in order, so a
        repeat within the batch is False)."""
        encoded = [(digest_key(d), _encode(*rest)) for d, *rest in items]
        if self._writer is None:
            with self._env.begin(write=True) as txn:
                return [txn.put(k, v, overwrite=False) for k, v in encoded]
        if self._write_failed is not None:
            err, self._write_failed = self._write_failed, None
            raise err
        out = []
        unwritten = self._unwritten
        with self._env.begin() as txn:
            for k, v in encoded:
                new = k not in unwritten and txn.get(k) is None
                out.append(new)
                if new:
                    unwritten[k] = v
                    self._writer.submit(self._write, (k, v), functools.partial(unwritten.pop, k, None))
        return out

    def _write(self, items: list[tuple[bytes, bytes]]) -> None:
        # on the writer thread: the group in as few transactions as its reserved page buffers allow
        # (each entry is its own consistent state; they land in order)
        budget = self._budget
        try:
            i = 0
            while i < len(items):
                with self._env.begin(write=True) as txn:
                    while i < len(items):
                        txn.put(*items[i], overwrite=False)
                        i += 1
                        budget.spend()
                        if budget.full:
                            break
                budget.committed()
        except lmdb.Error as e:
            self._write_failed = e

    def __contains__(self, digest: object) -> bool:
        return self.get(digest) is not None  # type: ignore[arg-type]

    def __len__(self) -> int:
        """Entries committed (with a writer: plus those handed over, until their write lands)."""
        return self._env.stat()["entries"] + len(self._unwritten)

    def flush(self) -> None:
        """Force committed entries to disk (checkpoint); with a writer, on its thread after the
        entries handed over before this call."""
        if self._writer is None:
            self._env.sync(True)
        else:
            self._writer.submit(self._sync)

    def _sync(self, _items: list) -> None:
        try:
            self._env.sync(True)
        except lmdb.Error as e:
            self._write_failed = e

    def close(self) -> None:
        """Flush and release the environment and the owner lock (idempotent)."""
        if self._lock_fd < 0:
            return
        self._env.sync(True)
        self._env.close()
        os.close(self._lock_fd)
        self._lock_fd = -1

    def __enter__(self) -> DigestSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DigestView:
    """A read-only view of a :class:`DigestSet` from another process (opened on first use, so the
    owner may create the set after the view is made). Sees every entry the owner committed."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self._dir = Path(directory)
        self._env: lmdb.Environment | None = None

    def get(self, digest: bytes | str) -> tuple[str, str] | None:
        """(first URL, first date) for a committed digest, else None (also while the set does not exist)."""
        got = self.owner(digest)
        return None if got is None else got[:2]

    def owner(self, digest: bytes | str) -> tuple[str, str, str] | None:
        """(first URL, first date, its WARC-Record-ID or "") for a committed digest, else None."""
        if self._env is None:
            if not (self._dir / "data.mdb").exists():
                return None
            self._env = lmdb.open(str(self._dir), readonly=True, subdir=True, max_dbs=0, lock=True,
                                  readahead=False)
        try:
            txn = self._env.begin()
        except lmdb.MapResizedError:
            # the owner committed past what this view mapped when it opened (the file's size then,
            # at least 10 MiB): map the owner's map size, then read
            self._env.set_mapsize(0)
            txn = self._env.begin()
        with txn:
            value = txn.get(digest_key(digest))
        return None if value is None else _decode(value)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
