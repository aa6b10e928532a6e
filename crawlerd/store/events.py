"""Fetch-event log: one JSON object per line (UTF-8), in size-rotated files under ``events/``.

Files are ``<name>-<UTC YYYYMMDDHHMMSSffffff>-<serial>.jsonl``, with ``.open`` while
written. Every line carries ``schema_version`` (the fields: ``crawlerd/shard/events.py``).
A crash can tear the last line of the ``.open`` file; the next EventLog with
the same name cuts the torn line off and closes the file before writing.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import orjson

from crawlerd.store.segment import OPEN_SUFFIX, create_next

SCHEMA_VERSION = 1


class EventLog:
    """Append events as JSON lines to rotating files in ``directory``; one log per process and name.

    Key: the ``.open`` file named by ``current_path``. Invariants: only that file is
    appended to; every complete file ends with a newline and holds whole lines only;
    a file is rotated once it reaches ``max_bytes``. Lines are buffered up to
    ``buffer_bytes``; ``flush()`` hands them to the OS.
    """

    def __init__(self, directory: str, *, max_bytes: int = 256 << 20, clock: Callable[[], float] = time.time,
                 name: str = "events", buffer_bytes: int = 64 << 10, fsync: bool = False):
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        if not re.fullmatch(r"[A-Za-z0-9_.]+", name):
            raise ValueError(f"event log name must be [A-Za-z0-9_.]+, got {name!r}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.name = name
        self.buffer_bytes = buffer_bytes
        self.fsync = fsync
        self._clock = clock
        os.makedirs(directory, exist_ok=True)
        self._pattern = re.compile(rf"{re.escape(name)}-\d{{20}}-(\d+)\.jsonl(\.open)?$")
        self.recovered = self._recover()
        self._serial = self._next_serial()
        self._file = None
        self._path = ""
        self._size = 0
        self._buf: list[bytes] = []
        self._buf_bytes = 0
        self.files_closed: list[str] = []

    @property
    def current_path(self) -> str | None:
        return self._path + OPEN_SUFFIX if self._file is not None else None

    def write(self, event: dict) -> None:
        """Append one event; ``schema_version`` is added when the event lacks it."""
        if "schema_version" not in event:
            event = {"schema_version": SCHEMA_VERSION, **event}
        # orjson: ~2 us a line where json.dumps(default=...) took ~30 us (it builds an encoder per call)
        line = orjson.dumps(event, default=str, option=orjson.OPT_APPEND_NEWLINE)
        if self._file is None:
            self._open()
        self._buf.append(line)
        self._buf_bytes += len(line)
        self._size += len(line)
        if self._size >= self.max_bytes:
            self._close_file()
        elif self._buf_bytes >= self.buffer_bytes:
            self._drain()

    def write_many(self, events: list[dict]) -> None:
        """``write`` for each event, in order (the same lines and file boundaries), in one call."""
        dumps, opt, buf = orjson.dumps, orjson.OPT_APPEND_NEWLINE, self._buf
        for event in events:
            if "schema_version" not in event:
                event = {"schema_version": SCHEMA_VERSION, **event}
            line = dumps(event, default=str, option=opt)
            if self._file is None:
                self._open()
            buf.append(line)
            n = len(line)
            self._buf_bytes += n
            self._size += n
            if self._size >= self.max_bytes:
                self._close_file()
        if self._file is not None and self._buf_bytes >= self.buffer_bytes:
            self._drain()

    def flush(self) -> None:
        if self._file is None:
            return
        self._drain()
        if self.fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._close_file()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- files --------------------------------------------------------------

    def _open(self) -> None:
        stamp = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y%m%d%H%M%S%f")
        self._file, self._path, self._serial = create_next(
            self.directory, lambda n: f"{self.name}-{stamp}-{n:05d}.jsonl", self._serial)
        self._size = 0

    def _drain(self) -> None:
        if not self._buf:
            return
        data = memoryview(b"".join(self._buf))
        self._buf.clear()
        self._buf_bytes = 0
        while data:
            n = self._file.write(data)
            data = data[n:]

    def _close_file(self) -> None:
        if self._file is None:
            return
        self._drain()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.rename(self._path + OPEN_SUFFIX, self._path)
        self.files_closed.append(self._path)

    def _next_serial(self) -> int:
        serials = [int(m.group(1)) for n in os.listdir(self.directory) if (m := self._pattern.match(n))]
        return max(serials) + 1 if serials else 0

    def _recover(self) -> list[str]:
        """Close ``.open`` files left by a crash, cutting a torn last line; return what was done."""
        done = []
        for entry in sorted(os.listdir(self.directory)):
            if not (entry.endswith(OPEN_SUFFIX) and self._pattern.match(entry)):
                continue
            path = os.path.join(self.directory, entry)
            with open(path, "rb+") as f:
                size = f.seek(0, os.SEEK_END)
                keep = _end_of_last_line(f, size)
                if keep < size:
                    f.truncate(keep)
                    done.append(f"truncated {entry} from {size} to {keep} bytes")
                os.fsync(f.fileno())
            if keep == 0:
                os.remove(path)
                done.append(f"removed empty {entry}")
            else:
                os.rename(path, path[:-len(OPEN_SUFFIX)])
                done.append(f"closed {entry[:-len(OPEN_SUFFIX)]}")
        return done


def _end_of_last_line(f, size: int, block: int = 64 << 10) -> int:
    """Offset just past the last newline of ``f`` (0 if none), reading backwards from ``size``."""
    end = size
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        pos = f.read(end - start).rfind(b"\n")
        if pos >= 0:
            return start + pos + 1
        end = start
    return 0


def read_events(path: str) -> Iterator[dict]:
    """Events of one file in order; a torn last line (no newline) is skipped."""
    with open(path, "rb") as f:
        for line in f:
            if line.endswith(b"\n"):
                yield orjson.loads(line)
