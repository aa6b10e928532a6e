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
young and compact; a transaction that changes more pages adds buffers as before.
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
