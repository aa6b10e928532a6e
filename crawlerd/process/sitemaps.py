"""Sitemaps (sitemaps.org protocol 0.9): XML ``urlset``, sitemap index, RSS/Atom feeds, plain
text, each possibly gzipped.

``parse_sitemap`` never raises on bad input: what could be read is returned, and what went wrong
is listed in ``errors``. Bounds: at most ``max_bytes`` are read (after gunzip, so a gzip bomb
stops at the cap), at most ``max_urls`` URLs (or child sitemaps) are kept. XML is parsed by
expat as a stream; a DOCTYPE is refused outright, so no entity is ever declared or expanded
(billion laughs, external entities).

Protocol rules applied (sitemaps.org, "Sitemap file location"): a URL is kept only if it has
the sitemap's scheme and authority and lies under the sitemap's directory; a child of a sitemap
index only needs the same scheme and authority ("same site"). URLs of 2048 characters or more
are refused, as the protocol allows less than 2,048.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from urllib.parse import urlsplit
from xml.parsers import expat

from crawlerd.fetch.codec import DecodeError, decode_body
from crawlerd.records import FetchResult
from crawlerd.url.canonical import fingerprint, normalize

__all__ = ["Sitemap", "SitemapURL", "parse_sitemap", "read_sitemap"]

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_URL_CHARS = 2047
_MAX_TEXT_CHARS = 8192          # text kept per element: a <loc> longer than this is refused anyway
_CHUNK = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}

# W3C Datetime (https://www.w3.org/TR/NOTE-datetime), the format of <lastmod>.
_W3C_DATETIME = re.compile(
    r"(\d{4})(?:-(\d\d)(?:-(\d\d)(?:[Tt ](\d\d):(\d\d)(?::(\d\d)(?:[.,](\d+))?)?"
    r"[ ]*([Zz]|[+-]\d\d:?\d\d)?)?)?)?")


@dataclass(slots=True)
class SitemapURL:
    url: str                        # as written in the sitemap (whitespace trimmed)
    lastmod: float | None = None    # POSIX seconds (UTC); None if absent or unreadable
    priority: float | None = None   # 0.0 .. 1.0; None if absent or invalid (the protocol default is 0.5)


@dataclass(slots=True)
class Sitemap:
    urls: list[SitemapURL] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)   # children of a sitemap index
    errors: list[str] = field(default_factory=list)     # what was wrong, one line each
    rejected: int = 0               # URLs dropped: other site, outside the directory, not http(s), too long


class _Stop(Exception):
    """Ends the expat stream early (limit reached or DOCTYPE refused)."""


def parse_sitemap(data: bytes, sitemap_url: str, *, max_urls: int = 50_000,
                  max_bytes: int = 50 * 1024 * 1024) -> Sitemap:
    """Parse one sitemap document fetched from ``sitemap_url``."""
    out = Sitemap()
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip(data, max_bytes, out.errors)
    elif len(data) > max_bytes:
        out.errors.append(f"larger than {max_bytes} bytes: rest ignored")
        data = data[:max_bytes]
    scope = _Scope(sitemap_url)
    if scope.error:
        out.errors.append(scope.error)
        return out
    head = data[:64].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head[:1] == b"<" or data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        _parse_xml(data, scope, max_urls, out)
    else:
        _parse_text(data, scope, max_urls, out)
    return out


def read_sitemap(res: FetchResult, max_urls: int, max_bytes: int) -> tuple:
    """A fetched sitemap's reading, as it crosses back from a worker: ``([(normalised url,
    fingerprint, lastmod or None)], child sitemaps, URLs rejected, "undecodable" or "")``; nothing
    for an answer other than 200. A URL the normaliser refuses counts as rejected."""
    if res.status != 200:
        return [], [], 0, ""
    try:
        body = decode_body(res.content(), chunked=res.chunked, content_encoding=res.header("content-encoding"),
                           max_bytes=max_bytes)
    except DecodeError:
        return [], [], 0, "undecodable"
    parsed = parse_sitemap(body, res.url, max_urls=max_urls, max_bytes=max_bytes)
    urls, rejected = [], parsed.rejected
    for u in parsed.urls:
        norm = normalize(u.url)
        if norm is None:
            rejected += 1
        else:
            urls.append((norm, fingerprint(norm), u.lastmod))
    return urls, parsed.sitemaps, rejected, ""


def _gunzip(data: bytes, max_bytes: int, errors: list[str]) -> bytes:
    """Decompress gzip member(s), never producing more than ``max_bytes``."""
    parts: list[bytes] = []
    total = 0
    rest = data
    try:
        while rest[:2] == _GZIP_MAGIC:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            chunk = d.decompress(rest, max_bytes + 1 - total)
            parts.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                errors.append(f"gzip expands past {max_bytes} bytes: rest ignored")
                break
            if not d.eof:
                errors.append("gzip data truncated")
                break
            rest = d.unused_data
    except zlib.error as exc:
        errors.append(f"bad gzip data: {exc}")
    return b"".join(parts)[:max_bytes]


class _Scope:
    """Where URLs of one sitemap may point: key (scheme, host, port) and directory prefix.

    Invariant: ``error`` is empty iff the sitemap URL itself is an absolute http(s) URL.
    """

    __slots__ = ("site", "directory", "error")

    def __init__(self, sitemap_url: str) -> None:
        self.site, path = _site_and_path(sitemap_url)
        self.directory = path[:path.rfind("/") + 1] or "/"
        self.error = "" if self.site is not None else f"sitemap URL is not absolute http(s): {sitemap_url!r}"

    def url_ok(self, url: str) -> bool:
        if len(url) > _MAX_URL_CHARS:
            return False
        site, path = _site_and_path(url)
        return site is not None and site == self.site and path.startswith(self.directory)

    def child_ok(self, url: str) -> bool:
        return len(url) <= _MAX_URL_CHARS and _site_and_path(url)[0] == self.site


def _site_and_path(url: str) -> tuple[tuple | None, str]:
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port
    except ValueError:
        return None, ""
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None, ""
    return (scheme, parts.hostname.lower().rstrip("."), port or _DEFAULT_PORTS[scheme]), parts.path or "/"


def _parse_text(data: bytes, scope: _Scope, max_urls: int, out: Sitemap) -> None:
    """Plain-text sitemap: one URL per line (UTF-8)."""
    for line in data.decode("utf-8-sig", "replace").splitlines():
        url = line.strip()
        if not url:
            continue
        if len(out.urls) >= max_urls:
            out.errors.append(f"more than {max_urls} URLs: rest ignored")
            return
        if scope.url_ok(url):
            out.urls.append(SitemapURL(url))
        else:
            out.rejected += 1


class _XmlState:
    """Expat callbacks for one document.

    Key: the element path ``stack`` (local names, namespace prefixes dropped). Invariants:
    ``record`` is not None exactly while inside an entry element (``url``, ``sitemap``, RSS
    ``item``, Atom ``entry``) that opened at depth ``record_depth``; ``text`` is not None
    exactly while inside one of its field elements (a direct child, opened at ``text_depth``)
    and holds at most about ``_MAX_TEXT_CHARS`` characters of it.
    """

    # root element -> (entry element, depth of the entry, fields read from its children)
    _LAYOUT = {
        "urlset": ("url", 2, frozenset({"loc", "lastmod", "priority"})),
        "sitemapindex": ("sitemap", 2, frozenset({"loc"})),
        "rss": ("item", 3, frozenset({"link"})),          # rss/channel/item/link
        "feed": ("entry", 2, frozenset()),                # Atom: feed/entry/link@href
    }

    def __init__(self, scope: _Scope, max_urls: int, out: Sitemap) -> None:
        self.scope, self.max_urls, self.out = scope, max_urls, out
        self.stack: list[str] = []
        self.kind: str | None = None            # root element: urlset, sitemapindex, rss or feed
        self.entry, self.entry_depth, self.fields = "", 0, frozenset()
        self.record: dict[str, str] | None = None
        self.text: list[str] | None = None
        self.text_len = 0

    def start(self, name: str, attrs: dict[str, str]) -> None:
        local = name.rpartition(":")[2]
        self.stack.append(local)
        depth = len(self.stack)
        if depth == 1:
            if local not in self._LAYOUT:
                self.out.errors.append(f"not a sitemap: root element <{name}>")
                raise _Stop
            self.kind = local
            self.entry, self.entry_depth, self.fields = self._LAYOUT[local]
        elif self.record is None:
            if depth == self.entry_depth and local == self.entry:
                self.record = {}
        elif depth == self.entry_depth + 1 and self.text is None:
            if local in self.fields:
                self.text, self.text_len = [], 0
            elif self.kind == "feed" and local == "link":
                # the alternate (default) link of an Atom entry is the page
                if attrs.get("rel", "alternate") == "alternate" and attrs.get("href"):
                    self.record.setdefault("loc", attrs["href"].strip())

    def data(self, chunk: str) -> None:
        if self.text is not None and self.text_len < _MAX_TEXT_CHARS:
            self.text.append(chunk)
            self.text_len += len(chunk)

    def end(self, name: str) -> None:
        depth = len(self.stack)
        local = self.stack.pop()
        if self.record is None:
            return
        if self.text is not None and depth == self.entry_depth + 1:
            self.record.setdefault("loc" if local == "link" else local, "".join(self.text).strip())
            self.text = None
        elif depth == self.entry_depth:
            record, self.record = self.record, None
            self._emit(record)

    def _emit(self, record: dict[str, str]) -> None:
        loc = record.get("loc", "")
        out = self.out
        if not loc:
            out.rejected += 1
            return
        if self.kind == "sitemapindex":
            if len(out.sitemaps) >= self.max_urls:
                out.errors.append(f"more than {self.max_urls} sitemaps: rest ignored")
                raise _Stop
            if self.scope.child_ok(loc):
                out.sitemaps.append(loc)
            else:
                out.rejected += 1
            return
        if len(out.urls) >= self.max_urls:
            out.errors.append(f"more than {self.max_urls} URLs: rest ignored")
            raise _Stop
        if not self.scope.url_ok(loc):
            out.rejected += 1
            return
        out.urls.append(SitemapURL(loc, _parse_lastmod(record.get("lastmod")),
                                   _parse_priority(record.get("priority"))))


def _refuse_doctype(*_args) -> None:
    raise _Stop("DOCTYPE")


def _parse_xml(data: bytes, scope: _Scope, max_urls: int, out: Sitemap) -> None:
    state = _XmlState(scope, max_urls, out)
    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.buffer_text = True
    parser.StartDoctypeDeclHandler = _refuse_doctype      # no DTD: no entity can be declared
    parser.EntityDeclHandler = _refuse_doctype
    parser.StartElementHandler = state.start
    parser.EndElementHandler = state.end
    parser.CharacterDataHandler = state.data
    try:
        for pos in range(0, len(data), _CHUNK):
            parser.Parse(data[pos:pos + _CHUNK], False)
        parser.Parse(b"", True)
    except _Stop as stop:
        if stop.args and stop.args[0] == "DOCTYPE":
            out.errors.append("DOCTYPE refused (entity expansion is not allowed)")
    except expat.ExpatError as exc:
        out.errors.append(f"malformed XML at line {exc.lineno}, column {exc.offset}: "
                          f"{expat.ErrorString(exc.code)}")
    if state.kind is None and not out.errors:
        out.errors.append("no XML root element")


def _parse_lastmod(value: str | None) -> float | None:
    if not value:
        return None
    m = _W3C_DATETIME.fullmatch(value.strip())
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, tz = m.groups()
    try:
        tzinfo = UTC
        if tz and tz not in "Zz":
            sign = -1 if tz[0] == "-" else 1
            digits = tz[1:].replace(":", "")
            tzinfo = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
        stamp = datetime(int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
                         int(second or 0), tzinfo=tzinfo).timestamp()
    except ValueError:          # month 13, hour 25, offset of 24 h or more ...
        return None
    if frac:
        stamp += int(frac[:6]) / 10 ** len(frac[:6])
    return stamp


def _parse_priority(value: str | None) -> float | None:
    if not value:
        return None
    try:
        p = float(value)
    except ValueError:
        return None
    return p if math.isfinite(p) and 0.0 <= p <= 1.0 else None
