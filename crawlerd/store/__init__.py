"""Store: what a crawl leaves on disk.

**WARC segments** (``warc.py``). Each processing worker owns one
:class:`WarcWriter`. A capture is a ``request``, a ``response`` (or a ``revisit``:
identical payload digest, or a 304 to a conditional GET) and a ``metadata``
record about it (outlinks, simhash, near-duplicate, robots directives, fetch
time). Each record is one gzip member appended to the worker's ``.open`` segment;
``write_*`` returns the (file, offset, length, record id) of the response so the
event and the CDXJ line can point at it. Segments rotate at
``warc.segment_max_bytes``. Record bytes (digests, dates, ids, gzip members) are
made in ``encoding.py``; reading members back without trusting them is ``segment.py``.

**CDXJ** (``cdxj.py``, ``surt.py``, ``linesort.py``). While a segment is written its
index lines go to a sidecar; closing the segment sorts them (external merge sort,
bounded RAM) into ``index/<segment>.cdxj`` (temp name, fsync, rename) and only then
drops the ``.open`` suffix. The lines equal cdxj-indexer's for the same segment.

**Recovery** (``recover.py``). After ``kill -9`` a segment may end in a torn record.
Before any writer starts, :func:`recover` cuts each ``.open`` segment back to its
last whole capture, indexes it and closes it.

**Verification** (``verify.py``). ``crawlerd warc verify`` re-reads a segment two
ways (our member walk and warcio) and checks digests, lengths, record order and
the CDXJ beside it.

**Events** (``events.py``). One JSON line per fetch, size-rotated, each with
``schema_version``; a torn last line is cut when the next log starts.
"""

from crawlerd.store.cdxj import index, surt, write_index
from crawlerd.store.encoding import payload_digest, sha1_base32
from crawlerd.store.events import EventLog, read_events
from crawlerd.store.recover import recover, recover_segment
from crawlerd.store.verify import VerifyReport, verify
from crawlerd.store.warc import IDENTICAL_PAYLOAD_PROFILE, NOT_MODIFIED_PROFILE, WarcLocation, WarcWriter

__all__ = ["IDENTICAL_PAYLOAD_PROFILE", "NOT_MODIFIED_PROFILE", "EventLog", "VerifyReport", "WarcLocation",
           "WarcWriter", "index", "payload_digest", "read_events", "recover", "recover_segment", "sha1_base32",
           "surt", "verify", "write_index"]
