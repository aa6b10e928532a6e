"""Reserve an LMDB environment's dirty-page buffers when it opens (ARCHITECTURE.md, "Memory bounds").

LMDB opened without ``writemap`` (a full disk must be an error, never a SIGBUS) copies every page a
write transaction changes into a page-sized buffer from the C heap, and at commit or abort keeps
those buffers on the environment's free list for the next transaction; they are freed only when
the environment closes. So a store's private memory is the most pages any one of its write
transactions has changed. That number climbs slowly while the B-trees grow (the same number of
random puts lands on more distinct pages), and each new buffer is a fresh 4 KiB heap block
allocated among the crawl's short-lived ones: measured as private memory rising with the pages
crawled. Reserving the buffers at open (one transaction that changes about ``nbytes`` of pages,
then aborted: nothing is written) turns that climb into a fixed cost, taken while the heap is
young and compact. :class:`WriteBudget` then keeps every transaction within them: the store commits
once its writes could have changed as many pages as were reserved, so no transaction adds buffers.
"""

from __future__ import annotations

import lmdb

_VALUE_BYTES = 1800       # below LMDB's node limit for 4 KiB pages (~2 KiB): no overflow pages
_KEY_PREFIX = b"\xff\xffcrawlerd-reserve\x00"


def reserve_write_buffers(env: lmdb.Environment, nbytes: int) -> int:
    """Leave about ``nbytes`` of page buffers on ``env``'s free list; returns the pages reserved.

    Call right after ``lmdb.open``, before the first write transaction (LMDB has one writer). The
    transaction puts ever larger keys into the main database, so each put after the first few
    fills a fresh leaf page, and is aborted: the file and the data are untouched."""
    psize = env.stat()["psize"]
    pages = max(0, nbytes) // psize
    if pages == 0:
        return 0
    value = bytes(_VALUE_BYTES)
    txn = env.begin(write=True)
    try:
        for i in range(pages):
            txn.put(_KEY_PREFIX + i.to_bytes(8, "big"), value)
    finally:
        txn.abort()
    return pages


class WriteBudget:
    """The pages one write transaction of a store may change: the buffers reserved when it opened.

    A put or a delete changes at most one page per level of its B-tree (the path from the root to
    its leaf), plus one for a split or a merge with a sibling. So each write is charged the depth of
    the deepest of the store's tables plus one, read again after each commit (the trees deepen as
    they grow), and a transaction whose charges stay within the reserved pages needs no buffer
    beyond them. The store charges its writes with :meth:`spend` and commits, at a point where its
    state is consistent, once :attr:`full`; the commit's own writes (the free-page list, the named
    tables' roots) come out of the eighth held back.

    Invariant: ``used`` is the charge of the open transaction's writes since the last
    :meth:`committed`; ``limit`` is 0 (nothing reserved: unbounded, :attr:`full` never) or 7/8 of
    the reserved pages."""

    def __init__(self, env: lmdb.Environment, nbytes: int, dbs=()) -> None:
        self.env = env
        self.dbs = tuple(dbs)
        self.pages = reserve_write_buffers(env, nbytes)
        self.limit = self.pages - self.pages // 8
        self.per_write = 2          # a new store: depth 1, one leaf (updated at each commit)
        self.used = 0
        # an Overlay writing this store on the writer thread reads the depth in each of its write
        # transactions: while one is attached, committed() takes its figure (no read on the loop)
        self.source = None

    def spend(self, writes: int = 1) -> None:
        self.used += writes * self.per_write

    def fits(self, writes: int) -> bool:
        """Whether ``writes`` more fit in the open transaction's share of the reserved pages."""
        return not self.limit or self.used + writes * self.per_write <= self.limit

    @property
    def full(self) -> bool:
        return 0 < self.limit <= self.used

    def committed(self) -> None:
        """Call after each commit (or abort): a new transaction, charged by the trees' depth now
        (with an overlay attached: as its writer read it at the start of its newest write
        transaction, at most that transaction's own commit behind a read here; the writer charges
        its transactions with its own reading, so this only sizes the loop's layers)."""
        self.used = 0
        if self.limit and self.source is not None:
            self.per_write = self.source.per_write
        elif self.limit:
            with self.env.begin() as txn:
                depth = max([txn.stat(db)["depth"] for db in self.dbs] or [txn.stat()["depth"]])
            self.per_write = max(1, depth) + 1


def pages_changed(writes: int, depth: int, branch_pages: int) -> int:
    """Most pages ``writes`` puts and deletes in one transaction can change in a table of ``depth``
    levels with ``branch_pages`` pages above its leaves (``txn.stat(db)`` at the transaction's start).

    Each write changes its path (a leaf and ``depth - 1`` branch pages) plus one page for a split
    or a merge, as :class:`WriteBudget` charges it; but a page is copied once per transaction however
    many writes pass through it, and the writes of one table share its branch pages: so the
    transaction changes at most one leaf and one split page per write, and at most every branch
    page of the table, not ``depth - 1`` of them per write. Equal to ``writes * (depth + 1)`` for
    a single write or a table of one level; for a group of sorted writes to a deep table, about
    two pages a write instead of depth + 1."""
    d = max(1, depth)
    return 2 * writes + min(writes * (d - 1), branch_pages)

