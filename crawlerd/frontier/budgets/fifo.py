"""BEAST's deferred FIFOs on disk: a host's run of URLs deferred together is one entry.

A domain's FIFO is ordered by (host turn, arrival sequence) (``beast``: "Hosts in turn"). A page's
links that wait are mostly a few hosts' URLs, and a host's k waiting URLs deferred between two
commits take the consecutive turns t, t+1, ..., t+k-1. Written one key per URL, that was about
twenty random B-tree puts per page on the writer thread (half of its puts; bench/RESULTS.md,
"eleventh pass: the writer's puts per page"). So such a run is written as one entry:

``deferred`` keys (after the domain key and NUL; integers big-endian, so byte order is FIFO order):

- ``turn u64 | seq u64`` -> ``fp u64 | record``: one URL (format 2; what a run of one is written as);
- ``turn u64 | seq u64 | RUN`` -> entries ``seq u64 | length u32 | fp u64 | record``: a run, its
  i-th entry at turn ``turn + i`` and its own arrival ``seq`` (the first one's is the key's).

Every URL of a run sorts at or after its key, so the domain's first URL is always the first entry
of its first key; a pop takes it, and the run's next ones while they sort before the domain's next
key, then writes the run's rest back under the key of its first URL left (the key that URL would
have had on its own). Reading both kinds, a state written before runs opens as it is.
Runs stop at ``RUN_BYTES`` (an LMDB node past ~2 KiB goes to overflow pages, which the writer's
page budget does not count).
"""

from __future__ import annotations

import heapq
import struct

from crawlerd._native.fiforuns import block_ends, pack_block

RUN = b"\x01"                         # key suffix: the value is a run
RUN_BYTES = 1536                      # a run is closed before its value passes this
_TS = struct.Struct(">QQ")            # host turn, arrival sequence
_ENTRY = struct.Struct("<QI")         # a run's entry: arrival sequence, length of fp | record
_TS_LEN = _TS.size


class RunBuffer:
    """Deferred URLs not yet in the table, as runs. Key: host turns key (domain key | NUL | host
    hash) -> its open run [first turn, next turn, first seq, packed entries (bytes, one per block
    added), bytes of its value so far, URLs]. Invariant: an open run's entries have consecutive
    turns from its first; a block whose first turn does not follow closes its host's run (closed
    runs wait in ``closed`` as (key, value))."""

    __slots__ = ("open", "closed", "urls")

    def __init__(self) -> None:
        self.open: dict[bytes, list] = {}
        self.closed: list[tuple[bytes, bytes]] = []
        self.urls = 0

    def add_block(self, hk: bytes, turn: int, seq: int, hosts: list, fps: list[int], records: list[bytes], i: int,
                  j: int) -> int:
        """URLs ``i``, ``i+1``, ... of the host ``hosts[i]`` (its turns key ``hk``), up to ``j`` or the
        first URL of another host, at turns ``turn``, ``turn+1``, ... and arrivals ``seq``, ... (payload:
        fp | record, packed in one native call per run); returns the index after the last one."""
        r = self.open.get(hk)
        if r is not None and r[1] != turn:
            self.closed.append(_encode(hk, r))
            r = None
        x = i
        while True:
            if r is None:
                chunk, e, used = pack_block(hosts, x, j, seq, fps, records, 0, RUN_BYTES)
                r = self.open[hk] = [turn, turn, seq, [chunk], used, 0]
            else:
                chunk, e, used = pack_block(hosts, x, j, seq, fps, records, r[4], RUN_BYTES)
                if e > x:
                    r[3].append(chunk)
                    r[4] = used
            k = e - x
            r[1] += k
            r[5] += k
            turn += k
            seq += k
            x = e
            if x == j or hosts[x] != hosts[i]:
                self.urls += x - i
                return x
            self.closed.append(_encode(hk, r))      # full: the next URL starts a new run
            r = None

    def __len__(self) -> int:
        """Keys ``take`` would write now."""
        return len(self.open) + len(self.closed)

    def take(self) -> list[tuple[bytes, bytes]]:
        """Every buffered run as (key, value), sorted by key; the buffer is empty after."""
        out = self.closed
        out += [_encode(hk, r) for hk, r in self.open.items()]
        self.open, self.closed, self.urls = {}, [], 0
        out.sort()
        return out


def _encode(hk: bytes, r: list) -> tuple[bytes, bytes]:
    head = hk[:hk.index(b"\0") + 1]
    if r[5] == 1:
        return head + _TS.pack(r[0], r[2]), r[3][0][_ENTRY.size:]
    return head + _TS.pack(r[0], r[2]) + RUN, b"".join(r[3])


def entries(key: bytes, value: bytes, at: int) -> list[tuple[bytes, bytes]]:
    """The URLs of one table entry (``at``: where its turn starts in the key) as (turn | seq as
    stored in a key, fp | record), in FIFO order."""
    if len(key) == at + _TS_LEN:
        return [(bytes(key[at:]), bytes(value))]
    turn = _TS.unpack_from(key, at)[0]
    out = []
    p, n, pack, unpack = 0, len(value), _TS.pack, _ENTRY.unpack_from
    while p < n:
        seq, size = unpack(value, p)
        p += _ENTRY.size
        out.append((pack(turn, seq), bytes(value[p:p + size])))
        p += size
        turn += 1
    return out


def count(key: bytes, value: bytes, at: int) -> int:
    """URLs in one table entry."""
    if len(key) == at + _TS_LEN:
        return 1
    n = p = 0
    unpack = _ENTRY.unpack_from
    while p < len(value):
        p += _ENTRY.size + unpack(value, p)[1]
        n += 1
    return n


def pack_rest(head: bytes, rest: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """The (key, value) of what is left of a run (``entries`` output, consecutive turns)."""
    ts, payload = rest[0]
    if len(rest) == 1:
        return head + ts, payload
    return head + ts + RUN, b"".join(_ENTRY.pack(_TS.unpack(t)[1], len(v)) + v for t, v in rest)


def take_first(got: list[tuple[bytes, bytes]], at: int, n: int, out: list[bytes]) -> tuple[int, list, list]:
    """Take the first ``n`` URLs (FIFO order) of a domain's first table entries ``got`` (key, value;
    ``at``: where the turn starts in a key), appending their records (fp stripped) to ``out``.

    An entry's URLs ascend from its key, so the first ``n`` URLs are among the first ``n`` entries;
    they are merged by a heap, decoding a run only as far as its URLs are taken. Returns (the turn
    of the last URL taken, the keys of the entries taken from, what is left of them as (key,
    value) to put back: a run's rest under its first URL's key, as ``pack_rest`` writes it)."""
    heap = []               # (turn | seq of an entry's next URL, entry, its offset in the value)
    for e, (key, _) in enumerate(got):
        heap.append((key[at:at + _TS_LEN], e, 0))
    heapq.heapify(heap)
    taken: dict[int, tuple[int, int]] = {}  # entry -> offset and turn after its last URL taken (-1: a single URL)
    ts = b""
    unpack = _ENTRY.unpack_from
    for _ in range(n):
        if not heap:
            raise IndexError("fewer URLs stored than asked for")
        ts, e, p = heapq.heappop(heap)
        key, value = got[e]
        if len(key) == at + _TS_LEN:                    # one URL: fp | record
            out.append(bytes(value[8:]))
            taken[e] = (-1, 0)
            continue
        seq, size = unpack(value, p)
        p += _ENTRY.size
        out.append(bytes(value[p + 8:p + size]))
        p += size
        turn = _TS.unpack(ts)[0] + 1
        taken[e] = (p, turn)
        if p < len(value):
            heapq.heappush(heap, (_TS.pack(turn, unpack(value, p)[0]), e, p))
    gone, rest = [], []
    for e, (p, turn) in taken.items():
        key, value = got[e]
        gone.append(key)
        if p < 0 or p >= len(value):
            continue
        first = _TS.pack(turn, unpack(value, p)[0])
        q = p + _ENTRY.size + unpack(value, p)[1]
        if q >= len(value):                         # one URL left: written as one
            rest.append((key[:at] + first, bytes(value[p + _ENTRY.size:q])))
        else:
            rest.append((key[:at] + first + RUN, bytes(value[p:])))
    return _TS.unpack(ts)[0], gone, rest


def first_entries(txn, db, lo: bytes, hi: bytes, limit: int) -> list[tuple[bytes, bytes]]:
    """The first ``limit`` table entries with ``lo <= key < hi``, in key order: one range read on a
    writer's overlay (``OverlayCursor.read_range``), a cursor walk on a plain transaction."""
    cur = txn.cursor(db=db)
    read = getattr(cur, "read_range", None)
    if read is not None:
        return read(lo, hi, limit)[0]
    out = []
    if cur.set_range(lo):
        for k, v in cur:
            if k >= hi or len(out) == limit:
                break
            out.append((bytes(k), bytes(v)))
    return out


def turn_of(ts: bytes) -> int:
    return _TS.unpack(ts)[0]


def upgrade_v1(txn, db) -> None:
    """Deferred keys of the first FIFO format (arrival only) take turn 0: their order is kept."""
    old = [(k, v) for k, v in txn.cursor(db=db) if len(k) - k.index(b"\0") - 1 == 8]
    for k, v in old:
        txn.delete(k, db=db)
        cut = k.index(b"\0") + 1
        txn.put(k[:cut] + _TS.pack(0, int.from_bytes(k[cut:], "big")), v, db=db)


def blocks_by(keys: list, group_of=None) -> dict:
    """The runs of equal ``keys`` as blocks (first, end), grouped by ``group_of(key)`` (by the key
    itself when None): each group's blocks in order, the groups in the order of their first block
    (``Beast.offer_groups``: a page's links come in runs of one host's URLs)."""
    groups: dict = {}
    i = 0
    for j in block_ends(keys):
        g = keys[i] if group_of is None else group_of(keys[i])
        runs = groups.get(g)
        if runs is None:
            groups[g] = [(i, j)]
        else:
            runs.append((i, j))
        i = j
    return groups
