"""Whole writes and renames that survive a power loss: ``write_all`` writes every byte of its parts
(a short write is continued, never dropped); after writing a temp file, fsyncing it and renaming it
into place, ``fsync_dir`` fsyncs the directory that holds the new name."""

from __future__ import annotations

import os


def fsync_dir(path: str) -> None:
    """fsync a directory, so a rename in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


IOV_MAX = 1024      # buffers one writev takes at most (Linux's UIO_MAXIOV)


def write_all(fd: int, parts: list[bytes]) -> None:
    """Append ``parts`` to ``fd`` in order, whole: one ``writev`` for up to ``IOV_MAX`` of them, a
    short write continued from where it stopped."""
    views = [memoryview(p) for p in parts if p]
    i = 0
    while i < len(views):
        w = os.writev(fd, views[i:i + IOV_MAX])
        while i < len(views) and w >= len(views[i]):
            w -= len(views[i])
            i += 1
        if w:
            views[i] = views[i][w:]
