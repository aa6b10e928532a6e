"""Processing one fetched response: decode, parse, extract links, digest, simhash, WARC.

:class:`PageProcessor` is stateless apart from its WARC writer, so it runs the
same in the crawl process or in a worker process of the pool. Exact-duplicate
and near-duplicate decisions belong to one global owner; the processor asks
through two callbacks (``digest_seen``, ``near_duplicate``) so it does not
care where that owner lives.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from crawlerd._native.simhash import simhash as simhash64
from crawlerd.fetch.codec import DecodeError, dechunk, decode_body
from crawlerd.outcome import Outcome
from crawlerd.process.html import canonical_from_link_header, extract, parse_x_robots_tag
from crawlerd.process.links import links_from_page
from crawlerd.records import FetchResult, Link, PriorCapture, ProcessResult
from crawlerd.store.encoding import payload_digest
from crawlerd.store.warc import IDENTICAL_PAYLOAD_PROFILE, NOT_MODIFIED_PROFILE, WarcWriter

HTML_TYPES = ("text/html", "application/xhtml+xml")
# response headers analyse reads (the first value of each), in one pass over them
_READ_HEADERS = frozenset({"content-type", "content-encoding", "transfer-encoding", "link"})

DigestSeen = Callable[[str, str, float], "PriorCapture | tuple[str, float] | None"]
NearDuplicate = Callable[[int, str], str]


_ASK = object()     # process(prior=_ASK): ask the digest_seen callback for the duplicate owner

# glibc malloc tuning (mallopt parameters from <malloc.h>), see tune_allocator().
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 4 << 20     # blocks this large are mmap'd, and unmapped when freed
TRIM_THRESHOLD_BYTES = 16 << 20    # free heap top kept for the next page instead of returned
_tuned: bool | None = None


def tune_allocator() -> bool:
    """Fix glibc malloc's mmap and trim thresholds in this process (once); True if applied.

    Parsing a page makes lexbor allocate and free a few blocks of 256 KiB to 1 MiB.
    glibc's adaptive thresholds hand those back to the kernel (munmap, or a heap trim)
    and the next page faults them in again: about 12 page faults per page, a quarter
    of extract()'s CPU. Fixed thresholds keep them in the heap. Memory stays bounded:
    blocks of MMAP_THRESHOLD_BYTES and more (from a very large page) still go back at
    free, and at most TRIM_THRESHOLD_BYTES of free heap top is kept. Process-wide, so
    PageProcessor calls it: it is made for the worker processes. Other C libraries: no-op.
    """
    global _tuned
    if _tuned is None:
        _tuned = False
        try:
            glibc = os.confstr("CS_GNU_LIBC_VERSION")
        except (ValueError, OSError):
            glibc = None
        if glibc and glibc.startswith("glibc"):
            try:
                mallopt = ctypes.CDLL(None).mallopt     # the process's own C library
            except (OSError, AttributeError):
                return _tuned
            _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
                bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _tuned


def entity_digest(res: FetchResult) -> str:
    """WARC-Payload-Digest of a response: the entity with transfer coding removed (content coding kept)."""
    body = res.content()        # the crawl loop asks this of a pooled body (a copy) with several shards
    try:
        return payload_digest(dechunk(body, len(body) + 1) if res.chunked else body)
    except DecodeError:
        return payload_digest(body)


@dataclass(slots=True)
class Analysis:
    """One response parsed, nothing written yet: what :meth:`PageProcessor.archive` needs.
    ``asks_near``: the page has text, so the near-duplicate owner is asked before archiving."""

    res: FetchResult
    pr: ProcessResult
    prior: PriorCapture | None
    outlinks: list[Link] = field(default_factory=list)    # every link found, nofollow marked (metadata)
    robots_meta: tuple[bool, bool] = (False, False)         # (noindex, nofollow) from the page itself
    asks_near: bool = False
    robots_tags: list[str] = field(default_factory=list)    # X-Robots-Tag header values, in order


class PageProcessor:
    """Turns a FetchResult into a ProcessResult and its WARC records; constructing one tunes the
    process's allocator for parsing (:func:`tune_allocator`).

    Two steps, so that the near-duplicate decision is made before anything is written and the
    capture's metadata record can say it: :meth:`analyse` (parse, links, digest, simhash)
    and :meth:`archive` (request, response or revisit, metadata). :meth:`process` does both,
    asking the ``near_duplicate`` callback in between."""

    def __init__(self, warc: WarcWriter, *, agent_token: str, max_decoded_bytes: int, max_links: int,
                 digest_seen: DigestSeen | None = None, near_duplicate: NearDuplicate | None = None):
        self.warc = warc
        self.agent_token = agent_token
        self.max_decoded_bytes = max_decoded_bytes
        self.max_links = max_links
        self.digest_seen = digest_seen
        self.near_duplicate = near_duplicate
        tune_allocator()

    def process(self, res: FetchResult, prior=_ASK, digest: str = "") -> ProcessResult:
        """Process one response. ``prior`` is the capture it revisits (:class:`PriorCapture`, or a
        (url, date) pair): for a 200, the exact-duplicate owner of its digest; for a 304, the
        capture it confirms; None when there is none. When not given, ``digest_seen`` is asked.
        ``digest``: the payload digest if the caller computed it (``entity_digest``)."""
        a = self.analyse(res, prior, digest)
        near = ""
        if a.asks_near and self.near_duplicate is not None:
            near = self.near_duplicate(a.pr.simhash, res.url)
        return self.archive(a, near)

    def analyse(self, res: FetchResult, prior=_ASK, digest: str = "") -> Analysis:
        """Parse one response (see :meth:`process`); writes nothing."""
        url = res.url
        first: dict[str, str] = {}      # as res.header(name) gives them (FetchResult), one pass
        robots_tags: list[str] = []
        for k, v in res.headers:
            k = k.lower()
            if k in _READ_HEADERS:
                first.setdefault(k, v)
            elif k == "x-robots-tag":
                robots_tags.append(v)
        content_type = first.get("content-type")
        ctype = (content_type or "").split(";", 1)[0].strip().lower()
        pr = ProcessResult(url=url, outcome=Outcome.OK, status=res.status, content_type=ctype)
        a = Analysis(res=res, pr=pr, prior=None, robots_tags=robots_tags)
        # the WARC payload is the entity with transfer coding removed (content coding kept)
        te = first.get("transfer-encoding")
        try:
            entity = dechunk(res.body, len(res.body) + 1) if te and "chunked" in te.lower() else res.body
        except DecodeError as e:
            entity = res.body
            pr.outcome, pr.error = e.outcome, str(e)
        pr.digest = digest or payload_digest(entity)
        noindex, nofollow = parse_x_robots_tag(robots_tags, self.agent_token) if robots_tags else (False, False)
        if pr.outcome is Outcome.OK and res.status == 200 and ctype in HTML_TYPES:
            try:    # from the entity: the chunked framing is already gone (no second pass)
                body = decode_body(entity, chunked=False, content_encoding=first.get("content-encoding"),
                                   max_bytes=self.max_decoded_bytes)
            except DecodeError as e:
                pr.outcome, pr.error = e.outcome, str(e)
            else:
                info = extract(body, url, agent_token=self.agent_token, max_links=self.max_links,
                               content_type=content_type)
                a.robots_meta = (info.noindex, info.nofollow)
                noindex = noindex or info.noindex
                nofollow = nofollow or info.nofollow
                a.outlinks = links_from_page(info.links, info.base_url)
                if nofollow:        # page-level nofollow: none is followed, all are recorded as such
                    a.outlinks = [Link(ln.url, ln.fp, ln.host_key, True) for ln in a.outlinks]
                else:
                    pr.links = a.outlinks
                pr.simhash = simhash64(info.text)
                pr.canonical = info.canonical
                a.asks_near = bool(info.text)
        if res.status == 200 and not pr.canonical:
            pr.canonical = canonical_from_link_header(first.get("link"), url)
        pr.noindex, pr.nofollow = noindex, nofollow
        if prior is _ASK:
            prior = self.digest_seen(pr.digest, url, res.started_at) if self.digest_seen else None
        self.revisit_of(a, prior)
        return a

    def revisit_of(self, a: Analysis, prior: PriorCapture | tuple[str, float] | None) -> None:
        """Make an analysed capture a revisit of ``prior`` (for a 200, its exact-duplicate owner;
        for a 304, the capture it confirms), or of nothing; decided any time before ``archive``."""
        if isinstance(prior, tuple):
            prior = PriorCapture(prior[0], float(prior[1]))
        status = a.res.status
        a.pr.duplicate_of = prior.url if prior is not None and status == 200 else ""
        a.prior = prior if status in (200, 304) else None

    def archive(self, a: Analysis, near_duplicate_of: str = "") -> ProcessResult:
        """Write the capture's records (request, response or revisit, metadata); fill in where."""
        res, pr, prior = a.res, a.pr, a.prior
        if near_duplicate_of and not pr.duplicate_of:
            pr.near_duplicate_of = near_duplicate_of
        metadata = self._metadata(a)
        if prior is not None and res.status == 200:
            loc = self.warc.write_revisit(url=res.url, fetched_at=res.started_at, ip=res.ip,
                                          request_head=res.request_head, response_head=res.response_head,
                                          payload_digest=pr.digest, refers_to_uri=prior.url,
                                          refers_to_date=prior.fetched_at, refers_to_id=prior.record_id or None,
                                          profile=IDENTICAL_PAYLOAD_PROFILE, metadata=metadata)
        elif prior is not None:     # 304 to a conditional GET: the archived capture still holds
            loc = self.warc.write_revisit(url=res.url, fetched_at=res.started_at, ip=res.ip,
                                          request_head=res.request_head, response_head=res.response_head,
                                          payload_digest=prior.digest or None, refers_to_uri=prior.url,
                                          refers_to_date=prior.fetched_at, refers_to_id=prior.record_id or None,
                                          profile=NOT_MODIFIED_PROFILE, metadata=metadata)
            pr.digest = prior.digest or pr.digest
        else:
            loc = self.warc.write_fetch(url=res.url, fetched_at=res.started_at, ip=res.ip,
                                        request_head=res.request_head, response_head=res.response_head,
                                        body=res.body, payload_digest=pr.digest, metadata=metadata)
        pr.warc_file, pr.warc_offset, pr.warc_length, pr.warc_record_id = loc
        return pr

    def _metadata(self, a: Analysis) -> list[tuple[str, str]]:
        """The capture's metadata record (WARC/1.1 §6.6 fields where they exist: fetchTimeMs)."""
        res, pr = a.res, a.pr
        m = [("fetchTimeMs", str(round(res.elapsed_s * 1000)))]
        if res.ip:
            m.append(("ip-address", res.ip))
        if res.status == 304:
            m.append(("http-status", "304"))
        if pr.simhash:
            m.append(("simhash", f"{pr.simhash:016x}"))
        if pr.near_duplicate_of:
            m.append(("near-duplicate-of", pr.near_duplicate_of))
        robots = ", ".join(d for d, on in (("noindex", pr.noindex), ("nofollow", pr.nofollow)) if on)
        if robots:
            m.append(("robots", robots))
        meta = ", ".join(d for d, on in zip(("noindex", "nofollow"), a.robots_meta, strict=True) if on)
        if meta:
            m.append(("robots-meta", meta))
        m += [("x-robots-tag", v) for v in a.robots_tags]
        if pr.outcome is not Outcome.OK and pr.error:
            m.append(("processing-error", f"{pr.outcome.value}: {pr.error[:500]}"))
        m += [("outlink", f"{ln.url} nofollow" if ln.nofollow else ln.url) for ln in a.outlinks]
        return m

    def archive_failed(self, res: FetchResult, error: str) -> ProcessResult:
        """After ``process`` raised (a bug): keep the raw response in the WARC, outcome ``process_error``."""
        pr = ProcessResult(url=res.url, outcome=Outcome.PROCESS_ERROR, status=res.status, error=error)
        try:
            pr.digest = entity_digest(res)
            loc = self.warc.write_fetch(url=res.url, fetched_at=res.started_at, ip=res.ip,
                                        request_head=res.request_head, response_head=res.response_head,
                                        body=res.body, payload_digest=pr.digest,
                                        metadata={"fetchTimeMs": str(round(res.elapsed_s * 1000)),
                                                  "processing-error": error[:500]})
        except Exception as e:  # the archive itself failed (disk): the outcome still names the bug
            pr.error = f"{error}; not archived: {type(e).__name__}: {e}"
            return pr
        pr.warc_file, pr.warc_offset, pr.warc_length, pr.warc_record_id = loc
        return pr
