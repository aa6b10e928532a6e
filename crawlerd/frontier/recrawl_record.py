"""The recrawl state of one URL as stored in the ``urls`` table (``crawlerd.frontier.recrawl``).

Value: ``_REC`` (due, fetched and captured ms, interval s, status, errors, flags, depth, then the
lengths of the five strings), then the URL, host key, ETag, Last-Modified and digest as UTF-8 with
surrogates kept (an absent one is empty).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAX_VALIDATOR_BYTES = 1024       # a longer ETag/Last-Modified is not stored (never sent truncated)
FLAG_OUT = 1                    # handed out by due(), not yet recorded
# due ms, fetched ms, captured ms, interval s, status, errors, flags, depth, then 5 string lengths
_REC = struct.Struct("<QQQdHBBHHHHHH")
_U16_MAX = 0xFFFF


@dataclass(slots=True)
class RecrawlState:
    """What recrawl knows about one URL (key: ``fp``). Times are wall-clock seconds."""

    fp: int
    url: str
    host_key: str
    depth: int
    due_at: float            # next visit (or, while handed out, when it is handed out again)
    fetched_at: float        # last recorded visit
    captured_at: float       # last visit that stored a payload (the capture ``digest`` belongs to)
    interval_s: float        # current nominal revisit interval, in [min_interval_s, max_interval_s]
    status: int              # HTTP status of the last visit
    errors: int              # consecutive errors and unanswered hand-outs
    handed_out: bool
    etag: str | None
    last_modified: str | None
    digest: str | None


def to_ms(t: float) -> int:
    if not t > 0:                # negative and NaN
        return 0
    return min(int(t * 1000.0), (1 << 64) - 1)


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def encode(st: RecrawlState, due_ms: int, fetched_ms: int, captured_ms: int) -> bytes:
    # each string as UTF-8 (surrogates kept: _dec reverses it), "" for None; inline, once per answer
    url = st.url.encode("utf-8", "surrogateescape")
    host = st.host_key.encode("utf-8", "surrogateescape")
    etag = b"" if st.etag is None else st.etag.encode("utf-8", "surrogateescape")
    lm = b"" if st.last_modified is None else st.last_modified.encode("utf-8", "surrogateescape")
    digest = b"" if st.digest is None else st.digest.encode("utf-8", "surrogateescape")
    return _REC.pack(due_ms, fetched_ms, captured_ms, st.interval_s, min(st.status, _U16_MAX),
                     min(st.errors, 255), FLAG_OUT if st.handed_out else 0, min(st.depth, _U16_MAX),
                     len(url), len(host), len(etag), len(lm), len(digest)) + url + host + etag + lm + digest


def decode(fp: int, raw: bytes) -> tuple[RecrawlState, int]:
    """Return the state and its due time in ms (the due-index key's time)."""
    due_ms, fetched_ms, captured_ms, interval, status, errors, flags, depth, *lens = _REC.unpack_from(raw)
    p = _REC.size
    out = []
    for n in lens:
        out.append(raw[p:p + n])
        p += n
    url, host, etag, lm, digest = out
    st = RecrawlState(fp, _dec(url), _dec(host), depth, due_ms / 1000.0, fetched_ms / 1000.0,
                      captured_ms / 1000.0, interval, status, errors, bool(flags & FLAG_OUT),
                      _dec(etag) if lens[2] else None, _dec(lm) if lens[3] else None,
                      _dec(digest) if lens[4] else None)
    return st, due_ms


def validator(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    if not v or len(v) > MAX_VALIDATOR_BYTES or "\r" in v or "\n" in v or "\0" in v:
        return None              # never echo a header we could not send back intact
    return v
