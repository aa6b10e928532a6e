"""``last-run.json``: a run's final stats (the supervisor's, a shard process's, the family's
totals), written so that even a full disk at the end leaves a whole file."""

from __future__ import annotations

import contextlib
import json
import logging
import os

log = logging.getLogger("crawlerd")

LAST_RUN_RESERVE_BYTES = 256 * 1024     # last-run.json is a few KiB; written in place on a full disk


def write_last_run(path: str, stats: dict) -> None:
    """The final stats of a run (temp name, fsync, rename).

    On a full disk the rename way has no room: the file is then overwritten in place, in the
    blocks ``reserve_last_run`` set aside at start (JSON ignores the trailing spaces)."""
    data = json.dumps(stats, indent=1, sort_keys=True, default=str).encode()
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            if len(data) > size:
                raise OSError(28, f"the {size} bytes set aside are too few")
            f.write(data + b" " * (size - len(data)))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        log.error("cannot write %s: %s", path, e.strerror)


def reserve_last_run(path: str) -> None:
    """Set aside LAST_RUN_RESERVE_BYTES for last-run.json while there is room (see write_last_run)."""
    try:
        with open(path, "rb") as f:
            old = f.read(LAST_RUN_RESERVE_BYTES).rstrip()
    except OSError:
        old = b"{}"
    if len(old) >= LAST_RUN_RESERVE_BYTES:
        return
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(old + b" " * (LAST_RUN_RESERVE_BYTES - len(old)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot set aside room for %s: %s", path, e.strerror)
