"""External merge sort of text lines with a bounded buffer (Knuth, TAOCP vol. 3 §5.4.1).

A CDXJ index is a file of lines sorted bytewise (``LC_ALL=C sort``) with
duplicates removed, as cdxj-indexer writes it. A segment's lines arrive in
write order; sorting them whole in RAM cost a spike of several times the
sidecar's size at every segment close. :func:`sort_lines` holds at most
``buffer_bytes`` of line text: each full buffer is sorted and written as a run
next to the output, and the runs are merged ``fan_in`` at a time, reading each
through a small buffer. Output goes to a temporary name, is fsynced and renamed
into place, so a reader sees the old file or the whole new one.

:func:`sort_file_in_child` runs :func:`sort_file` in a child process
(``python -m crawlerd.store.linesort SRC DST --buffer-bytes N``) and waits for it: the buffer's
lines are small Python objects, and in a long-lived process their swing would set a new
high-water mark of Python's 1 MiB arenas, some of which stay mapped after it (fragmentation).
The child dies with the process that started it (``PR_SET_PDEATHSIG``), and every writer renames
from a temporary name of its own, so a sort left running by a killed worker can never break the
crawl process's recovery of that worker's segment, which writes the same index.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import heapq
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator

from crawlerd.store.fsync import fsync_dir

DEFAULT_BUFFER_BYTES = 8 << 20
DEFAULT_FAN_IN = 32
_LINE_OVERHEAD = 64          # per-line object cost counted against the buffer (bytes object + list slot)


def sort_lines(lines: Iterable[bytes], path: str, *, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
               fan_in: int = DEFAULT_FAN_IN, tmp_dir: str | None = None) -> int:
    """Write the distinct ``lines`` (no trailing newline) to ``path``, sorted bytewise; return how many.

    RAM: about ``buffer_bytes`` (line text plus a per-line overhead) whatever the input size.
    Runs go to ``tmp_dir`` (default: the directory of ``path``) and are removed afterwards.
    """
    if buffer_bytes < 1 or fan_in < 2:
        raise ValueError("buffer_bytes must be >= 1 and fan_in >= 2")
    tmp_dir = tmp_dir or os.path.dirname(path) or "."
    runs: list[str] = []
    buf: list[bytes] = []
    used = 0
    try:
        for line in lines:
            buf.append(line)
            used += len(line) + _LINE_OVERHEAD
            if used >= buffer_bytes:
                buf.sort()
                runs.append(_write_run(buf, tmp_dir))
                buf, used = [], 0
        if not runs:                       # it all fit: no temporary files
            buf.sort()
            return write_sorted(iter(buf), path)
        if buf:
            buf.sort()
            runs.append(_write_run(buf, tmp_dir))
            buf = []
        read_bytes = max(16 << 10, buffer_bytes // (fan_in + 1))
        while len(runs) > fan_in:          # multi-pass: never more than fan_in files open
            group, runs = runs[:fan_in], runs[fan_in:]
            merged = _merge_to_run(group, tmp_dir, read_bytes)
            runs.append(merged)
        files = [open(r, "rb", buffering=read_bytes) for r in runs]
        try:
            return write_sorted(heapq.merge(*(_read_lines(f) for f in files)), path)
        finally:
            for f in files:
                f.close()
    finally:
        for r in runs:
            try:
                os.remove(r)
            except FileNotFoundError:
                pass


def sort_file(src: str, path: str, **kw) -> int:
    """:func:`sort_lines` over the lines of the file ``src`` (read as a stream)."""
    with open(src, "rb", buffering=1 << 20) as f:
        return sort_lines(_read_lines(f), path, **kw)


def sort_file_in_child(src: str, path: str, *, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> int:
    """:func:`sort_file` in a child process, waited for; the lines written. Its failure raises
    ``OSError`` (with the child's errno when the sort itself met one), as :func:`sort_file` would."""
    from crawlerd.child import child_env, python_argv
    proc = subprocess.run(python_argv("crawlerd.store.linesort", src, path, "--buffer-bytes", str(buffer_bytes),
                                      "--parent-pid", str(os.getpid())),
                          env=child_env(), capture_output=True, check=False)
    if proc.returncode == 0:
        return int(proc.stdout)
    last = (proc.stderr.decode(errors="replace").strip().splitlines() or [""])[-1]
    if proc.returncode == _OS_ERROR_EXIT and "\t" in last:
        errno, strerror = last.split("\t", 1)
        raise OSError(int(errno), strerror, path)
    raise OSError(f"sorting {src} in a child process failed (exit {proc.returncode}): {last}")


_OS_ERROR_EXIT = 3
_PARENT_GONE_EXIT = 4
_PR_SET_PDEATHSIG = 1               # <sys/prctl.h>


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="sort the lines of SRC bytewise, distinct, into DST (atomically)")
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--buffer-bytes", type=int, default=DEFAULT_BUFFER_BYTES, help="line text held in RAM at most")
    ap.add_argument("--parent-pid", type=int, default=0,
                    help="die when this process (the one that started the sort) dies")
    args = ap.parse_args(argv)
    if args.parent_pid:
        _die_with_parent(args.parent_pid)
    try:
        n = sort_file(args.src, args.dst, buffer_bytes=args.buffer_bytes)
    except OSError as e:
        print(f"{e.errno or 0}\t{e.strerror or e}", file=sys.stderr)
        return _OS_ERROR_EXIT
    print(n)
    return 0


def _read_lines(f) -> Iterator[bytes]:
    for line in f:
        line = line.rstrip(b"\n")
        if line:
            yield line


def _unique(lines: Iterable[bytes]) -> Iterator[bytes]:
    last = None
    for line in lines:
        if line != last:
            yield line
            last = line


def _write_run(buf: list[bytes], tmp_dir: str) -> str:
    fd, name = tempfile.mkstemp(prefix=".sort-", suffix=".run", dir=tmp_dir)
    with os.fdopen(fd, "wb", buffering=1 << 20) as f:
        for line in _unique(buf):
            f.write(line)
            f.write(b"\n")
    return name


def _merge_to_run(runs: list[str], tmp_dir: str, read_bytes: int) -> str:
    files = [open(r, "rb", buffering=read_bytes) for r in runs]
    try:
        fd, name = tempfile.mkstemp(prefix=".sort-", suffix=".run", dir=tmp_dir)
        with os.fdopen(fd, "wb", buffering=1 << 20) as out:
            for line in _unique(heapq.merge(*(_read_lines(f) for f in files))):
                out.write(line)
                out.write(b"\n")
    finally:
        for f in files:
            f.close()
        for r in runs:
            os.remove(r)
    return name


def write_sorted(lines: Iterator[bytes], path: str) -> int:
    """Write ``lines``, already sorted, to ``path`` with duplicates dropped, atomically (fsynced,
    renamed into place); return how many were written."""
    # a temporary name of this writer's own: two processes may write the same index at once (a
    # worker's sort child finishing while the crawl process recovers the dead worker's segment),
    # and neither may rename the other's file away or truncate it
    tmp = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    n = 0
    try:
        with open(tmp, "wb", buffering=1 << 20) as f:
            for line in _unique(lines):
                f.write(line)
                f.write(b"\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")
    return n


def _die_with_parent(parent_pid: int) -> None:
    """A sort child works for the process that started it: when that one dies (kill -9), the
    sort is killed too instead of finishing a file that the dead process's recovery rewrites."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):      # not Linux: the unique temporary names still keep it safe
        return
    if parent_pid and os.getppid() != parent_pid:       # died before the line above
        raise SystemExit(_PARENT_GONE_EXIT)


if __name__ == "__main__":
    raise SystemExit(main())
