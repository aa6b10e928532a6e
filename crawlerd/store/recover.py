"""Crash recovery of WARC segments: make every ``.open`` segment whole, indexed and closed.

After ``kill -9`` a segment may end in a torn record. Before any writer starts on
a directory, :func:`recover` cuts each ``.open`` segment back to its last whole
record (a prefix of gzip members that each parse as one whole WARC record),
writes its CDXJ and drops the ``.open`` suffix; a finished segment missing its
CDXJ gets one; stale CDXJ sidecars (``.cdxj.open``, ``.cdxj.tmp``, sort runs) go.

Invariant re-established: only a ``.open`` segment is ever appended to; a segment
without ``.open`` is complete and has a sorted CDXJ beside it in the index directory.
"""

from __future__ import annotations

import os

from crawlerd.store import cdxj
from crawlerd.store.fsync import fsync_dir
from crawlerd.store.segment import OPEN_SUFFIX, BadRecord, check_member, iter_members

__all__ = ["recover", "recover_segment"]


def recover(directory: str, *, index_dir: str | None = None) -> list[str]:
    """Make every segment in ``directory`` complete and indexed after a crash; return what was done.

    Run it before any writer starts on the directory. Each ``*.warc.gz.open`` goes
    through :func:`recover_segment`; finished segments missing their CDXJ get one;
    stale CDXJ sidecars (``.cdxj.open``, ``.cdxj.tmp``, ``.sort-*.run``) are removed.
    """
    index_dir = index_dir or directory
    done: list[str] = []
    if not os.path.isdir(directory):
        return done
    os.makedirs(index_dir, exist_ok=True)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".warc.gz" + OPEN_SUFFIX):
            done += recover_segment(os.path.join(directory, name), index_dir=index_dir)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".warc.gz"):
            path = os.path.join(directory, name)
            target = cdxj.cdxj_path(path, index_dir)
            if not os.path.exists(target):
                cdxj.write_index(path, target)
                done.append(f"indexed {name}")
    for name in sorted(os.listdir(index_dir)):
        if name.endswith(".cdxj" + OPEN_SUFFIX) or name.endswith(".cdxj.tmp") or \
                (name.startswith(".sort-") and name.endswith(".run")):
            os.remove(os.path.join(index_dir, name))
            done.append(f"removed stale {name}")
    return done


def recover_segment(path: str, *, index_dir: str | None = None) -> list[str]:
    """Close one segment whose writer died (``path`` with or without ``.open``); return what was done.

    Keeps the longest prefix of whole gzip members that parse as whole records,
    truncates the rest (torn record, garbage), fsyncs, writes the CDXJ, then renames
    to the final name. A segment with no record but its warcinfo is removed. A
    segment already closed only gets its CDXJ if that is missing.
    """
    final = path.removesuffix(OPEN_SUFFIX)
    open_path = final + OPEN_SUFFIX
    name = os.path.basename(open_path)
    index_dir = index_dir or os.path.dirname(final)
    target = cdxj.cdxj_path(final, index_dir)
    done: list[str] = []
    if not os.path.exists(open_path):
        if os.path.exists(final) and not os.path.exists(target):
            os.makedirs(index_dir, exist_ok=True)
            cdxj.write_index(final, target)
            done.append(f"indexed {os.path.basename(final)}")
        return done
    os.makedirs(index_dir, exist_ok=True)
    keep, records, data_records = valid_prefix(open_path)
    size = os.path.getsize(open_path)
    if data_records == 0:
        os.remove(open_path)
        done.append(f"removed {name}: no complete data record ({size} bytes)")
    else:
        if keep < size:
            os.truncate(open_path, keep)
            done.append(f"truncated {name} from {size} to {keep} bytes ({records} records kept)")
        with open(open_path, "rb+") as f:
            os.fsync(f.fileno())
        cdxj.write_index(open_path, target)
        os.rename(open_path, final)
        done.append(f"closed {os.path.basename(final)}")
    sidecar = target + OPEN_SUFFIX
    if os.path.exists(sidecar):
        os.remove(sidecar)
    fsync_dir(os.path.dirname(final) or ".")
    return done


def valid_prefix(path: str) -> tuple[int, int, int]:
    """(bytes, records, non-warcinfo records) of the longest run of whole records from the start
    that leaves no request without the response it names (WARC-Concurrent-To): a capture cut
    between its request and its response loses its request too."""
    keep = records = data_records = 0
    dangling = None         # (keep, records, data_records) before a request still waiting for its response
    expect = ""             # the record id that request names
    with open(path, "rb") as f:
        for member in iter_members(f):
            try:
                head = check_member(member)
            except (BadRecord, ValueError):
                break
            rtype = head.type
            if dangling is not None and head.get("WARC-Record-ID") == expect:
                dangling = None
            if rtype == "request" and dangling is None and head.get("WARC-Concurrent-To"):
                dangling, expect = (keep, records, data_records), head.get("WARC-Concurrent-To")
            keep = member.offset + member.length
            records += 1
            if rtype != "warcinfo":
                data_records += 1
    if dangling is not None:
        keep, records, data_records = dangling
    return keep, records, data_records
