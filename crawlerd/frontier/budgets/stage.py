"""The budget stage of one shard: STAR in-degrees, BEAST queues, and the domain-edge DRUM on its thread.

The shard talks to this class only: ``offer_many`` at intake (``offer`` one URL at a time),
``record_links`` after a page, ``readmit`` from its periodic step, ``refund`` for URLs the
frontier dropped, ``add_root`` for seeds. The edge
DRUM is a :class:`crawlerd.seen.AsyncSeenSet`, so its merges never stall the event loop; its
answers are applied to the graph on the loop and acknowledged after the commit that holds them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from functools import lru_cache

import lmdb

from crawlerd.frontier.budgets.beast import Beast
from crawlerd.frontier.budgets.edges import EdgeClock
from crawlerd.frontier.budgets.fifo import blocks_by
from crawlerd.frontier.budgets.graph import DomainGraph
from crawlerd.frontier.budgets.rule import BudgetRule
from crawlerd.frontier.budgets.store import BudgetStore, KeyMemo, domain_key
from crawlerd.seen import AsyncSeenSet
from crawlerd.store.writer import WriterError, WriteThread
from crawlerd.url.hosts import host_key as host_key_of
from crawlerd.url.hosts import host_of, registered_domain

EDGE_SLICE = 256       # edge answers applied per loop iteration (a whole delivery took up to ~80 ms, 1,024 once 110 ms)
_NEVER = 1e18          # the edge DRUM's own age trigger is off: EdgeClock decides when it merges
# A job of the edge DRUM that nothing waits for (new edges, an ack) starts at most this often: each
# costs a trip to its thread, an intake segment created, written and deleted (on its intake thread)
# and a delivery with its budget commit. Nothing waits for edges but the merges EdgeClock asks for,
# which do not wait for the gap; its poll (every 0.5 s) starts a job anyway.
EDGE_JOB_GAP_S = 0.25
_OLD_TABLES = (b"backlog", b"grown")        # only the first layout (one FIFO per domain, no queues) had them
log = logging.getLogger("crawlerd.budgets")


def _set_aside_old_layout(path: str) -> str | None:
    """If ``path`` holds budget state of the first layout, move it aside; returns where it is to import.

    That layout kept one FIFO of deferred URLs per domain and in-degrees counted plainly; its edge
    DRUM's answers carry no source domain. Its deferred URLs are imported into BEAST (nothing is
    lost); its in-degrees and edges are not (they rebuild as pages are fetched). A crash during the
    import leaves the old state aside and a partial new one, which is dropped and imported again.
    """
    state, old = os.path.join(path, "state"), os.path.join(path, "state.v1")
    if os.path.isdir(old):
        shutil.rmtree(state, ignore_errors=True)
        return old
    if not os.path.exists(os.path.join(state, "data.mdb")):
        return None
    env = lmdb.open(state, readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin() as txn:
            first = any(txn.get(name) is not None for name in _OLD_TABLES)
    finally:
        env.close()
    if not first:
        return None
    os.replace(state, old)
    shutil.rmtree(os.path.join(path, "edges"), ignore_errors=True)
    return old


def _import_old_layout(old: str, beast: Beast, store: BudgetStore) -> int:
    env = lmdb.open(old, readonly=True, lock=False, max_dbs=16)
    n = 0
    try:
        with env.begin() as txn:
            for key, rec in txn.cursor(db=env.open_db(b"deferred", txn=txn, create=False)):
                beast.keep(bytes(key[:-9]), bytes(rec))
                n += 1
                if n % 10_000 == 0:
                    store.commit()
    finally:
        env.close()
    store.commit()
    shutil.rmtree(old)
    log.warning("budget state of the first layout imported: %d deferred URLs kept; in-degrees rebuild", n)
    return n


def pld_of(url_or_host_key: str) -> str:
    """Registered domain of a normalised URL or host key (``scheme://host[:port]``)."""
    return _pld_of_host_key(host_key_of(url_or_host_key))


@lru_cache(maxsize=1 << 16)
def _pld_of_host_key(host_key: str) -> str:
    return registered_domain(host_of(host_key))


# host key -> BEAST's domain key (of its registered domain), read once per run of a host's URLs at intake
_domain_keys = KeyMemo(lambda host_key: domain_key(_pld_of_host_key(host_key)), 1 << 16)


class Budgets:
    """Per-domain crawl budgets for one shard (see the package docstring).

    Single-threaded: call it from the event loop. Durability: ``commit`` after ``offer`` (the
    seen-set's ack, and the frontier's seen-set position, wait for its ``then``) and after queueing
    what ``readmit`` returned.
    """

    def __init__(self, path: str, *, base_budget: int, per_inlink: int, max_budget: int, mode: str = "vouched",
                 vouch_ratio: float = 0.5, queues: int = 8, max_spread: int = 1024, cache_entries: int = 1 << 16,
                 map_size_bytes: int = 16 << 30, edge_max_age_s: float = 5.0, edge_max_pending: int = 200_000,
                 edge_buckets: int = 16, edge_merge_bytes: int = 64 << 20, edge_cache_entries: int = 1 << 18,
                 clock: Callable[[], float] = time.monotonic, sync: bool = True, write_buffer_bytes: int = 0,
                 probation: bool = False, read_cache_bytes: int = 0, unlanded_bytes: int = 0):
        self.clock = clock
        self.rule = BudgetRule(base_budget, per_inlink, max_budget)
        old = _set_aside_old_layout(path)
        self.store = BudgetStore(os.path.join(path, "state"), map_size_bytes=map_size_bytes, sync=sync,
                                 write_buffer_bytes=write_buffer_bytes, read_cache_bytes=read_cache_bytes,
                                 unlanded_bytes=unlanded_bytes)
        try:
            self.graph = DomainGraph(self.store, mode=mode, vouch_ratio=vouch_ratio, cache_entries=cache_entries)
            self.beast = Beast(self.store, self.graph, self.rule, queues=queues, max_spread=max_spread,
                               cache_entries=cache_entries, probation=probation)
            self.timing = EdgeClock(max_age_s=edge_max_age_s, max_pending=edge_max_pending)
            self.edges = AsyncSeenSet(os.path.join(path, "edges"), buckets=edge_buckets,
                                      bucket_buffer_bytes=64 << 10, merge_bytes=edge_merge_bytes,
                                      max_age_s=_NEVER, cache_entries=edge_cache_entries, clock=clock,
                                      max_pending_keys=1 << 20, job_gap_s=EDGE_JOB_GAP_S,
                                      # its intake log is written off the loop: a page's lease waits
                                      # for its edges there (edges_logged), as for its links
                                      threaded_intake=True, intake_thread="crawlerd-edge-intake")
            if old is not None:
                _import_old_layout(old, self.beast, self.store)
        except BaseException:
            self.store.env.close()
            raise
        self.store.commit()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.edges.start(loop, self._on_edges)

    def attach_writer(self, writer: WriteThread | None) -> None:
        """Commit on ``writer`` (no LMDB write transaction on the loop; see ``BudgetStore``)."""
        self.store.attach_writer(writer)

    # -- intake (the shard's seen-set answers) -----------------------------------------------
    def offer(self, url: str, record: bytes, fp: int, host_key: str | None = None) -> bool:
        """A new URL: True if it may be queued now, False if BEAST keeps it for a later queue.
        ``host_key``: the URL's, when the caller has it already."""
        hk = host_key_of(url) if host_key is None else host_key
        return self.beast.offer(_pld_of_host_key(hk), record, fp, hk)

    def offer_many(self, records: list[bytes], fps: list[int], host_keys: list[str]) -> list[bool]:
        """``offer`` for several new URLs in order (parallel lists: record, fingerprint, host key),
        with the same decisions; returns passed or not, per URL. A page's links share a few hosts:
        a host's domain key is looked up once per run of its URLs (found in C)."""
        return self.beast.offer_groups(blocks_by(host_keys, _domain_keys.__getitem__), records, fps, host_keys)

    def add_root(self, url: str) -> None:
        """The URL is a seed: its domain is a trust root of STAR."""
        self.graph.add_root(pld_of(url))

    def refund(self, url: str) -> int:
        """The frontier dropped the URL without fetching it: give its domain the charge back."""
        return self.beast.refund(pld_of(url))

    def record_links(self, page_url: str, host_keys: Iterable[str]) -> int:
        """The hosts one page links to (followed links only): domain edges for STAR; returns edges sent."""
        return self.record_pages_links([(page_url, host_keys)])

    def record_pages_links(self, pages: Iterable[tuple[str, Iterable[str]]]) -> int:
        """``record_links`` for several pages (page URL or its host key, host keys) in one edge DRUM
        submission (one intake-log record instead of one per page); returns edges sent. They are
        kept once ``edges_logged`` says so."""
        keys: list[int] = []
        aux: list[bytes] = []
        edge_keys, dks = self.graph.domain_edge_keys, _domain_keys
        dk_of = dks.__getitem__         # a miss computes it (``KeyMemo.__missing__``)
        for page_url, host_keys in pages:
            # the worker gave each link's host key: its domain key is one dict look-up, no parse
            # (mapped in C: a set comprehension's frame cost a third more)
            k, a = edge_keys(dks[host_key_of(page_url)], {*map(dk_of, host_keys)})
            keys += k
            aux += a
        if keys:
            self.timing.submitted(self.edges.next_seq, len(keys), self.clock())
            self.edges.submit(keys, aux)
        return len(keys)

    def edges_logged(self) -> asyncio.Future | None:
        """None when every edge submitted so far is in the edge DRUM's intake log (kept across a
        kill -9); else a future done once it is (failed if the edge DRUM stops first). Once started
        on a loop that log is written on its own thread: what must not happen before a page's
        edges are kept (its lease's completion) waits for this."""
        return self.edges.logged()

    def when_edges_logged(self, then: Callable[[], None]) -> None:
        """Run ``then`` on the loop once every edge submitted so far is in the intake log."""
        self.edges.when_logged(then)

    def record_vouches(self, pairs: list[tuple[bytes, bytes]]) -> int:
        """Vouches another shard cast for domains of this one ((source key, target key), see
        ``DomainGraph.export``): into the edge DRUM, counted once each; returns records submitted."""
        keys, aux = self.graph.vouch_keys(pairs)
        if keys:
            self.timing.submitted(self.edges.next_seq, len(keys), self.clock())
            self.edges.submit(keys, aux)
        return len(keys)

    # -- the periodic step -------------------------------------------------------------------
    def step(self, now: float) -> None:
        """Ask for an edge merge when one is due (age, pending edges), without waiting for it."""
        self.edges.raise_if_failed()
        if not self.edges.flushing and self.timing.should_merge(now, self.edges.pending):
            self.edges.request_flush()
            self.timing.merged(now, self.edges.last_flush_s)

    def readmit(self, limit: int, *, advance: bool) -> list[bytes]:
        """Records that may pass now; ``advance``: the frontier runs short, move the reader on."""
        return self.beast.readmit(limit, advance=advance)

    def has_waiting(self) -> bool:
        return self.beast.has_waiting()

    def _on_edges(self, results: list, start: int = 0) -> None:
        # On the loop: apply EDGE_SLICE answers per iteration, then commit in an iteration of its
        # own, then acknowledge (a crash in between redelivers; applied_seq skips). A commit another
        # caller makes between slices holds the edges applied so far with their applied_seq, so
        # one is made here once the writes could fill the store's reserved page buffers. A slice
        # waits for a landing while the unlanded writes are at their bound (``crowded``).
        if self.store.crowded():
            self.store.when_room(functools.partial(self._on_edges, results, start))
            return
        end = start + EDGE_SLICE
        self.graph.apply(results[start:end] if start or end < len(results) else results)
        loop = asyncio.get_running_loop()
        if end < len(results):
            if self.store.full:
                self.store.commit()
            loop.call_soon(self._on_edges, results, end)
        else:
            loop.call_soon(self._commit_edges, results)

    def _commit_edges(self, results: list) -> None:
        self.store.commit(functools.partial(self._edges_committed, results))

    def _edges_committed(self, results: list) -> None:
        self.edges.ack()            # the commit holding them is written: DRUM may forget them
        if results:
            self.timing.delivered(results[-1].seq + 1, self.clock())

    def commit(self, then: Callable[[], None] | None = None) -> None:
        """Commit the budget state; ``then`` runs on the loop once that commit is written (survives
        kill -9): with a writer attached that is after the writer's commit, else the next iteration."""
        self.store.commit(then)

    @property
    def full(self) -> bool:
        """The open transaction's writes could fill the store's reserved page buffers: commit at the
        next consistent point (``BudgetStore.full``)."""
        return self.store.full

    def crowded(self) -> bool:
        """The writes not landed yet are at ``budgets.unlanded_bytes``: a step that writes here
        waits (``when_room``) before it runs (``BudgetStore.crowded``; once per step)."""
        return self.store.crowded()

    def when_room(self, step: Callable[[], None]) -> None:
        """Run ``step`` on the loop once a landing leaves room under the bound."""
        self.store.when_room(step)

    def sync(self) -> None:
        """fdatasync the committed state (thread-safe beside the loop's write transactions)."""
        self.store.flush()

    def request_flush(self) -> None:
        self.edges.request_flush()

    async def close(self) -> None:
        """Stop the edge DRUM (edges not merged stay in its journal for the next start), commit (on
        the writer, waiting for it, when one is attached), close."""
        try:
            await self.edges.close()
        finally:
            self.store.close_gate()     # a step waiting for room is dropped: nothing after the last commit
            try:
                await self._written()
            finally:
                self.store.close()

    async def _written(self) -> None:
        """Commit on the attached writer and wait until that commit is written (WriterError if the
        writer failed)."""
        ov = self.store.overlay
        if ov is None:
            return
        done = asyncio.get_running_loop().create_future()
        self.store.commit(lambda: done.set_result(None))
        while not done.done():
            if ov.writer.error is not None:
                raise WriterError(f"budget state not written: {ov.writer.error!r}") from ov.writer.error
            await asyncio.wait({done}, timeout=0.05)

    # -- reading ------------------------------------------------------------------------------
    def stats(self, top: int = 10) -> dict:
        now = self.clock()
        ov = self.store.overlay
        return {**self.beast.stats(top), **({"store_writer": ov.stats()} if ov is not None else {}),
                "graph": {**self.graph.stats(top), **self.timing.stats(now), "pending": self.edges.pending,
                          "drum": self.edges.stats()}}

    def unlanded_memory(self) -> dict[str, int]:
        """The writes not landed yet against ``budgets.unlanded_bytes`` (`crawlerd stats`)."""
        return self.store.unlanded_memory()

    def memory(self) -> dict[str, int]:
        """The host-turn read cache's estimated bytes against its cap (`crawlerd stats`)."""
        ov = self.store.overlay
        if ov is None:
            return {"bytes": 0, "cap_bytes": self.store.read_cache_bytes, "entries": 0, "evictions": 0}
        return ov.cache_memory() | {"cap_bytes": self.store.read_cache_bytes}

    def explain(self, url: str, fp: int) -> dict:
        """Budget side of "why is this URL not fetched yet": its domain's budget and its place, if waiting."""
        pld = pld_of(url)
        info = self.beast.explain(pld, fp)
        info["trust_root"] = self.graph.is_root(pld)
        return info
