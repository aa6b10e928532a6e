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

from crawlerd._native.simhash import simhash as simhash64
from crawlerd.fetch.codec import DecodeError, dechunk, decode_body
from crawlerd.outcome import Outcome
from crawlerd.process.html import extract, parse_x_robots_tag
from crawlerd.process.links import links_from_page
from crawlerd.records import FetchResult, ProcessResult
from crawlerd.store.warc import WarcWriter, payload_digest

HTML_TYPES = ("text/html", "application/xhtml+xml")

DigestSeen = Callable[[str, str, float], "tuple[str, float] | None"]
NearDuplicate = Callable[[int, str], str]


ASK = object()      # process(prior=ASK): ask the digest_seen callback for the duplicate owner

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
    try:
        return payload_digest(dechunk(res.body, len(res.body) + 1) if res.chunked else res.body)
    except DecodeError:
        return payload_digest(res.body)


class PageProcessor:
    """Turns a FetchResult into a ProcessResult and its WARC records; constructing one tunes the
    process's allocator for parsing (:func:`tune_allocator`)."""

    def __init__(self, warc: WarcWriter, *, agent_token: str, max_decoded_bytes: int, max_links: int,
                 digest_seen: DigestSeen | None = None, near_duplicate: NearDuplicate | None = None):
        self.warc = warc
        self.agent_token = agent_token
        self.max_decoded_bytes = max_decoded_bytes
        self.max_links = max_links
        self.digest_seen = digest_seen
        self.near_duplicate = near_duplicate
        tune_allocator()

    def process(self, res: FetchResult, prior=ASK, digest: str = "") -> ProcessResult:
        """Process one response. ``prior`` is the exact-duplicate owner's answer for its digest
        ((first url, first date) or None); when not given, the ``digest_seen`` callback is asked.
        ``digest``: the payload digest if the caller computed it (``entity_digest``), else computed here."""
        url = res.url
        ctype = (res.header("content-type") or "").split(";", 1)[0].strip().lower()
        pr = ProcessResult(url=url, outcome=Outcome.OK, status=res.status, content_type=ctype)
        # the WARC payload is the entity with transfer coding removed (content coding kept)
        try:
            entity = dechunk(res.body, len(res.body) + 1) if res.chunked else res.body
        except DecodeError as e:
            entity = res.body
            pr.outcome, pr.error = e.outcome, str(e)
        pr.digest = digest or payload_digest(entity)
        metadata: dict[str, str] = {}
        noindex, nofollow = parse_x_robots_tag(
            [v for k, v in res.headers if k.lower() == "x-robots-tag"], self.agent_token)
        if pr.outcome is Outcome.OK and res.status == 200 and ctype in HTML_TYPES:
            try:    # from the entity: the chunked framing is already gone (no second pass)
                body = decode_body(entity, chunked=False, content_encoding=res.header("content-encoding"),
                                   max_bytes=self.max_decoded_bytes)
            except DecodeError as e:
                pr.outcome, pr.error = e.outcome, str(e)
            else:
                info = extract(body, url, agent_token=self.agent_token, max_links=self.max_links,
                               content_type=res.header("content-type"))
                noindex = noindex or info.noindex
                nofollow = nofollow or info.nofollow
                if not nofollow:
                    pr.links = links_from_page(info.links, info.base_url)
                pr.simhash = simhash64(info.text)
                if self.near_duplicate is not None and info.text:
                    pr.near_duplicate_of = self.near_duplicate(pr.simhash, url)
        pr.noindex, pr.nofollow = noindex, nofollow
        if noindex:
            metadata["robots"] = "noindex"
        if nofollow:
            metadata["robots"] = ", ".join(filter(None, [metadata.get("robots"), "nofollow"]))
        if pr.near_duplicate_of:
            metadata["near-duplicate-of"] = pr.near_duplicate_of
        if prior is ASK:
            prior = self.digest_seen(pr.digest, url, res.started_at) if self.digest_seen else None
        prev = prior
        if prev is not None and res.status == 200:
            pr.duplicate_of = prev[0]
            loc = self.warc.write_revisit(url=url, fetched_at=res.started_at, ip=res.ip,
                                          request_head=res.request_head, response_head=res.response_head,
                                          payload_digest=pr.digest, refers_to_uri=prev[0],
                                          refers_to_date=prev[1])
        else:
            loc = self.warc.write_fetch(url=url, fetched_at=res.started_at, ip=res.ip,
                                        request_head=res.request_head, response_head=res.response_head,
                                        body=res.body, payload_digest=pr.digest, metadata=metadata or None)
        pr.warc_file, pr.warc_offset, pr.warc_length = loc.filename, loc.offset, loc.length
        return pr

    def archive_failed(self, res: FetchResult, error: str) -> ProcessResult:
        """After ``process`` raised (a bug): keep the raw response in the WARC, outcome ``process_error``."""
        pr = ProcessResult(url=res.url, outcome=Outcome.PROCESS_ERROR, status=res.status, error=error)
        try:
            pr.digest = entity_digest(res)
            loc = self.warc.write_fetch(url=res.url, fetched_at=res.started_at, ip=res.ip,
                                        request_head=res.request_head, response_head=res.response_head,
                                        body=res.body, payload_digest=pr.digest,
                                        metadata={"processing-error": error[:500]})
        except Exception as e:  # the archive itself failed (disk): the outcome still names the bug
            pr.error = f"{error}; not archived: {type(e).__name__}: {e}"
            return pr
        pr.warc_file, pr.warc_offset, pr.warc_length = loc.filename, loc.offset, loc.length
        return pr
