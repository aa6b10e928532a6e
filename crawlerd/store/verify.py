"""``crawlerd warc verify``: check that a segment is whole, its digests hold and its index agrees.

Checked, each failure one line naming the record's offset:

- the file: missing, a directory, unreadable or empty is a failure, never a traceback;
- every gzip member is one whole record: its Content-Length, the CRLF CRLF after the
  block; anything after the last whole record is an error;
- digests: WARC-Block-Digest of every record; WARC-Payload-Digest of responses
  (the entity with transfer coding removed); a revisit whose WARC-Refers-To record is
  in the segment has that record's payload digest;
- record order: ``warcinfo`` first, and every WARC-Warcinfo-ID names it; record ids
  unique; every WARC-Concurrent-To names a record of the segment; a request and its
  response (or revisit) name each other; a metadata record follows the record it
  describes; a revisit has a WARC-Profile (and a payload digest if identical-payload);
- a second reading by warcio agrees on the record count;
- the CDXJ (``index/<name>.cdxj`` beside the segment's directory, or next to it)
  holds exactly the lines indexing the segment gives, sorted.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import tempfile
from dataclasses import dataclass, field

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

from crawlerd.store import cdxj
from crawlerd.store.segment import BadRecord, check_member, dechunk, http_split, is_chunked, iter_members

__all__ = ["VerifyReport", "digest_matches", "find_index", "verify"]

_KNOWN_TYPES = frozenset({"warcinfo", "response", "resource", "request", "metadata", "revisit",
                          "conversion", "continuation"})
_IDENTICAL = "/revisit/identical-payload-digest"
_MAX_INDEX_EXAMPLES = 3


@dataclass(slots=True)
class VerifyReport:
    """Result of verifying one segment; ``ok`` iff no errors."""

    path: str
    records: int = 0
    counts: dict[str, int] = field(default_factory=dict)   # WARC-Type -> records
    valid_bytes: int = 0                                    # compressed bytes of whole records from the start
    index_path: str = ""                                    # the CDXJ compared, "" if none was found
    index_lines: int = 0
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        state = "ok" if self.ok else f"FAILED ({len(self.errors)} errors)"
        index = f", index {self.index_lines} lines" if self.index_path else ""
        return f"{self.path}: {state}: {self.records} records {counts}".rstrip() + index

    def lines(self) -> list[str]:
        """The summary, then one line per error and warning (what the CLI prints)."""
        return ([self.summary()] + [f"{self.path}: error: {e}" for e in self.errors]
                + [f"{self.path}: warning: {w}" for w in self.warnings])


def digest_matches(expected: str, *parts: bytes) -> bool | None:
    """True/False when ``algo:value`` (base32 or hex) matches the parts; None for an unknown algorithm."""
    algo, sep, value = expected.partition(":")
    if not sep:
        return False
    try:
        h = hashlib.new(algo.strip().lower().replace("-", ""))
    except ValueError:
        return None
    for p in parts:
        h.update(p)
    raw = h.digest()
    value = value.strip()
    candidates = {base64.b32encode(raw).decode("ascii"), binascii.hexlify(raw).decode("ascii"),
                  base64.b64encode(raw).decode("ascii")}
    return value in candidates or value.upper() in candidates or value.lower() in candidates


def find_index(path: str) -> str | None:
    """The CDXJ of a segment: ``<dir>/../index/<name>.cdxj`` (a data dir's layout), else beside it."""
    seg_dir = os.path.dirname(os.path.abspath(path))
    for candidate in (cdxj.cdxj_path(path, os.path.join(os.path.dirname(seg_dir), "index")),
                      cdxj.cdxj_path(path, seg_dir)):
        if os.path.isfile(candidate):
            return candidate
    return None


def verify(path: str, *, index_path: str | None = None, check_index: bool = True) -> VerifyReport:
    """Verify a .warc.gz segment (see the module docstring). ``index_path``: the CDXJ to compare
    (default: :func:`find_index`; none found is a warning); ``check_index=False`` skips it."""
    report = VerifyReport(path)
    problem = file_problem(path)
    if problem:
        report.errors.append(problem)
        return report
    try:
        _walk(report, path)
        if report.records == 0:
            return report
        _check_with_warcio(report, path)
        if check_index:
            _check_index(report, path, index_path or find_index(path))
    except OSError as e:       # read error in the middle (EIO), or the file vanished
        report.errors.append(f"cannot read: {e.strerror or e}")
    return report


def file_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as a WARC segment or index (missing, a directory, unreadable,
    empty), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as e:
        return f"cannot stat: {e.strerror or e}"
    if os.path.isdir(path):
        return "is a directory, not a WARC segment"
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        return f"cannot read: {e.strerror or e}"
    if st.st_size == 0:
        return "empty file (0 bytes): no records"
    return None


class _Order:
    """What the record-order checks remember over one walk: ids seen (in order), the warcinfo id,
    the request waiting for its response, and every WARC-Concurrent-To to resolve at the end."""

    def __init__(self):
        self.ids: dict[str, int] = {}                 # record id -> offset
        self.payloads: dict[str, str] = {}            # record id -> payload digest
        self.warcinfo = ""
        self.request: tuple[str, str, int] | None = None   # (request id, the id it names, offset)
        self.refs: list[tuple[int, str]] = []         # (offset, named id)


def _walk(report: VerifyReport, path: str) -> None:
    size = os.path.getsize(path)
    order = _Order()
    with open(path, "rb") as f:
        for member in iter_members(f, keep_all=True):
            where = f"record at offset {member.offset}"
            try:
                head = check_member(member)
            except (BadRecord, ValueError) as e:
                report.errors.append(f"{where}: {e}")
                break
            report.valid_bytes = member.offset + member.length
            rtype = head.type
            report.counts[rtype] = report.counts.get(rtype, 0) + 1
            block = member.head[head.block_offset:head.block_offset + head.content_length]
            _check_record(report, where, head, block, order)
            _check_order(report, where, member.offset, head, order, first=report.records == 0)
            report.records += 1
    if report.records == 0:         # nothing else to say about a file that is not a segment
        report.errors[:] = ["no whole WARC record at offset 0 (not a gzip-per-record WARC?)"
                            + (f": {report.errors[0].split(': ', 1)[-1]}" if report.errors else "")]
        return
    if report.valid_bytes < size and not report.errors:
        report.errors.append(f"{size - report.valid_bytes} bytes at offset {report.valid_bytes} "
                             "are not a whole gzip member")
    elif report.valid_bytes < size:
        report.errors.append(f"records after offset {report.valid_bytes} not checked")
    if order.request is not None:
        report.errors.append(f"record at offset {order.request[2]}: request without the record it names "
                             f"({order.request[1]}) after it")
    for offset, ref in order.refs:
        if ref not in order.ids:
            report.errors.append(f"record at offset {offset}: WARC-Concurrent-To {ref} is not in this segment")


def _check_record(report: VerifyReport, where: str, head, block: bytes, order: _Order) -> None:
    rtype = head.type
    if rtype not in _KNOWN_TYPES:
        report.errors.append(f"{where}: unknown WARC-Type {rtype!r}")
    rid = head.get("WARC-Record-ID")
    if not rid:
        report.errors.append(f"{where}: no WARC-Record-ID")
    elif rid in order.ids:
        report.errors.append(f"{where}: duplicate WARC-Record-ID {rid}")
    if not head.get("WARC-Date"):
        report.errors.append(f"{where}: no WARC-Date")
    block_digest = head.get("WARC-Block-Digest")
    if block_digest:
        match = digest_matches(block_digest, block)
        if match is None:
            report.warnings.append(f"{where}: block digest algorithm not checked: {block_digest}")
        elif not match:
            report.errors.append(f"{where}: WARC-Block-Digest {block_digest} does not match the block")
    payload = head.get("WARC-Payload-Digest")
    if payload and rtype == "response" and (head.get("Content-Type") or "").startswith("application/http"):
        http_head, body = http_split(block)
        chunked = is_chunked(http_head)
        match = digest_matches(payload, dechunk(body) if chunked else body)
        if match is None:
            report.warnings.append(f"{where}: payload digest algorithm not checked: {payload}")
        elif not match:
            if chunked and digest_matches(payload, body):
                # Some writers digest the body with its chunked coding kept.
                report.warnings.append(f"{where}: payload digest taken over the chunked body")
            else:
                report.errors.append(f"{where}: WARC-Payload-Digest {payload} does not match the payload")
    if rtype == "revisit":
        profile = head.get("WARC-Profile") or ""
        if not profile:
            report.errors.append(f"{where}: revisit without WARC-Profile")
        elif profile.endswith(_IDENTICAL) and not payload:
            report.errors.append(f"{where}: identical-payload-digest revisit without WARC-Payload-Digest")
        if not head.get("WARC-Refers-To-Target-URI") and not head.get("WARC-Refers-To"):
            report.warnings.append(f"{where}: revisit names no capture (no WARC-Refers-To-Target-URI)")
        original = head.get("WARC-Refers-To")
        if original and original in order.payloads and payload and order.payloads[original] != payload:
            report.errors.append(f"{where}: payload digest {payload} differs from that of the record it "
                                 f"refers to ({order.payloads[original]})")
    if rid and payload:
        order.payloads[rid] = payload


def _check_order(report: VerifyReport, where: str, offset: int, head, order: _Order, first: bool) -> None:
    rtype, rid = head.type, head.get("WARC-Record-ID") or ""
    concurrent = [v for k, v in head.fields if k.lower() == "warc-concurrent-to"]
    if first and rtype != "warcinfo":
        report.errors.append(f"{where}: the first record is {rtype!r}, not 'warcinfo'")
    if rtype == "warcinfo" and not order.warcinfo:
        order.warcinfo = rid
    info = head.get("WARC-Warcinfo-ID")
    if info and order.warcinfo and info != order.warcinfo:
        report.errors.append(f"{where}: WARC-Warcinfo-ID {info} is not this segment's warcinfo")
    if order.request is not None:
        req_id, named, req_offset = order.request
        if rid == named:
            if req_id not in concurrent:
                report.errors.append(f"{where}: {rtype} named by the request at offset {req_offset} does not "
                                     f"name it back (WARC-Concurrent-To {', '.join(concurrent) or 'missing'})")
            order.request = None
        elif rtype in ("request", "response", "revisit"):
            report.errors.append(f"record at offset {req_offset}: request names {named}, but the next capture "
                                 f"record is {rid}")
            order.request = None
    if rtype == "request" and concurrent:
        order.request = (rid, concurrent[0], offset)
    if rtype == "metadata":
        for ref in concurrent:
            if ref not in order.ids:
                report.errors.append(f"{where}: metadata comes before the record it describes ({ref})")
    for ref in concurrent:
        order.refs.append((offset, ref))
    if rid:
        order.ids[rid] = offset


def _check_with_warcio(report: VerifyReport, path: str) -> None:
    count = 0
    try:
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                record.raw_stream.read()
                count += 1
    except (ArchiveLoadFailed, EOFError, ValueError) as e:
        report.errors.append(f"warcio stopped after {count} records: {e}")
        return
    if count != report.records and report.valid_bytes == os.path.getsize(path):
        report.errors.append(f"warcio read {count} records, the member walk {report.records}")


def _check_index(report: VerifyReport, path: str, index_path: str | None) -> None:
    if index_path is None:
        report.warnings.append(f"no CDXJ index found for it (looked for {os.path.basename(cdxj.cdxj_path(path))} "
                               "in ../index/ and beside it)")
        return
    problem = file_problem(index_path)
    if problem and problem.startswith("empty"):
        problem = None                        # a segment with nothing indexed has an empty CDXJ
    if problem:
        report.errors.append(f"CDXJ {index_path}: {problem}")
        return
    report.index_path = index_path
    with tempfile.TemporaryDirectory(prefix="crawlerd-verify-") as tmp:
        expected = os.path.join(tmp, "expected.cdxj")
        cdxj.write_index(path, expected)
        with open(expected, "rb") as want, open(index_path, "rb") as have:
            missing, extra, unsorted, n = _compare_sorted(want, have)
    report.index_lines = n
    name = os.path.basename(index_path)
    if unsorted:
        report.errors.append(f"CDXJ {name}: line {unsorted} is out of order (the file must be sorted bytewise)")
    for label, lines in (("missing from", missing), ("not from this segment, in", extra)):
        if lines:
            shown = "; ".join(line[:400] for line in lines[:_MAX_INDEX_EXAMPLES])
            more = f" (and {len(lines) - _MAX_INDEX_EXAMPLES} more)" if len(lines) > _MAX_INDEX_EXAMPLES else ""
            report.errors.append(f"{len(lines)} index lines {label} CDXJ {name}: {shown}{more}")


def _compare_sorted(want, have) -> tuple[list[str], list[str], int, int]:
    """Merge-compare two sorted line files: (lines only in want, lines only in have, number of the
    first out-of-order line of have or 0, lines in have). Keeps only the differing lines."""
    missing: list[str] = []
    extra: list[str] = []
    unsorted = 0
    n = 0
    prev = b""
    w = want.readline()
    h = have.readline()
    while w or h:
        if h and h < prev and not unsorted:
            unsorted = n + 1
        if w and (not h or w < h):
            missing.append(w.rstrip(b"\n").decode("utf-8", "replace"))
            w = want.readline()
        elif h and (not w or h < w):
            extra.append(h.rstrip(b"\n").decode("utf-8", "replace"))
            prev, n, h = h, n + 1, have.readline()
        else:
            prev, n = h, n + 1
            w, h = want.readline(), have.readline()
    return missing, extra, unsorted, n

