"""The wire between the crawl process and its processing workers (``crawlerd.process.pool``
on one end, ``crawlerd.process.worker_process`` on the other).

One Unix socketpair per worker carries length-prefixed pickles of plain tuples (``LEN``, then
the pickle of at most ``MAX_FRAME`` bytes): ``("init", dict)``, ``("job", id, meta, first
block, size, prior, digest, lookup, sitemap)`` or several in one ``("jobs", [job])``, ``("near", ...)``
both ways, ``("results", [(id, packed result)], segment, size, hosts)`` (``results_frame``: a
result's links one bytes of columns naming the frame's ``hosts``, ``crawlerd._native.linkwire``)
and ``("close",)``. Beside it, an 8-byte progress page both
processes map (``PROGRESS``: the id of the job the worker is working on), and the body pool
(:mod:`crawlerd._native.bodypool`), which a worker maps read-only (:class:`BodyReader`): a job's
body is the chain of blocks from its first block, or inline in ``meta`` when the first block is -1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import mmap
import pickle
import socket
import struct

from crawlerd._native.bodypool import read_chain
from crawlerd._native.linkwire import pack as pack_links
from crawlerd._native.linkwire import unpack as unpack_links
from crawlerd.outcome import Outcome
from crawlerd.records import FetchResult, ProcessResult

LEN = struct.Struct("!I")
MAX_FRAME = 1 << 30
PROGRESS = struct.Struct("<q")      # the progress page: id of the job the worker is working on (0: none)


def frame(obj) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return LEN.pack(len(data)) + data

# A ProcessResult crosses the socket as a tuple of plain values: pickling dataclass instances
# with slots calls their Python-level __getstate__/__setstate__ per object (bench/process_bench.py).
# Its links go as one bytes of columns (crawlerd._native.linkwire): a tuple per link cost the
# crawl loop a tuple, a string, a long and a Link built from them each, and left the tuples to
# the cyclic collector (bench/answer_wire_bench.py).
_PR_FIELDS = tuple(f.name for f in dataclasses.fields(ProcessResult))
_LINKS_AT = _PR_FIELDS.index("links")
_OUTCOME_AT = _PR_FIELDS.index("outcome")


def pack_result(pr: ProcessResult, hosts: dict) -> tuple:
    """``pr`` as plain values for the wire (inverse: ``unpack_result``), its links as one bytes
    (``linkwire.pack``). ``hosts``: the frame's host keys -> index, one dict for every result of
    a frame (``list(hosts)`` goes in the frame): a key is sent and decoded once per frame and
    the links naming it share the one decoded string (and its cached hash)."""
    values = [getattr(pr, name) for name in _PR_FIELDS]
    values[_OUTCOME_AT] = pr.outcome.value
    values[_LINKS_AT] = pack_links(pr.links, hosts)
    return tuple(values)


# an outcome's value -> the outcome: a dict lookup, where Outcome(value) runs the enum's Python __call__
_OUTCOMES = {o.value: o for o in Outcome}


def unpack_result(values: tuple, hosts: list) -> ProcessResult:
    """A ``pack_result`` tuple as the result; ``hosts`` the frame's host list. ValueError if it
    does not decode (an unknown outcome, a links record ``linkwire.unpack`` cannot read)."""
    values = list(values)
    if len(values) != len(_PR_FIELDS):
        raise ValueError(f"a result of {len(values)} values, not {len(_PR_FIELDS)}")
    outcome = _OUTCOMES.get(values[_OUTCOME_AT])
    values[_OUTCOME_AT] = outcome if outcome is not None else Outcome(values[_OUTCOME_AT])  # ValueError
    values[_LINKS_AT] = unpack_links(values[_LINKS_AT], hosts)
    return ProcessResult(*values)


def results_frame(answers: list[tuple[int, ProcessResult]], segment: str, size: int) -> bytes:
    """A worker's answer frame: ``("results", [(job id, packed result)], segment, size, hosts)``."""
    hosts: dict = {}
    packed = [(job_id, pack_result(pr, hosts)) for job_id, pr in answers]
    return frame(("results", packed, segment, size, list(hosts)))


def unpack_results(msg: tuple) -> tuple[list[tuple[int, ProcessResult]], str, int]:
    """A decoded ``results_frame``: ``([(job id, result)], segment, size)``, every result decoded
    (ValueError, whatever is wrong with the frame's shape or values: the pool's reader closes
    the connection on it, nothing of the frame applied)."""
    try:
        _kind, answers, segment, size, hosts = msg
        if type(hosts) is not list:
            raise TypeError(f"the frame's hosts are a {type(hosts).__name__}")
        return [(job_id, unpack_result(packed, hosts)) for job_id, packed in answers], segment, size
    except (TypeError, IndexError, KeyError, AttributeError, OverflowError) as e:
        raise ValueError(f"malformed answer frame: {type(e).__name__}: {e}") from e


class FrameReader:
    """Length-prefixed frames from a blocking socket, read in large chunks (few recv calls)."""

    def __init__(self, sock: socket.socket, chunk_bytes: int = 1 << 20):
        self.sock = sock
        self.buf = bytearray()
        self.pos = 0
        self.chunk_bytes = chunk_bytes

    def next(self):
        """The next unpickled frame, or None at end of stream."""
        if not self._fill(LEN.size):
            return None
        (n,) = LEN.unpack_from(self.buf, self.pos)
        if not self._fill(LEN.size + n):
            return None
        start = self.pos + LEN.size
        msg = pickle.loads(memoryview(self.buf)[start:start + n])
        self.pos = start + n
        return msg

    def ready(self) -> bool:
        """True if a whole frame can be read without blocking."""
        if len(self.buf) - self.pos < LEN.size or \
                len(self.buf) - self.pos < LEN.size + LEN.unpack_from(self.buf, self.pos)[0]:
            try:
                chunk = self.sock.recv(self.chunk_bytes, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return False
            if not chunk:
                return False
            del self.buf[:self.pos]
            self.pos = 0
            self.buf += chunk
        avail = len(self.buf) - self.pos
        return avail >= LEN.size and avail >= LEN.size + LEN.unpack_from(self.buf, self.pos)[0]

    def _fill(self, need: int) -> bool:
        if len(self.buf) - self.pos >= need:
            return True
        del self.buf[:self.pos]
        self.pos = 0
        while len(self.buf) < need:
            try:
                chunk = self.sock.recv(max(self.chunk_bytes, need - len(self.buf)))
            except (ConnectionResetError, BrokenPipeError):
                return False          # the crawl process is gone (e.g. kill -9): same as end of input
            if not chunk:
                return False
            self.buf += chunk
        return True


def fetch_result(meta: tuple, body: bytes) -> FetchResult:
    url, outcome, status, ip, started_at, elapsed_s, request_head, response_head, headers, error, _ = meta
    return FetchResult(url=url, outcome=Outcome(outcome), status=status, ip=ip, started_at=started_at,
                       elapsed_s=elapsed_s, request_head=request_head, response_head=response_head, body=body,
                       headers=headers, error=error)


class BodyReader:
    """A worker's view of the body pool: the memfd mapped read-only, bodies read by their chain."""

    def __init__(self, fd: int, size: int, blocks: int, header: int, block_bytes: int) -> None:
        self.map = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        self.blocks, self.header, self.block_bytes = blocks, header, block_bytes

    def get(self, first: int, size: int) -> bytes:
        return read_chain(self.map, self.blocks, self.header, self.block_bytes, first, size)

    def close(self) -> None:
        self.map.close()


class AnswerReader(asyncio.Protocol):
    """The crawl process's end of one worker's socket: parses every complete frame of each read.

    Invariant: ``buf[pos:]`` is the unparsed tail (a partial frame at most)."""

    def __init__(self, on_frame) -> None:
        self.on_frame = on_frame
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future = asyncio.get_running_loop().create_future()
        self.error: Exception | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos, n = 0, len(buf)
        try:
            while n - pos >= LEN.size:
                (size,) = LEN.unpack_from(buf, pos)
                if size > MAX_FRAME:
                    raise pickle.UnpicklingError(f"frame of {size} bytes")
                end = pos + LEN.size + size
                if end > n:
                    break
                msg = pickle.loads(memoryview(buf)[pos + LEN.size:end])
                pos = end
                self.on_frame(msg)
        except (pickle.UnpicklingError, EOFError, ValueError) as e:
            self.error = e
            del buf[:]
            if self.transport is not None:
                self.transport.close()
            return
        del buf[:pos]

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(exc or self.error)
