"""Renames that survive a power loss: after writing a temp file, fsyncing it and renaming it into
place, fsync the directory that holds the new name (``fsync_dir``)."""

from __future__ import annotations

import os


def fsync_dir(path: str) -> None:
    """fsync a directory, so a rename in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
