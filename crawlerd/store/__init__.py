"""Store: what a crawl leaves on disk (DESIGN §4).

**WARC segments** (``warc.py``). Each processing worker owns one
:class:`WarcWriter`. A fetched page becomes a ``request`` and a ``response``
record (plus a ``metadata`` record for facts such as ``noindex``); an exact
duplicate becomes a ``revisit`` record pointing at the first capture by payload
digest. Each record is one gzip member appended to the worker's ``.open``
segment; ``write_*`` returns the (file, offset, length) of the response so the
event and the CDXJ line can point at it. Segments rotate at
``warc.segment_max_bytes``.

**CDXJ** (``cdxj.py``). While a segment is written its index lines go to a
sidecar; closing the segment sorts them into ``index/<segment>.cdxj`` (temp
name, fsync, rename) and only then drops the ``.open`` suffix.

**Recovery.** After ``kill -9`` a segment may end in a torn record. Before any
writer starts, :func:`recover` cuts each ``.open`` segment back to its last whole
record, indexes it and closes it. ``verify.py`` re-reads a segment two ways
(our member walk and warcio) and checks every digest.

**Events** (``events.py``). One JSON line per fetch, size-rotated, each with
``schema_version``; a torn last line is cut when the next log starts.
"""

from crawlerd.store.cdxj import index, surt
from crawlerd.store.events import EventLog, read_events
from crawlerd.store.verify import VerifyReport, verify
from crawlerd.store.warc import WarcLocation, WarcWriter, payload_digest, recover, recover_segment

__all__ = ["EventLog", "VerifyReport", "WarcLocation", "WarcWriter", "index", "payload_digest",
           "read_events", "recover", "recover_segment", "surt", "verify"]
