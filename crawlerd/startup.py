"""What a daemon does with its data dir before its loop starts (``Supervisor.prepare`` with one
shard, ``Family.prepare`` with several): claim the dir (an exclusive flock on ``lock``, held for
the life of the process, so two daemons never share one), read the seeds, and lay the dir out
for the crawl's shard count (``crawlerd.layout.prepare``)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

from crawlerd import layout
from crawlerd.config import Config
from crawlerd.url.canonical import normalize

log = logging.getLogger("crawlerd")


class StartupError(Exception):
    """A one-line reason the daemon cannot start (bad seeds file, data dir in use, ...)."""


def read_seeds(path: str) -> tuple[list[str], int]:
    """Seed URLs from a file (one per line, # comments); returns (valid, invalid count)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise StartupError(f"cannot read seeds file {path}: {e.strerror}") from None
    good, bad = [], 0
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if normalize(line) is None:
            bad += 1
            log.warning("seed skipped: not an http(s) URL url=%r", line[:200])
        else:
            good.append(line)
    return good, bad


def claim_data_dir(cfg: Config, shards: int, seeds_files: list[str]) -> tuple[int, list[str], int]:
    """Lock the data dir, read the seeds (``seeds_files``, else ``crawl.seeds_file``) and prepare
    the layout for ``shards``. Returns (the lock's fd, for the caller to close at exit; valid
    seeds; invalid seed lines). StartupError with the reason; the lock is let go then."""
    d = cfg.crawl.data_dir
    lock_fd = os.open(cfg.path("lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StartupError(f"data dir {d} is in use by another crawlerd") from None
        seeds: list[str] = []
        invalid = 0
        for path in seeds_files or ([cfg.crawl.seeds_file] if cfg.crawl.seeds_file else []):
            good, bad = read_seeds(path)
            seeds += good
            invalid += bad
        try:
            for line in layout.prepare(d, shards):
                log.info("data dir: %s", line)
        except (layout.LayoutError, OSError) as e:
            raise StartupError(str(e)) from None
    except BaseException:
        os.close(lock_fd)
        raise
    return lock_fd, seeds, invalid


def release_data_dir(lock_fd: int | None) -> None:
    """Let the data dir go (the lock ``claim_data_dir`` took; None: none was taken)."""
    if lock_fd is not None:
        with contextlib.suppress(OSError):
            os.close(lock_fd)
