"""Request routing for the synthetic web: (host, method, target, conditional headers) -> Reply.

The transport (``server.py``) parses and writes; this module decides what each host answers.
Bodies come from ``pages.PageRenderer`` and are cached per (host, path) under a byte budget.
The only mutable state is a per-host request counter, which makes the rate-limited and flaky
hosts answer 429/503 on a fixed cadence (deterministic for a given request order), and the
session-id counter.
"""

from __future__ import annotations

import email.utils
import gzip
import json
import re
import struct
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import xxhash

from crawlerd.simweb import site as S
from crawlerd.simweb.farm import FARM_PAGES, ROLE_FARM
from crawlerd.simweb.pages import SID_MARK, PageRenderer
from crawlerd.simweb.text import ParagraphPool
from crawlerd.simweb.variants import Variants

ACTION_HOLD = "hold"     # say nothing until the client leaves or delay_s passes, then close
ACTION_RESET = "reset"   # abort the connection with a TCP RST (SO_LINGER 0)

HTML = "text/html; charset=utf-8"
_BASE_LAST_MODIFIED = 1704067200          # 2024-01-01T00:00:00Z
_DEPTH_RE = re.compile(r"^(?:/[ab])+/$")
_LEAF_PREFIXES = ("/private/open/", "/private/", "/nf/", "/mnf/", "/sm/")


@dataclass(slots=True)
class Reply:
    """One answer. ``action`` replaces the HTTP answer for hold/reset; ``delay_s`` postpones it."""
    status: int
    body: bytes = b""
    content_type: str = HTML
    headers: tuple[tuple[str, str], ...] = ()
    delay_s: float = 0.0
    action: str = ""
    retry_after_s: float | None = None


@dataclass(slots=True)
class Entity:
    """A cacheable representation: body plus its validators (RFC 9110 §8.8)."""
    body: bytes
    content_type: str
    etag: str
    last_modified: str
    last_modified_ts: int


def host_name(host_header: str) -> str:
    """The host a Host header names: port stripped, lower-cased, trailing dot dropped."""
    if host_header.startswith("["):                     # IPv6 literal
        return host_header.partition("]")[0] + "]"
    return host_header.rsplit(":", 1)[0].lower().rstrip(".")


def _canonical_int(s: str) -> int | None:
    """Non-negative decimal without leading zeros (so each page has one URL), else None."""
    if s.isdigit() and s.isascii() and (s == "0" or s[0] != "0") and len(s) < 10:
        return int(s)
    return None


def _png(k: int) -> bytes:
    """A valid 8x8 greyscale PNG whose pixels depend on k."""
    raw = b"".join(b"\x00" + bytes((k * 31 + x * 8 + y * 16) & 255 for x in range(8)) for y in range(8))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def _media(path: str, k: int) -> tuple[bytes, str] | None:
    if path.startswith("/img/") and path.endswith(".png"):
        return _png(k), "image/png"
    if path.startswith("/files/") and path.endswith(".txt"):
        return f"simweb notes {k}\n".encode() * 40, "text/plain; charset=utf-8"
    if path.startswith("/files/") and path.endswith(".pdf"):
        return (b"%PDF-1.4\n% simweb " + str(k).encode() + b"\n1 0 obj << /Type /Catalog >> endobj\n"
                b"trailer << /Root 1 0 R >>\n%%EOF\n"), "application/pdf"
    if path.startswith("/data/") and path.endswith(".json"):
        return json.dumps({"file": k, "values": list(range(k * 3))}).encode(), "application/json"
    return None


class Handler:
    """Decides every answer. Cache key: (host index, path key, gzip?); value: Entity.

    Invariant: the cache holds at most ``cache_bytes`` of bodies (least recently used evicted).
    """

    def __init__(self, site: S.Site, port: int, cache_bytes: int = 64 << 20, scheme: str = "http") -> None:
        self.site = site
        self.port = port
        self.scheme = scheme
        self.variants = Variants(site.seed, port)
        self.pages = PageRenderer(site, ParagraphPool(site.seed), port, self.variants, scheme)
        self.cache: OrderedDict[tuple, Entity] = OrderedDict()
        self.cache_bytes = cache_bytes
        self.cached_bytes = 0
        self.requests_by_host = [0] * len(site.hosts)
        self.sid_counter = 0

    # --- cache ---
    def _entity(self, key: tuple, render) -> Entity:
        ent = self.cache.get(key)
        if ent is not None:
            self.cache.move_to_end(key)
            return ent
        body, ctype = render()
        lm_ts = _BASE_LAST_MODIFIED + (zlib.crc32(repr((self.site.seed, key)).encode()) % 700) * 86400
        ent = Entity(body, ctype, f'"{xxhash.xxh64_hexdigest(body)}"',
                     email.utils.formatdate(lm_ts, usegmt=True), lm_ts)
        self.cache[key] = ent
        self.cached_bytes += len(body)
        while self.cached_bytes > self.cache_bytes and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.cached_bytes -= len(old.body)
        return ent

    def _gzipped(self, key: tuple, ent: Entity) -> Entity:
        gkey = key + ("gzip",)
        ent_gz = self.cache.get(gkey)
        if ent_gz is None:
            body = gzip.compress(ent.body, compresslevel=1, mtime=0)
            ent_gz = Entity(body, ent.content_type, ent.etag[:-1] + '-gz"', ent.last_modified,
                            ent.last_modified_ts)
            self.cache[gkey] = ent_gz
            self.cached_bytes += len(body)
        return ent_gz

    # --- answers ---
    @staticmethod
    def _conditional(ent: Entity, if_none_match: str, if_modified_since: str) -> bool:
        """True when a 304 is due (RFC 9110 §13.1.2, §13.1.3; INM takes precedence over IMS)."""
        if if_none_match:
            tags = [t.strip() for t in if_none_match.split(",")]
            return "*" in tags or any(t.removeprefix("W/") == ent.etag for t in tags)
        if if_modified_since:
            try:
                ims = email.utils.parsedate_to_datetime(if_modified_since).timestamp()
            except (TypeError, ValueError, IndexError, OverflowError):
                return False
            return ent.last_modified_ts <= ims
        return False

    def _serve(self, host: S.HostSpec, key: tuple, render, inm: str, ims: str, accept_gzip: bool) -> Reply:
        ent = self._entity((host.index,) + key, render)
        encoding: tuple[tuple[str, str], ...] = ()
        if host.gzip and accept_gzip and ent.content_type.startswith("text/"):
            ent = self._gzipped((host.index,) + key, ent)
            encoding = (("Content-Encoding", "gzip"),)
        vary = (("Vary", "Accept-Encoding"),) if host.gzip else ()
        validators = (("ETag", ent.etag), ("Last-Modified", ent.last_modified))
        if self._conditional(ent, inm, ims):
            # RFC 9110 §15.4.5: a 304 repeats the validators and Vary a 200 would carry
            return Reply(304, b"", "", validators + vary)
        return Reply(200, ent.body, ent.content_type, validators + encoding + vary)

    def _robots(self, host: S.HostSpec, path: str, authority: str) -> Reply:
        spec = host.robots
        if spec.variant == S.ROBOTS_TIMEOUT:
            return Reply(0, action=ACTION_HOLD, delay_s=S.ROBOTS_HOLD_S)
        if spec.variant == S.ROBOTS_RESET:
            return Reply(0, action=ACTION_RESET)
        if spec.variant == S.ROBOTS_REDIRECT and path != spec.paths[-1]:
            nxt = spec.paths[spec.paths.index(path) + 1]
            return Reply(301, b"moved\n", "text/plain", (("Location", f"{self.scheme}://{authority}{nxt}"),))
        if spec.variant == S.ROBOTS_ALLOW_ALL:
            # RFC 9309 §2.3.5 / sitemaps.org: an absolute Sitemap: line; the index points at a gzipped urlset
            text = spec.text + f"Sitemap: {self.scheme}://{authority}{S.SITEMAP_INDEX_PATH}\n"
            return Reply(200, text.encode(), "text/plain; charset=utf-8")
        if spec.status == 200 or spec.variant == S.ROBOTS_REDIRECT:
            return Reply(200, spec.text.encode(), "text/plain; charset=utf-8")
        return Reply(spec.status, f"robots.txt status {spec.status}\n".encode(), "text/plain")

    def _sitemap(self, host: S.HostSpec, path: str) -> Reply:
        """Sitemap index -> one gzipped urlset of /sm/k.html pages, which nothing else links to."""
        base = f"{self.scheme}://{host.name}:{self.port}"
        if path == S.SITEMAP_INDEX_PATH:
            body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                    '<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
                    f"<sitemap><loc>{base}{S.SITEMAP_URLSET_PATH}</loc></sitemap>\n</sitemapindex>\n")
            return Reply(200, body.encode(), "application/xml")
        urls = "".join(f"<url><loc>{base}/sm/{k}.html</loc><lastmod>2026-11-01</lastmod></url>\n"
                       for k in range(S.LEAF_PAGES))
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n{urls}</urlset>\n')
        return Reply(200, gzip.compress(body.encode(), mtime=0), "application/gzip")

    def not_found(self) -> Reply:
        return Reply(404, b"<!DOCTYPE html>\n<html><body><h1>404 Not Found</h1></body></html>\n")

    def handle(self, host_header: str, target: str, inm: str = "", ims: str = "",
               accept_gzip: bool = False) -> tuple[S.HostSpec | None, Reply]:
        """Route one request. ``host_header`` is the Host header as sent (port included)."""
        host = self.site.by_name.get(host_name(host_header))
        if host is None:
            return None, Reply(421, b"misdirected: unknown host\n", "text/plain")  # RFC 9110 §15.5.20
        path, _, query = target.partition("?")
        if path in host.robots.paths:
            return host, self._robots(host, path, host_header)
        n = self.requests_by_host[host.index]
        self.requests_by_host[host.index] = n + 1
        if host.role == S.ROLE_RATE_LIMITED and n % S.RATE_LIMIT_EVERY == 1:
            return host, Reply(429, b"slow down\n", "text/plain", (("Retry-After", str(S.RETRY_AFTER_S)),),
                               retry_after_s=float(S.RETRY_AFTER_S))
        if host.role == S.ROLE_FLAKY and n % S.FLAKY_EVERY == 2:
            return host, Reply(503, b"try later\n", "text/plain")
        reply = self._route(host, path, query, inm, ims, accept_gzip)
        if host.role == S.ROLE_SLOW:
            lo, hi = S.SLOW_DELAY_RANGE_S
            reply.delay_s = lo + (zlib.crc32(target.encode()) % 1001) / 1000 * (hi - lo)
        return host, reply

    def _route(self, host: S.HostSpec, path: str, query: str, inm: str, ims: str, gz: bool) -> Reply:
        pages = self.pages
        if host.role == ROLE_FARM:                                          # endless farm pages (farm.py)
            k = -1 if path == "/" else _canonical_int(path[3:-5]) if path.startswith("/f/") and path.endswith(
                ".html") else None
            if k is None or k >= FARM_PAGES:
                return self.not_found()
            return self._serve(host, ("f", k), lambda: (pages.farm.farm_page(pages, host, k), HTML), inm, ims, gz)
        if host.variants:           # URL variants of /p/ pages (simweb.variants)
            v = self.variants.route(pages, host, path, query)
            if v is not None:
                key, render = v
                if key is None:      # a session's page: not cached, no validators
                    return Reply(200, render, HTML, (("Cache-Control", "no-store"),))
                return self._serve(host, key, lambda: (render(), HTML), inm, ims, gz)
        if path == "/":
            return self._serve(host, ("/",), lambda: (pages.root(host), HTML), inm, ims, gz)
        if path.startswith("/p/") and path.endswith(".html") and host.role not in (
                S.ROLE_TRAP_CALENDAR, S.ROLE_TRAP_DEPTH):
            k = _canonical_int(path[3:-5])
            if k is None or k >= host.pages:
                return self.not_found()
            if host.role == S.ROLE_TRAP_SESSION:
                ent = self._entity((host.index, "p", k), lambda: (pages.page(host, k), HTML))
                self.sid_counter += 1
                sid = xxhash.xxh64_hexdigest(self.sid_counter.to_bytes(8, "little"), seed=self.site.seed)
                return Reply(200, ent.body.replace(SID_MARK, sid.encode()), HTML,
                             (("Cache-Control", "no-store"),))
            return self._serve(host, ("p", k), lambda: (pages.page(host, k), HTML), inm, ims, gz)
        for prefix in _LEAF_PREFIXES:
            if path.startswith(prefix) and path.endswith(".html"):
                k = _canonical_int(path[len(prefix):-5])
                if k is None or k >= S.LEAF_PAGES:
                    return self.not_found()
                return self._serve(host, (prefix, k), lambda p=prefix, k=k: (pages.leaf(host, p, k), HTML),
                                   inm, ims, gz)
        if host.robots.variant == S.ROBOTS_ALLOW_ALL and path in (S.SITEMAP_INDEX_PATH, S.SITEMAP_URLSET_PATH):
            return self._sitemap(host, path)
        if path.startswith("/r/"):
            k = _canonical_int(path[3:])
            if k is None or k >= host.pages:
                return self.not_found()
            return Reply(301, b"moved\n", "text/plain", (("Location", f"/p/{k}.html"),))
        if path.startswith(("/img/", "/files/", "/data/")):
            stem = path.rsplit("/", 1)[1].split(".", 1)[0]
            k = _canonical_int(stem)
            media = _media(path, k) if k is not None and k < S.MEDIA_FILES else None
            if media is None:
                return self.not_found()
            return self._serve(host, ("m", path), lambda: media, inm, ims, gz)
        if host.role == S.ROLE_TRAP_CALENDAR and path == "/cal":
            params = dict(p.partition("=")[::2] for p in query.split("&"))
            y, m = _canonical_int(params.get("y", "")), _canonical_int(params.get("m", ""))
            if y is None or m is None or not (1 <= y <= 9999 and 1 <= m <= 12):
                return self.not_found()
            return self._serve(host, ("cal", y, m), lambda: (pages.calendar(host, y, m), HTML), inm, ims, gz)
        if host.role == S.ROLE_TRAP_DEPTH and _DEPTH_RE.match(path):
            return self._serve(host, ("d", path), lambda: (pages.depth(host, path), HTML), inm, ims, gz)
        return self.not_found()
