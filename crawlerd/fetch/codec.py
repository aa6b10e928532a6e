"""Body decoding with an output cap: chunked transfer coding, then content codings.

The fetcher keeps bodies exactly as received (for WARC); processing calls
:func:`decode_body` to get the payload. Every decoder here is streaming and
bounded: it never holds more than ``max_bytes`` (plus one decoder block) of
output, so a gzip or brotli bomb ends in ``too_large`` after at most the cap,
whatever its ratio.
"""

from __future__ import annotations

import zlib

import brotli

from crawlerd.outcome import Outcome

try:  # ISA-L inflate: same streaming API as zlib at about half its CPU time (bench/process_bench.py)
    from isal import isal_zlib as _inflate_lib
    _INFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate_lib.error)
except ImportError:  # pragma: no cover - depends on the environment
    _inflate_lib = zlib
    _INFLATE_ERRORS = (zlib.error,)

_FEED = 64 * 1024           # compressed bytes handed to a decoder per step


class DecodeError(Exception):
    """A body that cannot be decoded within its cap. ``outcome`` says why:
    ``too_large`` (over the cap), ``bad_response`` (broken chunked framing) or
    ``bad_encoding`` (corrupt or unknown content coding)."""

    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome = outcome


def _too_large(max_bytes: int) -> DecodeError:
    return DecodeError(Outcome.TOO_LARGE, f"decoded body exceeds {max_bytes} bytes")


def _line_end(raw: bytes, pos: int) -> tuple[int, int]:
    """(end of line content, start of next line) for the line at ``pos``; CRLF or bare LF."""
    nl = raw.find(b"\n", pos)
    if nl < 0:
        raise DecodeError(Outcome.BAD_RESPONSE, "truncated chunked body: no line end")
    end = nl - 1 if nl > pos and raw[nl - 1] == 0x0D else nl
    return end, nl + 1


def dechunk(raw: bytes, max_bytes: int) -> bytes:
    """Remove HTTP/1.1 chunked framing (RFC 9112 §7.1); chunk extensions and trailers are dropped.

    Raises DecodeError: ``bad_response`` on malformed or truncated framing,
    ``too_large`` when the payload would exceed ``max_bytes``.
    """
    out: list[bytes] = []
    total = 0
    pos = 0
    n = len(raw)
    while True:
        end, nxt = _line_end(raw, pos)
        size_text = raw[pos:end].split(b";", 1)[0].strip(b" \t")
        if not size_text or len(size_text) > 16 or size_text.strip(b"0123456789abcdefABCDEF"):
            raise DecodeError(Outcome.BAD_RESPONSE, f"bad chunk size line at byte {pos}")
        size = int(size_text, 16)
        pos = nxt
        if size == 0:
            break
        if total + size > max_bytes:
            raise _too_large(max_bytes)
        if pos + size > n:
            raise DecodeError(Outcome.BAD_RESPONSE, "truncated chunked body: short chunk")
        out.append(raw[pos:pos + size])
        total += size
        pos += size
        if raw.startswith(b"\r\n", pos):
            pos += 2
        elif raw.startswith(b"\n", pos):
            pos += 1
        else:
            raise DecodeError(Outcome.BAD_RESPONSE, f"chunk data not followed by CRLF at byte {pos}")
    # trailer section (RFC 9112 §7.1.2): header lines up to an empty line
    # A missing final CRLF is tolerated: the payload is already complete.
    while pos < n and raw.find(b"\n", pos) >= 0:
        end, nxt = _line_end(raw, pos)
        blank = end == pos
        pos = nxt
        if blank:
            break
    return b"".join(out)


_STEP = 1 << 20       # decompressed bytes produced per call


def _inflate(data: bytes, wbits: int, max_bytes: int, name: str, produced: int = 0) -> bytes:
    """zlib/gzip/raw-deflate stream(s) with output capped at ``max_bytes``."""
    out: list[bytes] = []
    d = _inflate_lib.decompressobj(wbits)
    buf = data
    try:
        while True:
            room = min(_STEP, max_bytes - produced + 1)   # small steps: peak RAM ~ the output, not a multiple
            piece = d.decompress(buf, room)
            produced += len(piece)
            if produced > max_bytes:
                raise _too_large(max_bytes)
            out.append(piece)
            if d.eof:
                rest = d.unused_data
                # gzip allows several members back to back (RFC 1952 §2.2)
                if wbits > 16 and rest[:2] == b"\x1f\x8b":
                    d = _inflate_lib.decompressobj(wbits)
                    buf = rest
                    continue
                break
            buf = d.unconsumed_tail
            if not buf and len(piece) < room:
                raise DecodeError(Outcome.BAD_ENCODING, f"truncated {name} stream")
    except _INFLATE_ERRORS as e:
        raise DecodeError(Outcome.BAD_ENCODING, f"corrupt {name} stream: {e}") from None
    return b"".join(out)


def _deflate_wbits(data: bytes) -> int:
    # "deflate" should be zlib-wrapped (RFC 9110 §8.4.1.2) but many servers send raw
    # deflate; a zlib header is CM=8 with a header checksum divisible by 31 (RFC 1950 §2.2).
    if len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0:
        return zlib.MAX_WBITS
    return -zlib.MAX_WBITS


def _unbrotli(data: bytes, max_bytes: int) -> bytes:
    out: list[bytes] = []
    produced = 0
    pos = 0
    d = brotli.Decompressor()
    try:
        while True:
            if d.can_accept_more_data():
                if pos >= len(data):
                    break
                chunk = data[pos:pos + _FEED]
                pos += _FEED
            else:
                chunk = b""
            piece = d.process(chunk, output_buffer_limit=min(_STEP, max_bytes - produced + 1))
            produced += len(piece)
            if produced > max_bytes:
                raise _too_large(max_bytes)
            out.append(piece)
            if d.is_finished():
                break
            if not chunk and not piece:
                break
    except brotli.error as e:
        raise DecodeError(Outcome.BAD_ENCODING, f"corrupt br stream: {e}") from None
    if not d.is_finished():
        raise DecodeError(Outcome.BAD_ENCODING, "truncated br stream")
    return b"".join(out)


def _unzstd(data: bytes, max_bytes: int) -> bytes:
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    out: list[bytes] = []
    produced = 0
    try:
        while True:
            piece = reader.read(min(_FEED, max_bytes - produced + 1))
            if not piece:
                break
            produced += len(piece)
            if produced > max_bytes:
                raise _too_large(max_bytes)
            out.append(piece)
    except zstandard.ZstdError as e:
        raise DecodeError(Outcome.BAD_ENCODING, f"corrupt zstd stream: {e}") from None
    return b"".join(out)


def decode_content(body: bytes, coding: str, max_bytes: int) -> bytes:
    """Undo one content coding (RFC 9110 §8.4.1) with the output capped at ``max_bytes``."""
    c = coding.strip().lower()
    if c in ("", "identity"):
        if len(body) > max_bytes:
            raise _too_large(max_bytes)
        return body
    if c in ("gzip", "x-gzip"):
        return _inflate(body, 16 + zlib.MAX_WBITS, max_bytes, "gzip")
    if c in ("deflate", "x-deflate"):
        return _inflate(body, _deflate_wbits(body), max_bytes, "deflate")
    if c == "br":
        return _unbrotli(body, max_bytes)
    if c == "zstd":
        return _unzstd(body, max_bytes)
    raise DecodeError(Outcome.BAD_ENCODING, f"unsupported content-encoding {coding!r}")


def decode_body(body: bytes, *, chunked: bool, content_encoding: str | None, max_bytes: int) -> bytes:
    """The payload of a raw HTTP body: remove chunked framing if ``chunked``, then
    undo the content codings listed in ``content_encoding`` (applied in order, so
    removed in reverse). No stage's output exceeds ``max_bytes``."""
    data = dechunk(body, max_bytes) if chunked else body
    if content_encoding:
        for coding in reversed(content_encoding.split(",")):
            data = decode_content(data, coding, max_bytes)
    elif len(data) > max_bytes:
        raise _too_large(max_bytes)
    return data
