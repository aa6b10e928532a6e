"""What the shard does with an answer: archive it, decide duplicates, keep recrawl state, follow links.

An answer (2xx, 3xx, 4xx, 304) is archived by a worker of the pool (WARC records, CDXJ line,
text, links, simhash). The worker also takes its payload digest (SHA-1 of the entity without
transfer coding, in the same pass) and looks it up among archived captures (a read-only view
of ``digests``) and its own recent ones: a match makes it write an identical-payload-digest
revisit naming the first capture (its URL, date and record id; see
``crawlerd/process/worker_process.py``). A 304 is written as a server-not-modified revisit naming the
capture it confirms (:meth:`Answers.confirmed_capture`, asked here: the recrawl state lives in
this process). With several shards (``owners``) the digest is taken here instead and the
digest's owner shard is asked first (``crawlerd.dedup.owners``): the first capture is decided
across shards, and the worker is given it. While archiving, the worker asks :meth:`Answers.near_duplicate` about a page
with text, so the capture's metadata record can name the page it nearly duplicates. After it:

- only an archived answer may own a digest or carry validators for a conditional re-fetch
  (recrawl bookkeeping), since a revisit of, or a 304 against, a record that does not exist
  would be unreadable;
- a page whose simhash is within ``dedup.simhash_distance`` bits of an earlier page is a near
  duplicate (decided during archiving, above); a host whose pages are mostly near duplicates is
  demoted one level (a trap);
- a redirect's Location and a page's followable outlinks go back to the intake (redirect hops
  are bounded by ``fetch.max_redirects``), and unique domain → domain edges feed STAR budgets;
  ``process`` returns only once the links handed to other shards are durable in the outbox.

``on_worker_death`` closes a dead worker's open WARC segment (torn tail cut) so no file stays
``.open``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from crawlerd.config import Config
from crawlerd.dedup.near import NearDuplicates
from crawlerd.frontier import Frontier, QueuedURL
from crawlerd.frontier.budgets import Budgets
from crawlerd.frontier.recrawl import Recrawl
from crawlerd.metrics import Metrics
from crawlerd.outcome import Outcome
from crawlerd.process.pool import WorkerPool
from crawlerd.process.worker import entity_digest
from crawlerd.records import FetchResult, PriorCapture, ProcessResult, followed_links
from crawlerd.shard.events import FetchEvents
from crawlerd.shard.intake import Intake
from crawlerd.shard.storage import StorageFailure
from crawlerd.store import recover_segment, sha1_base32
from crawlerd.store.digest_set import DigestSet, digest_key
from crawlerd.url.canonical import normalize
from crawlerd.url.hosts import host_key as host_key_of

log = logging.getLogger("crawlerd.shard")


class _Page:
    """One answer on its way through ``Answers.process`` (the pool's ``ctx`` for it): what the
    frame's batch needs of the lease, and what the batch left for the lease's task."""

    __slots__ = ("url", "fp", "host_key", "item", "res", "depth", "claimed", "done", "error", "edges")

    def __init__(self, url: str, fp: int, host_key: str, item: QueuedURL | None, res: FetchResult):
        self.url, self.fp, self.host_key, self.item, self.res = url, fp, host_key, item, res
        self.depth = item.depth if item is not None else 0
        self.claimed: bytes | None = None      # the digest claimed at its owner shard (several shards)
        self.done = False                       # handled by answer_frame
        self.error: Exception | None = None     # what answer_frame raised for it
        self.edges: int | None = None           # the flush its STAR edges wait for

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class Answers:
    """Archive, dedup and follow one answer at a time (many concurrently, on the loop).

    Invariant: an entry of ``digests`` names an archived first capture (added with its record
    id after its worker answered with a WARC location, never overwritten)."""

    def __init__(self, cfg: Config, *, pool: WorkerPool, digests: DigestSet, near: NearDuplicates,
                 recrawl: Recrawl, frontier: Frontier, intake: Intake, events: FetchEvents,
                 metrics: Metrics, budgets: Budgets | None = None, owners=None, batch: bool = True):
        """``owners``: with several shards, the digests' owners (``dedup.owners.DigestOwners``)."""
        self.cfg = cfg
        self.owners = owners
        self.pool = pool
        self.digests = digests
        self.near = near
        self.recrawl = recrawl
        self.frontier = frontier
        self.intake = intake
        self.events = events
        self.metrics = metrics
        self.budgets = budgets
        self._pages_links: list[tuple[str, set[str]]] = []     # STAR edges of this loop iteration
        self._links_flushes = 0
        self._loop: asyncio.AbstractEventLoop | None = None     # the loop of the first answer
        # the DUST gate's evidence hook (crawlerd.shard.dust), set by the shard
        self.evidence: Callable[[str, int, str, bytes, object, int], None] | None = None
        # a frame's answers as one batch (answer_frame, the pool's on_frame); False: page by page
        self.batch = batch
        if batch:
            pool.on_frame = self.answer_frame

    async def process(self, url: str, fp: int, host_key: str, item: QueuedURL | None, res: FetchResult) -> None:
        """Archive an answer in a worker, decide duplicates, and send its links to the seen-set.

        With ``batch`` on, what follows the worker's answer (recrawl, digest, links, event) is
        done for the whole answer frame by ``answer_frame`` before this call resumes; it then only
        waits for the page's links (and edges, near-duplicate doc) to be kept. An answer that did
        not come in a worker's frame (a crash's, the pool closing) takes the per-page path,
        ``_answered``, here."""
        page = _Page(url, fp, host_key, item, res)
        prior, digest = None, ""
        if res.status == 200 and self.owners is not None:
            # several shards: the digest's owner shard decides the first capture before archiving
            digest = entity_digest(res)
            prior = await self.owners.claim(digest_key(digest), url, res.started_at)
            if prior is None:               # this capture is the first: confirmed or released below
                page.claimed = digest_key(digest)
        elif res.status == 304:             # a server-not-modified revisit of the capture it confirms
            prior = self.confirmed_capture(fp)
        try:
            # one shard: a 200's digest and duplicate owner are found in the worker (no pass
            # over the body here)
            pr = await self.pool.process(res, prior, digest=digest,
                                         lookup=res.status == 200 and self.owners is None,
                                         ctx=page if self.batch else None)
        except BaseException:
            if page.claimed is not None:
                self.owners.release(page.claimed, url)
            raise
        if page.done:                       # handled with its frame (answer_frame)
            if page.error is not None:
                raise page.error
            edges = page.edges
        else:
            edges = self._answered(page, pr)
        # the page's links and result are not needed past here: let them go now rather than keep
        # them (tracked containers, a ``Link`` each) through the waits below, where the collector's
        # passes between callbacks would walk them and promote them to an older generation
        pr = page = None
        durable = self.intake.links_barrier()
        if durable is not None:
            await durable       # its links kept (intake log, outbox) before the lease completes
        written = self.near.written()
        if written is not None:
            await written       # and its near-duplicate doc (written on the writer thread)
        if edges is not None:
            if edges == self._links_flushes:
                self.flush_links()      # its edges still wait for the iteration's end: they go now
            kept = self.budgets.edges_logged()
            if kept is not None:
                await kept      # and its edges (the edge DRUM's intake log, on its own thread)

    def _answered(self, page: _Page, pr: ProcessResult) -> int | None:
        """The per-page path (the reference ``answer_frame`` batches): keep the answer's digest and
        recrawl state, then ``_follow`` it. Returns the flush its STAR edges wait for, or None."""
        sha1 = self._checked(page, pr)
        if pr.warc_file:
            if page.claimed is not None:
                self.owners.confirm(page.claimed, page.url, page.res.started_at, pr.warc_record_id)
            elif self.owners is None and sha1 is not None and not pr.duplicate_of:
                self.digests.record(sha1, page.url, repr(page.res.started_at), pr.warc_record_id)
            self.record_visit(page.url, page.fp, page.host_key, page.res, sha1, page.depth)
        elif page.claimed is not None:
            self.owners.release(page.claimed, page.url)
        return self._follow(page, pr, sha1)

    def answer_frame(self, frame: list[tuple[_Page, ProcessResult]]) -> None:
        """The pool's ``on_frame``: ``_answered`` for each page of a worker's answer frame, in order,
        as one batch: the frame's digest entries in one hand-over, its recrawl visits in one pass
        (``Recrawl.record_many``), then each page's ``_follow`` with the events they write in one
        append. The same calls per store in the same order as page by page (no step of
        ``_follow`` reads the digest set or recrawl), so the same records, state and event bytes.
        A page is ``done`` only once all of that ran for it; a page's error is raised in its own
        ``process`` (its lease does not complete: fetched again); a failed digest or recrawl write,
        or a failed event append, fails every page of the frame."""
        pages = [(page, pr) for page, pr in frame if not pr.storage_error]     # else: StorageFailure
        try:
            kept = self._keep_frame(pages)
        except Exception as e:
            for page, _pr in pages:
                page.done, page.error = True, e
            return
        try:
            with self.events.batch():
                for page, pr, sha1 in kept:
                    try:
                        page.edges = self._follow(page, pr, sha1)
                    except Exception as e:
                        page.error = e
        except Exception as e:              # the frame's events were not written
            for page, _pr, _sha1 in kept:
                page.error = page.error or e
        for page, _pr, _sha1 in kept:
            page.done = True

    def _keep_frame(self, pages: list[tuple[_Page, ProcessResult]]) -> list[tuple[_Page, ProcessResult, bytes | None]]:
        """The first half of ``_answered`` for a frame's archived answers: digest owners confirmed
        or released, the digest entries and recrawl visits kept, each store in one call."""
        kept, entries, visits = [], [], []
        for page, pr in pages:
            sha1 = digest_key(pr.digest) if page.res.status == 200 and pr.digest else None
            if pr.warc_file:
                if page.claimed is not None:
                    self.owners.confirm(page.claimed, page.url, page.res.started_at, pr.warc_record_id)
                elif self.owners is None and sha1 is not None and not pr.duplicate_of:
                    entries.append((sha1, page.url, repr(page.res.started_at), pr.warc_record_id))
                visit = self._visit(page.url, page.fp, page.host_key, page.res, sha1, page.depth)
                if visit is not None:
                    visits.append(visit)
            elif page.claimed is not None:
                self.owners.release(page.claimed, page.url)
            kept.append((page, pr, sha1))
        if entries:
            self.digests.record_many(entries)
        if visits:
            self.recrawl.record_many(visits)
            not_modified = sum(v[4] == 304 for v in visits if v[0] is not None)
            if not_modified:
                self.metrics.counters["not_modified"] += not_modified
        return kept

    def _checked(self, page: _Page, pr: ProcessResult) -> bytes | None:
        """The answer's payload SHA-1 (a 200's), or StorageFailure if it was not archived."""
        if pr.storage_error:
            # not archived (disk full, read-only, I/O error): nothing of it is kept, the caller
            # returns the URL to its queue and the crawl pauses until the storage is usable again
            raise StorageFailure(pr.storage_error, self.cfg.path("warc"))
        return digest_key(pr.digest) if page.res.status == 200 and pr.digest else None

    def _follow(self, page: _Page, pr: ProcessResult, sha1: bytes | None) -> int | None:
        """After the answer's digest and recrawl state: DUST's evidence, counters, the redirect or
        links to the intake, the page's event. Returns the flush its STAR edges wait for, or None."""
        url, res, depth = page.url, page.res, page.depth
        if self.evidence is not None and pr.warc_file and sha1 is not None:
            self.evidence(url, page.fp, page.host_key, sha1, pr, depth)      # DUST: evidence, rel=canonical
        if pr.near_duplicate_of:            # decided by near_duplicate() before the records were written
            self.metrics.counters["duplicate_near"] += 1
        if pr.outcome is not Outcome.OK:
            self.metrics.counters[f"process_{pr.outcome.value}"] += 1
        if pr.duplicate_of:
            self.metrics.counters["duplicate_exact"] += 1
        edges = None                        # its STAR edges wait for this flush (_record_links_soon)
        if res.status in REDIRECT_STATUSES:
            loc = res.header("location")
            if loc:
                hops = page.item.hops if page.item is not None else 0
                if hops + 1 > self.cfg.fetch.max_redirects:
                    self.metrics.dropped[Outcome.TOO_MANY_REDIRECTS.value] += 1
                    self.events.dropped(normalize(loc, url) or loc, Outcome.TOO_MANY_REDIRECTS.value)
                else:
                    item = page.item
                    self.intake.submit_urls([loc], depth=depth, hops=hops + 1, base=url,
                                            priority=item.priority if item else None)
        elif pr.links and depth < self.cfg.crawl.max_depth and not pr.nofollow:
            follow, hosts = followed_links(pr.links)        # one native pass: no nofollow ones, their hosts
            self.metrics.dropped["nofollow"] += len(pr.links) - len(follow)
            self.intake.submit_links(follow, depth=depth + 1, page=True)
            if self.budgets is not None and follow:
                # STAR reputation: unique domain -> domain edges (nofollow links earn nothing)
                edges = self._record_links_soon(page.host_key, hosts)
        self.events.fetched(url, res, pr=pr)
        return edges

    def _record_links_soon(self, page: str, host_keys: set[str]) -> int:
        """A page's STAR edges, handed to the budgets at the end of this loop iteration with those
        of the other pages answered in it (a worker answers a batch at once): one edge-DRUM
        submission per iteration instead of one per page. Still before the page's lease
        completes: ``process`` waits for the seen-set's intake log (a callback queued after this
        one), or hands them over itself if they are still here then, and then waits for the edge
        DRUM's intake log to hold them (written on its thread: usually in the same group wake-up as
        the links). Returns the flush they wait for."""
        if not self._pages_links:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self.flush_links)
        self._pages_links.append((page, host_keys))     # the page's host key: its domain, no URL parse
        return self._links_flushes

    def flush_links(self) -> None:
        """Hand the pages' edges gathered so far to the budgets. If that raises (a failed edge
        DRUM) they stay: each page's ``process`` tries again and raises, so its lease does not
        complete, as when the edges went page by page."""
        if self._pages_links:
            self.budgets.record_pages_links(self._pages_links)
        self._pages_links = []
        self._links_flushes += 1

    def record_visit(self, url: str, fp: int, host_key: str, res: FetchResult, sha1: bytes | None,
                     depth: int) -> None:
        """Recrawl bookkeeping for an answer the frontier will not retry (not 429/503)."""
        if res.status in (429, 503):
            return
        if res.status in (301, 308):
            self.recrawl.forget(fp)         # moved permanently: the target is crawled in its own right
            return
        etag, last_modified = _validators(res.headers)
        self.recrawl.record(url, fp, host_key, fetched_at=res.started_at, status=res.status,
                            etag=etag, last_modified=last_modified,
                            digest=sha1.hex() if sha1 is not None else None, changed=None, depth=depth)
        if res.status == 304:
            self.metrics.counters["not_modified"] += 1

    @staticmethod
    def _visit(url: str, fp: int, host_key: str, res: FetchResult, sha1: bytes | None,
               depth: int) -> tuple | None:
        """``record_visit`` as ``Recrawl.record_many``'s visit tuple, or None (429/503)."""
        if res.status in (429, 503):
            return None
        if res.status in (301, 308):
            return (None, fp)
        etag, last_modified = _validators(res.headers)
        return (url, fp, host_key, res.started_at, res.status, etag, last_modified,
                sha1.hex() if sha1 is not None else None, depth)

    def confirmed_capture(self, fp: int) -> PriorCapture | None:
        """The archived capture a 304 confirms: the record holding the payload whose validators
        were sent (its digest owner, so a replay engine finds the payload even when the URL's
        last capture was itself a revisit of another URL), else the URL's last capture as recrawl
        knows it. None when recrawl knows nothing (an unconditional request answered 304: that
        answer is archived as a plain response)."""
        st = self.recrawl.state(fp)
        if st is None:
            return None
        digest = "sha1:" + sha1_base32(bytes.fromhex(st.digest)) if st.digest else ""
        owner = self.digests.owner(st.digest) if st.digest else None
        if owner is not None:
            return PriorCapture(owner[0], float(owner[1]), owner[2], digest)
        return PriorCapture(st.url, st.captured_at or st.fetched_at, "", digest)

    def near_duplicate(self, simhash: int, url: str) -> str:
        """The pool's question before a worker archives a page with text: the stored page within
        the simhash distance, or "". Feeds the host's trap window (demoted when mostly near
        duplicates)."""
        host_key = host_key_of(url)
        near = self.near.check_and_add(simhash, url, host_key)
        if self.near.should_demote(host_key):   # mostly near-duplicates lately: a trap, slow it down
            self.frontier.demote_host(host_key)
            self.metrics.counters["near_dup_demotions"] += 1
        return near

    def near_duplicates(self, pages: list[tuple[int, str]]) -> list[str]:
        """``near_duplicate`` for each (simhash, URL) of a worker's batch, in order, with the same
        answers and demotions: one commit of the near-duplicate store and one index query for
        the batch instead of one per page."""
        found, demoted = self.near.check_and_add_many([(simhash, url, host_key_of(url)) for simhash, url in pages])
        for host_key in demoted:        # mostly near-duplicates lately: a trap, slow it down
            self.frontier.demote_host(host_key)
            self.metrics.counters["near_dup_demotions"] += 1
        return found


def _validators(headers: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    """(ETag, Last-Modified) of a response: each header's first value, case-insensitive, as
    ``FetchResult.header`` gives it, in one pass (a name is lowered only if its length fits)."""
    etag = last_modified = None
    for k, v in headers:
        n = len(k)
        if n == 4:
            if etag is None and k.lower() == "etag":
                etag = v
        elif n == 13 and last_modified is None and k.lower() == "last-modified":
            last_modified = v
    return etag, last_modified


def on_worker_death(metrics: Metrics, index_dir: str) -> Callable[[int, str], None]:
    """The pool's callback: a dead worker's open segment is closed at once (torn tail cut)."""
    def died(index: int, segment: str) -> None:
        metrics.counters["worker_restarts"] += 1
        if segment:
            for line in recover_segment(segment, index_dir=index_dir):
                log.warning("worker %d segment recovery: %s", index, line)
    return died
