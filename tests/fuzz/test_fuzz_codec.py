"""Body decoding: chunked framing and gzip/deflate/br/zstd, any input, output never above the cap."""

from __future__ import annotations

import gzip
import zlib

import brotli
import zstandard
from hypothesis import example, given
from hypothesis import strategies as st

from crawlerd.fetch.codec import DecodeError, dechunk, decode_body
from tests.fuzz.conftest import budget

_ENCODE = {
    "gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": zlib.compress,
    "raw-deflate": lambda b: zlib.compress(b)[2:-4], "br": brotli.compress,
    "zstd": lambda b: zstandard.ZstdCompressor().compress(b), "identity": lambda b: b,
}
_PLAIN = st.one_of(st.binary(max_size=3000), st.integers(0, 200_000).map(lambda n: b"a" * n))


def _mangle(data: bytes, cut: int, flip: int) -> bytes:
    if cut:
        data = data[: len(data) * cut // 8]
    if flip and data:
        i = flip % len(data)
        data = data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:]
    return data


def _chunk(data: bytes, size: int, ext: bool) -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(data[i:i + size]), b";x=1" if ext else b"", data[i:i + size])
                   for i in range(0, len(data), size))
    return out + b"0\r\n\r\n"


@budget()
@given(_PLAIN, st.lists(st.sampled_from(sorted(_ENCODE)), min_size=1, max_size=2), st.integers(0, 7),
       st.integers(0, 10_000), st.booleans(), st.integers(1, 300), st.integers(1, 100_000))
@example(b"a" * 200_000, ["gzip", "gzip"], 0, 0, False, 1, 1000)      # a small bomb, twice wrapped
def test_decode_is_exact_or_a_named_error(plain, codings, cut, flip, chunked, chunk, cap):
    data = plain
    for c in codings:
        data = _ENCODE[c](data)
    data = _mangle(data, cut, flip)
    if chunked:
        data = _chunk(data, chunk, ext=chunk % 2 == 0)
    header = ", ".join("deflate" if c == "raw-deflate" else c for c in codings)
    try:
        out = decode_body(data, chunked=chunked, content_encoding=header, max_bytes=cap)
    except DecodeError as e:
        assert e.outcome.value in ("too_large", "bad_encoding", "bad_response")
        return
    assert len(out) <= cap
    if not cut and not flip:
        assert out == plain


@budget()
@given(st.binary(max_size=500), st.sampled_from(["gzip", "deflate", "br", "zstd", "identity", "compress",
                                                 "gzip, br", " GZIP ", ""]), st.booleans(), st.integers(1, 5000))
def test_garbage_never_raises_anything_else(data, coding, chunked, cap):
    try:
        out = decode_body(data, chunked=chunked, content_encoding=coding, max_bytes=cap)
    except DecodeError:
        return
    assert len(out) <= cap


@budget()
@given(st.lists(st.sampled_from([b"5\r\nhello\r\n", b"0\r\n\r\n", b"ffffffffffffffffffff\r\n", b"-1\r\n", b"\r\n",
                                 b"3;ext\r\nabc\r\n", b"2\nab\n", b"x\r\n", b"0\r\nTrailer: y\r\n\r\n"]),
                max_size=8), st.integers(1, 100))
def test_dechunk_never_raises_anything_else(parts, cap):
    try:
        out = dechunk(b"".join(parts), cap)
    except DecodeError:
        return
    assert len(out) <= cap
