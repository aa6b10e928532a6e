"""Plain records the stages exchange (ARCHITECTURE.md "Module map": stages never import each other).

The fetcher returns a :class:`FetchResult`; the shard hands it to processing,
which returns a :class:`ProcessResult`. Both are plain data so they can cross
a process boundary (pickle) cheaply. A page's outlinks are :class:`Link` records, a native
type (``crawlerd._native.linkrec``: built in C, not tracked by the cyclic collector; its
reference is the dataclass in ``linkrec_ref``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from crawlerd._native.linkrec import Link  # a page's outlink (url, fp, host_key, nofollow)
from crawlerd._native.linkrec import followed as followed_links  # noqa: F401  (re-export: a page's links to follow, their hosts)
from crawlerd.outcome import Outcome


@dataclass(slots=True)
class FetchRequest:
    url: str                    # absolute, normalised http(s) URL
    ip: str                     # address to connect to (pinned into curl)
    port: int                   # port to connect to
    headers: list[tuple[str, str]] = field(default_factory=list)  # extra request headers (conditional GET)
    max_body_bytes: int | None = None   # per-request override of the raw body cap
    keep_alive: bool = True     # keep the connection for the host's next request (False: close after)


@dataclass(slots=True)
class FetchResult:
    url: str
    outcome: Outcome
    status: int = 0                      # HTTP status, 0 when no answer
    ip: str = ""
    started_at: float = 0.0              # wall-clock seconds (time.time()) when the transfer began
    elapsed_s: float = 0.0               # transfer duration, seconds (politeness input)
    request_head: bytes = b""            # request line + headers exactly as sent
    response_head: bytes = b""           # status line + headers exactly as received (final response)
    body: bytes = b""                    # body bytes exactly as received (transfer/content coding kept)
    headers: list[tuple[str, str]] = field(default_factory=list)  # parsed response headers, in order
    error: str = ""                      # human-readable detail for non-ok outcomes
    # the body in the fetch body pool (crawlerd._native.bodypool.PooledBody) instead of ``body``
    # (then b""): read it with ``content()``, its length with ``size``. Never crosses a process.
    pooled: object = None

    @property
    def size(self) -> int:
        """The body's length in bytes, wherever it is."""
        return len(self.body) if self.pooled is None else self.pooled.size

    def content(self) -> bytes:
        """The body as bytes (a pooled body is copied out: for what the crawl loop parses itself)."""
        return self.body if self.pooled is None else self.pooled.read()

    @property
    def chunked(self) -> bool:
        """The body still carries chunked transfer coding (curl keeps it, for the WARC record)."""
        te = self.header("transfer-encoding")
        return bool(te) and "chunked" in te.lower()

    def header(self, name: str) -> str | None:
        """First value of a response header, case-insensitive."""
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None


@dataclass(slots=True)
class PriorCapture:
    """An archived capture a new one is a revisit of (WARC/1.1 §6.7): the first capture of the
    same payload (identical payload digest), or the capture a 304 confirms (server not modified)."""

    url: str                    # its WARC-Target-URI
    fetched_at: float           # its WARC-Date, wall-clock seconds
    record_id: str = ""         # its WARC-Record-ID (urn:uuid:...), "" when not known
    digest: str = ""            # its payload digest "sha1:BASE32", "" when not known


@dataclass(slots=True)
class ProcessResult:
    url: str
    outcome: Outcome
    status: int = 0
    links: list[Link] = field(default_factory=list)
    content_type: str = ""
    digest: str = ""                     # "sha1:BASE32" of the decoded payload
    simhash: int = 0
    noindex: bool = False
    nofollow: bool = False
    warc_file: str = ""
    warc_offset: int = -1
    warc_length: int = 0
    warc_record_id: str = ""             # WARC-Record-ID of the response or revisit record
    duplicate_of: str = ""               # exact duplicate: URL that first had this payload digest
    near_duplicate_of: str = ""          # simhash within distance: a URL that had a near-identical text
    error: str = ""
    canonical: str = ""                  # declared rel=canonical (HTML link or Link header), normalised
    storage_error: str = ""              # "<kind>: <dir>" when the WARC could not be written: not archived
    # a sitemap job's reading (worker.read_sitemap): ([(url, lastmod or None)], child sitemaps,
    # URLs rejected, "undecodable" or ""); None for every other job
    sitemap: tuple | None = None
