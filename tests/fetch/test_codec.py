"""Capped body decoding: chunked framing and content codings, including bombs."""

import gzip
import tracemalloc
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from crawlerd.fetch.codec import DecodeError, dechunk, decode_body, decode_content
from crawlerd.outcome import Outcome


def chunk(payload: bytes, sizes: list[int]) -> bytes:
    out, pos = [], 0
    for n in sizes:
        if pos >= len(payload):
            break
        piece = payload[pos:pos + max(n, 1)]
        out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        pos += len(piece)
    if pos < len(payload):
        out.append(b"%x\r\n%s\r\n" % (len(payload) - pos, payload[pos:]))
    out.append(b"0\r\n\r\n")
    return b"".join(out)


# -- chunked ---------------------------------------------------------------

def test_dechunk_basic_with_extensions_and_trailers():
    raw = b"4\r\nWiki\r\n5;name=val\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nExpires: never\r\n\r\n"
    assert dechunk(raw, 1000) == b"Wikipedia in\r\n\r\nchunks."


def test_dechunk_tolerates_bare_lf_and_missing_final_crlf():
    assert dechunk(b"3\nabc\n0\n", 100) == b"abc"
    assert dechunk(b"3\r\nabc\r\n0\r\n", 100) == b"abc"
    assert dechunk(b"0\r\n\r\n", 100) == b""


@pytest.mark.parametrize("raw", [
    b"zz\r\nhello\r\n0\r\n\r\n",             # not hex
    b"\r\nhello\r\n0\r\n\r\n",               # empty size
    b"-5\r\nhello\r\n0\r\n\r\n",             # sign
    b"5\r\nhelloXX0\r\n\r\n",                # no CRLF after data
    b"a\r\nshort\r\n",                       # short chunk
    b"5\r\nhello\r\n",                       # no last chunk
    b"ffffffffffffffffff\r\n",               # absurd size
    b"",
])
def test_dechunk_rejects_bad_framing(raw):
    with pytest.raises(DecodeError) as e:
        dechunk(raw, 1 << 20)
    assert e.value.outcome is Outcome.BAD_RESPONSE


def test_dechunk_cap_is_checked_before_copying():
    raw = b"10000000\r\n"                     # declares 256 MiB, carries nothing
    with pytest.raises(DecodeError) as e:
        dechunk(raw, 1 << 20)
    assert e.value.outcome is Outcome.TOO_LARGE


@given(st.binary(max_size=3000), st.lists(st.integers(1, 700), max_size=12))
def test_dechunk_roundtrip(payload, sizes):
    assert dechunk(chunk(payload, sizes), len(payload)) == payload


@given(st.binary(min_size=1, max_size=500))
def test_dechunk_cap_one_below_payload_is_too_large(payload):
    with pytest.raises(DecodeError) as e:
        dechunk(chunk(payload, [7]), len(payload) - 1)
    assert e.value.outcome is Outcome.TOO_LARGE


# -- content codings -----------------------------------------------------------

PAYLOAD = b"<html>" + b"crawl " * 5000 + b"</html>"


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(("coding", "encoded"), [
    ("gzip", gzip.compress(PAYLOAD)),
    ("x-gzip", gzip.compress(PAYLOAD)),
    ("GZIP", gzip.compress(PAYLOAD)),
    ("deflate", zlib.compress(PAYLOAD)),
    ("deflate", raw_deflate(PAYLOAD)),
    ("br", brotli.compress(PAYLOAD)),
    ("zstd", zstandard.ZstdCompressor().compress(PAYLOAD)),
    ("identity", PAYLOAD),
])
def test_decode_each_coding(coding, encoded):
    assert decode_body(encoded, chunked=False, content_encoding=coding, max_bytes=len(PAYLOAD)) == PAYLOAD


def test_gzip_multi_member():
    data = gzip.compress(b"abc") + gzip.compress(b"def")
    assert decode_content(data, "gzip", 100) == b"abcdef"


def test_stacked_codings_are_undone_in_reverse_order():
    data = brotli.compress(gzip.compress(PAYLOAD))     # gzip applied first, then br
    assert decode_body(data, chunked=False, content_encoding="gzip, br", max_bytes=len(PAYLOAD)) == PAYLOAD


def test_chunked_then_gzip():
    body = chunk(gzip.compress(PAYLOAD), [100, 1000, 5])
    assert decode_body(body, chunked=True, content_encoding="gzip", max_bytes=len(PAYLOAD)) == PAYLOAD


@pytest.mark.parametrize(("coding", "encoded"), [
    ("gzip", gzip.compress(PAYLOAD)[:-20]),
    ("gzip", b"\x1f\x8b\x08\x00garbage-garbage"),
    ("deflate", b"\x78\x9c" + b"\xff" * 30),
    ("br", brotli.compress(PAYLOAD)[:-3]),
    ("br", b"\xff\xff\xff\xff not brotli"),
    ("zstd", b"\x28\xb5\x2f\xfd\x00 junk"),
    ("compress", b"whatever"),
])
def test_corrupt_or_unknown_coding_is_bad_encoding(coding, encoded):
    with pytest.raises(DecodeError) as e:
        decode_body(encoded, chunked=False, content_encoding=coding, max_bytes=1 << 20)
    assert e.value.outcome is Outcome.BAD_ENCODING


def test_identity_over_cap_is_too_large():
    with pytest.raises(DecodeError) as e:
        decode_body(b"x" * 101, chunked=False, content_encoding=None, max_bytes=100)
    assert e.value.outcome is Outcome.TOO_LARGE


def test_exactly_at_cap_is_fine():
    assert decode_content(gzip.compress(b"y" * 4096), "gzip", 4096) == b"y" * 4096
    assert decode_content(brotli.compress(b"y" * 4096), "br", 4096) == b"y" * 4096


# -- bombs: a small body that expands without limit ends at the cap, with bounded memory --

BOMB_BYTES = 64 << 20
CAP = 1 << 20


def _gzip_bomb() -> bytes:
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    z = bytes(1 << 20)
    return b"".join([co.compress(z) for _ in range(BOMB_BYTES >> 20)] + [co.flush()])


def _br_bomb() -> bytes:
    c = brotli.Compressor(quality=5)
    z = bytes(1 << 20)
    return b"".join([c.process(z) for _ in range(BOMB_BYTES >> 20)] + [c.finish()])


@pytest.mark.parametrize(("coding", "make"), [
    ("gzip", _gzip_bomb),
    ("br", _br_bomb),
    ("deflate", lambda: zlib.compress(bytes(BOMB_BYTES), 9)),
    ("zstd", lambda: zstandard.ZstdCompressor().compress(bytes(BOMB_BYTES))),
])
def test_bomb_stops_at_cap_with_bounded_memory(coding, make):
    bomb = make()
    assert len(bomb) < BOMB_BYTES // 100
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError) as e:
            decode_body(bomb, chunked=False, content_encoding=coding, max_bytes=CAP)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.outcome is Outcome.TOO_LARGE
    assert peak < 4 * CAP, f"peak {peak} bytes while decoding a {coding} bomb with a {CAP}-byte cap"
