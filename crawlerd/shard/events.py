"""The shard's fetch-event writer: one JSON line per answer, robots/sitemap fetch or drop.

Every URL that passed the seen-set and will never be fetched gets a ``dropped`` event, and
every fetch a ``page``/``robots``/``sitemap`` event, so nothing vanishes unrecorded. The
lines go to :class:`crawlerd.store.events.EventLog` (``<data_dir>/events``); with
``log.events`` off this writer takes the same calls and writes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from crawlerd.records import FetchResult
from crawlerd.store.events import SCHEMA_VERSION, EventLog

EVENT_SCHEMA = 1


class FetchEvents:
    """Builds fetch events and appends them to an event log (or nowhere if ``path`` is None).

    A failed write (disk full, read-only) is reported to ``on_error(err, path)`` and counted in
    ``lost`` (the events of its buffer are gone); the crawl pauses on it, the archive is unharmed."""

    def __init__(self, path: str | None, *, wall: Callable[[], float],
                 on_error: Callable[[BaseException, str], None] | None = None, name: str = "events"):
        """``name``: the log's file name prefix (one per shard: two logs never share a file)."""
        self.wall = wall
        self.path = path
        self.on_error = on_error
        self.lost = 0
        self.log = EventLog(path, name=name) if path is not None else None
        self._held: list[dict] | None = None       # events of the open batch(), in order

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Every event written inside goes to the log in one append at the end (``EventLog.write_many``:
        the same lines, in the same order). Not nested."""
        if self.log is None:
            yield
            return
        self._held = held = []
        try:
            yield
        finally:
            self._held = None
            if held:
                self._do(self.log.write_many, held)

    def _write(self, ev: dict) -> None:
        held = self._held
        if held is not None:
            held.append(ev)
        else:
            self._do(self.log.write, ev)

    def fetched(self, url: str, res: FetchResult, *, pr=None, kind: str = "page") -> None:
        """A fetch of ``url`` (``res``), with its processing result ``pr`` for an archived answer."""
        if self.log is None:
            return
        # schema_version first, as the log would add it (then it does not copy the dict)
        if pr is None:
            ev = {"schema_version": SCHEMA_VERSION, "schema": EVENT_SCHEMA, "kind": kind, "url": url,
                  "final_url": res.url, "fetched_at": res.started_at, "status": res.status, "outcome": res.outcome.value,
                  "ip": res.ip, "fetch_ms": round(res.elapsed_s * 1000, 3), "bytes": res.size}
        else:       # the same fields, then the processing result's: one dict, built once per page
            ev = {"schema_version": SCHEMA_VERSION, "schema": EVENT_SCHEMA, "kind": kind, "url": url,
                  "final_url": res.url, "fetched_at": res.started_at, "status": res.status, "outcome": pr.outcome.value,
                  "ip": res.ip, "fetch_ms": round(res.elapsed_s * 1000, 3), "bytes": res.size,
                  "content_type": pr.content_type, "digest": pr.digest, "simhash": f"{pr.simhash:016x}",
                  "warc": {"file": pr.warc_file, "offset": pr.warc_offset, "length": pr.warc_length},
                  "duplicate_of": pr.duplicate_of, "near_duplicate_of": pr.near_duplicate_of,
                  "robots_meta": {"noindex": pr.noindex, "nofollow": pr.nofollow},
                  "links_out": len(pr.links)}
        error = (pr.error if pr is not None and pr.error else "") or res.error
        if error:
            ev["error"] = error
        self._write(ev)

    def dropped(self, url: str, reason: str) -> None:
        """A URL that passed the seen-set but will never be fetched: one event, so nothing vanishes."""
        if self.log is not None:
            self._write({"schema": EVENT_SCHEMA, "kind": "dropped", "url": url, "outcome": reason,
                         "fetched_at": self.wall(), "status": 0})

    def record(self, kind: str, url: str, outcome: str, **fields) -> None:
        """Any other event about a URL (``dust_skipped``, ``dust_rule``, ...), with its own fields."""
        if self.log is not None:
            ev = {"schema": EVENT_SCHEMA, "kind": kind, "url": url, "outcome": outcome,
                  "fetched_at": self.wall(), "status": 0, **fields}
            if self._held is not None:
                self._held.append(ev)
            else:
                self.log.write(ev)      # an error raises here (not counted in ``lost``)

    def flush(self) -> None:
        if self.log is not None:
            self._do(self.log.flush)

    def close(self) -> None:
        if self.log is not None:
            self._do(self.log.close)

    def _do(self, op, *args) -> None:
        try:
            op(*args)
        except OSError as e:
            self.lost += 1
            if self.on_error is None:
                raise
            self.on_error(e, self.path)
