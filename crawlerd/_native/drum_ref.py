"""Pure-Python reference of the DRUM kernels (``crawlerd/_native/drum.pyx``).

Same API, same semantics, same bytes on disk (journal blocks, spill records,
key file payload, checksums), written for clarity, not speed. The tests run
``crawlerd.seen.drum.Drum`` on both and compare the kernels on the same cases.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

OP_CHECK, OP_UPDATE, OP_CHECK_UPDATE = 0, 1, 2
WAYS = 8
BLOCK_HEADER = 40
BLOCK_MAGIC = 0x4D555244
ORD_MASK = (1 << 62) - 1
_M64 = (1 << 64) - 1
_K1 = np.uint64(0x9E3779B97F4A7C15)


@dataclass(slots=True)
class Result:
    """One answer handed out: key, op, unique (absent just before this operation), value (stored
    just before it), aux (as submitted), seq (global submission number). The native one is not
    tracked by the cyclic collector; this one is (a plain class)."""
    key: int
    op: object
    unique: bool
    value: bytes | None
    aux: bytes | None
    seq: int


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _mix64_int(x: int) -> int:
    return int(_mix64(np.array([x], dtype=np.uint64))[0])


def hash_words(data, word0: int = 0) -> int:
    """Sum of mix64(word + index * K1) over little-endian words, last word zero-padded."""
    data = bytes(data)
    if not data:
        return 0
    data += b"\0" * (-len(data) % 8)
    w = np.frombuffer(data, dtype="<u8").astype(np.uint64)
    idx = np.arange(len(w), dtype=np.uint64) + np.uint64(word0)
    with np.errstate(over="ignore"):
        return int(_mix64(w + idx * _K1).sum(dtype=np.uint64))


def bucket_of(key: int, buckets: int) -> int:
    """Bucket of a key: its high 32 bits scaled to [0, buckets)."""
    return ((key >> 32) * buckets) >> 32


def sort_keys(keys) -> list[int]:
    """Stable order of ``keys`` by key."""
    return sorted(range(len(keys)), key=lambda i: int(keys[i]))


class Core:
    """Reference of ``drum.Core``: RAM buckets, cache, journal writer, merge pass.

    Buckets: key -> bucket_of(key); each a list of (key, ordop, value) in
    ordinal order after the records already spilled. Cache: per set a list of
    [key, value], most recent first, at most 8 long.
    """

    def __init__(self, buckets: int, bucket_buffer_bytes: int, value_size: int, cache_entries: int):
        if not 1 <= buckets <= 65536:
            raise ValueError("buckets must be in [1, 65536]")
        if not 0 <= value_size <= 65535:
            raise ValueError("value_size must be in [0, 65535]")
        self.buckets = buckets
        self.value_size = value_size
        self.record_size = 16 + value_size
        self.bucket_records = max(1, bucket_buffer_bytes // self.record_size)
        self.ordinals = 0
        self.max_bucket_bytes = 0
        self.cache_hits = 0
        self._ram: list[list[bytes]] = [[] for _ in range(buckets)]
        self._spilled = [0] * buckets
        self._spill_fds = [-1] * buckets
        self._journal_fd = -1
        sets = 0
        if cache_entries > 0:
            sets = 1
            while sets * 2 * WAYS <= cache_entries:
                sets *= 2
        self._sets: list[list[list]] = [[] for _ in range(sets)]
        self.cache_capacity = sets * WAYS
        self._admit_on_merge = value_size > 0

    def set_files(self, journal_fd: int, spill_fds) -> None:
        if len(spill_fds) != self.buckets:
            raise ValueError("need one spill file per bucket")
        self._journal_fd = journal_fd
        self._spill_fds = list(spill_fds)

    def spilled_bytes(self, b: int) -> int:
        return self._spilled[b]

    def buffered(self, b: int) -> int:
        return len(self._ram[b])

    # -- cache --

    def _set_of(self, key: int) -> list[list]:
        return self._sets[_mix64_int(key) & (len(self._sets) - 1)]

    def _probe(self, key: int) -> bytes | None:
        if not self._sets or key == 0:
            return None
        s = self._set_of(key)
        for i, slot in enumerate(s):
            if slot[0] == key:
                if i and self.value_size <= 256:
                    s.insert(0, s.pop(i))
                return slot[1]
        return None

    def _insert(self, key: int, value: bytes) -> None:
        if not self._sets or key == 0:
            return
        s = self._set_of(key)
        for i, slot in enumerate(s):
            if slot[0] == key:
                s.pop(i)
                break
        else:
            if len(s) == WAYS:
                s.pop()
        s.insert(0, [key, value])

    def cache_lookup(self, key: int):
        v = self._probe(key)
        return v is not None, (v if v is not None and self.value_size else None)

    # -- submission --

    def submit(self, keys, op: int, values, aux_lens, aux, first_seq: int) -> int:
        V = self.value_size
        if op not in (0, 1, 2):
            raise ValueError("bad op")
        keys = [int(k) for k in keys]
        n = len(keys)
        flags = 0
        vals = None
        if values is not None and V:
            vals = bytes(values)
            if len(vals) != n * V:
                raise ValueError("values must be len(keys) * value_size bytes")
            flags |= 1
        lens = None
        blob = b""
        if aux_lens is not None:
            lens = [int(x) for x in aux_lens]
            if len(lens) != n or aux is None:
                raise ValueError("aux_lens must have one length per key")
            blob = bytes(aux)
            if sum(lens) != len(blob):
                raise ValueError("aux lengths do not add up")
            flags |= 2
        hit = bytearray(n)
        hitvals = bytearray(n * V)
        if not (op == OP_UPDATE and V):
            for i, k in enumerate(keys):
                v = self._probe(k)
                if v is not None:
                    hit[i] = 1
                    hitvals[i * V:(i + 1) * V] = v
        payload = struct.pack(f"<{n}Q", *keys) + bytes(hit) + bytes(hitvals)
        if flags & 1:
            payload += vals
        if flags & 2:
            payload += struct.pack(f"<{n}I", *lens) + blob
        payload += b"\0" * (-len(payload) % 8)
        head = struct.pack("<IBBHIIQQ", BLOCK_MAGIC, op, flags, V, n, len(blob), first_seq, len(payload))
        h = (hash_words(head, 0) + hash_words(payload, 4)) & _M64
        if self._journal_fd < 0:
            raise ValueError("journal not open")
        block = head + struct.pack("<Q", h) + payload
        view = memoryview(block)
        while view:
            view = view[os.write(self._journal_fd, view):]
        self._add(keys, hit, op, vals, admit=True)
        hits = sum(hit)
        self.cache_hits += hits
        return hits

    def replay(self, keys, hit, op: int, values) -> None:
        keys = [int(k) for k in keys]
        if len(hit) != len(keys):
            raise ValueError("hit flags must match keys")
        vals = bytes(values) if values is not None and self.value_size else None
        if vals is not None and len(vals) != len(keys) * self.value_size:
            raise ValueError("values size mismatch")
        self._add(keys, bytes(hit), op, vals, admit=False)

    def _add(self, keys, hit, op, vals, admit) -> None:
        V, R = self.value_size, self.record_size
        admit_key = admit and op != OP_CHECK and (V == 0 or op == OP_UPDATE)
        for i, key in enumerate(keys):
            if hit[i]:
                continue
            b = bucket_of(key, self.buckets)
            value = vals[i * V:(i + 1) * V] if vals is not None else b"\0" * V
            self._ram[b].append(struct.pack("<QQ", key, (op << 62) | self.ordinals) + value)
            self.ordinals += 1
            if len(self._ram[b]) == self.bucket_records:
                data = b"".join(self._ram[b])
                if self._spill_fds[b] < 0:
                    raise ValueError("spill files not open")
                done = 0
                while done < len(data):
                    done += os.pwrite(self._spill_fds[b], data[done:], self._spilled[b] + done)
                self._spilled[b] += len(data)
                self._ram[b] = []
            self.max_bucket_bytes = max(self.max_bucket_bytes, self._spilled[b] + len(self._ram[b]) * R)
            if admit_key:
                self._insert(key, value)

    def reset_epoch(self) -> None:
        self._ram = [[] for _ in range(self.buckets)]
        self._spilled = [0] * self.buckets
        self.ordinals = 0
        self.max_bucket_bytes = 0

    # -- merge --

    def merge(self, old_fd: int, old_count: int, old_hash: int, new_fd: int, unique_out, values_out):
        V, R = self.value_size, self.record_size
        OR = 8 + V
        if len(unique_out) < self.ordinals or len(values_out) < self.ordinals * V:
            raise ValueError("output arrays too small")
        old = b""
        if old_count:
            chunks, want = [], old_count * OR
            while want:
                c = os.read(old_fd, want)
                if not c:
                    raise ValueError("key file is shorter than its header says")
                chunks.append(c)
                want -= len(c)
            old = b"".join(chunks)
        old_recs = [(int.from_bytes(old[i:i + 8], "little"), old[i + 8:i + OR]) for i in range(0, len(old), OR)]
        for a, b in zip(old_recs, old_recs[1:], strict=False):
            if b[0] <= a[0]:
                raise ValueError(f"key file is not strictly sorted (at key {b[0]:#x})")
        state = dict(old_recs)
        pending = []
        for b in range(self.buckets):
            nspill = self._spilled[b]
            data = b""
            if nspill:
                data = os.pread(self._spill_fds[b], nspill, 0)
                if len(data) != nspill:
                    raise ValueError("bucket file is shorter than recorded")
            data += b"".join(self._ram[b])
            pending += [data[i:i + R] for i in range(0, len(data), R)]
        touched = set()
        # Records sorted by ordinal = submission order: apply them as a dict would.
        pending.sort(key=lambda r: int.from_bytes(r[8:16], "little") & ORD_MASK)
        for rec in pending:
            key = int.from_bytes(rec[:8], "little")
            ordop = int.from_bytes(rec[8:16], "little")
            op, o = ordop >> 62, ordop & ORD_MASK
            present = key in state
            unique_out[o] = 0 if present else 1
            if V:
                values_out[o * V:(o + 1) * V] = np.frombuffer(state[key] if present else b"\0" * V, np.uint8)
            if op == OP_UPDATE or (op == OP_CHECK_UPDATE and not present):
                state[key] = rec[16:]
            touched.add(key)
        if hash_words(old) != old_hash:
            raise ValueError("key file checksum mismatch")
        out = b"".join(k.to_bytes(8, "little") + state[k] for k in sorted(state))
        view = memoryview(out)
        while view:
            view = view[os.write(new_fd, view):]
        if self._admit_on_merge:
            for k in sorted(touched):
                if k in state:
                    self._insert(k, state[k])
        return len(state), hash_words(out)


def make_results(keys, unique, op, seq, i0, i1, aux, ends, values, value_size):
    """Answers ``i0`` to ``i1 - 1`` of one run of a delivery as ``Result``; see ``drum.make_results``."""
    if i0 < 0 or i1 > len(keys) or i1 > len(unique):
        raise IndexError("answers out of range")
    if (ends is None) != (aux is None):
        raise ValueError("aux and ends go together")
    if ends is not None and i1 > len(ends):
        raise IndexError("answers out of range")
    V = value_size
    if V and (values is None or len(values) < i1 * V):
        raise ValueError("values too short")
    out = []
    prev = int(ends[i0 - 1]) if ends is not None and i0 else 0
    for j in range(i0, i1):
        a = None
        if ends is not None:
            end = int(ends[j])
            if end < prev or end > len(aux):
                raise ValueError("aux ends out of order")
            a = bytes(aux[prev:end])
            prev = end
        u = bool(unique[j])
        value = bytes(values[j * V:(j + 1) * V]) if V and not u else None
        out.append(Result(int(keys[j]), op, u, value, a, seq + j))
    return out


def decode_blocks(buf, value_size, unique_in, values_in, ordinal, seq, keys_out, unique_out, values_out,
                  out_pos):
    """Answer whole journal blocks from ``buf`` into the output arrays; see ``drum.decode_blocks``."""
    buf = bytes(buf)
    V = value_size
    off, pos, o, s = 0, out_pos, ordinal, seq
    while off + BLOCK_HEADER <= len(buf):
        magic, op, flags, bv, n, auxb, first, plen, h = struct.unpack_from("<IBBHIIQQQ", buf, off)
        if magic != BLOCK_MAGIC or op > 2 or flags > 3 or bv != V:
            raise ValueError(f"bad journal block header at offset {off}")
        want = n * (9 + V) + (n * V if flags & 1 else 0) + (n * 4 + auxb if flags & 2 else 0)
        if want + (-want % 8) != plen:
            raise ValueError(f"bad journal block length at offset {off}")
        if off + BLOCK_HEADER + plen > len(buf) or pos + n > len(keys_out):
            break
        payload = buf[off + BLOCK_HEADER:off + BLOCK_HEADER + plen]
        if (hash_words(buf[off:off + 32]) + hash_words(payload, 4)) & _M64 != h:
            raise ValueError(f"journal block checksum mismatch at offset {off}")
        if first != s:
            raise ValueError(f"journal block at offset {off} starts at seq {first}, expected {s}")
        keys = struct.unpack_from(f"<{n}Q", payload, 0)
        hit = payload[n * 8:n * 9]
        hv = payload[n * 9:n * 9 + n * V]
        for i in range(n):
            keys_out[pos + i] = keys[i]
            if hit[i]:
                unique_out[pos + i] = 0
                if V:
                    values_out[(pos + i) * V:(pos + i + 1) * V] = np.frombuffer(hv[i * V:(i + 1) * V], np.uint8)
            else:
                if o >= len(unique_in):
                    raise ValueError("fewer answers than journalled keys")
                unique_out[pos + i] = unique_in[o]
                if V:
                    values_out[(pos + i) * V:(pos + i + 1) * V] = values_in[o * V:(o + 1) * V]
                o += 1
        pos += n
        s += n
        off += BLOCK_HEADER + plen
    return off, pos - out_pos, o - ordinal
