"""``crawlerd warc verify``: check that a segment is whole and its digests hold.

Two independent readings of the same file: our member walk (every gzip member
is one record whose Content-Length, trailer, WARC-Block-Digest and, for
responses, WARC-Payload-Digest hold) and warcio's ArchiveIterator (every record
parses and the count agrees). Anything after the last whole record is an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass, field

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

from crawlerd.store.cdxj import index
from crawlerd.store.segment import BadRecord, check_member, dechunk, http_split, is_chunked, iter_members

__all__ = ["VerifyReport", "digest_matches", "index", "verify"]   # index: for `crawlerd warc index`

_KNOWN_TYPES = frozenset({"warcinfo", "response", "resource", "request", "metadata", "revisit",
                          "conversion", "continuation"})


@dataclass(slots=True)
class VerifyReport:
    """Result of verifying one segment; ``ok`` iff no errors."""

    path: str
    records: int = 0
    counts: dict[str, int] = field(default_factory=dict)   # WARC-Type -> records
    valid_bytes: int = 0                                    # compressed bytes of whole records from the start
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        state = "ok" if self.ok else f"FAILED ({len(self.errors)} errors)"
        return f"{self.path}: {state}: {self.records} records {counts}".rstrip()


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


def verify(path: str) -> VerifyReport:
    """Verify every record of a .warc.gz segment; see the module docstring for what is checked."""
    report = VerifyReport(path)
    size = os.path.getsize(path)
    ids: set[str] = set()
    with open(path, "rb") as f:
        for member in iter_members(f, keep_all=True):
            where = f"record at offset {member.offset}"
            try:
                head = check_member(member)
            except (BadRecord, ValueError) as e:
                report.errors.append(f"{where}: {e}")
                break
            report.valid_bytes = member.offset + member.length
            report.records += 1
            rtype = head.type
            report.counts[rtype] = report.counts.get(rtype, 0) + 1
            block = member.head[head.block_offset:head.block_offset + head.content_length]
            _check_record(report, where, head, block, ids)
    if report.valid_bytes < size and not report.errors:
        report.errors.append(f"{size - report.valid_bytes} bytes at offset {report.valid_bytes} "
                             "are not a whole gzip member")
    elif report.valid_bytes < size:
        report.errors.append(f"records after offset {report.valid_bytes} not checked")
    _check_with_warcio(report, path)
    return report


def _check_record(report: VerifyReport, where: str, head, block: bytes, ids: set[str]) -> None:
    rtype = head.type
    if rtype not in _KNOWN_TYPES:
        report.errors.append(f"{where}: unknown WARC-Type {rtype!r}")
    rid = head.get("WARC-Record-ID")
    if not rid:
        report.errors.append(f"{where}: no WARC-Record-ID")
    elif rid in ids:
        report.errors.append(f"{where}: duplicate WARC-Record-ID {rid}")
    else:
        ids.add(rid)
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


def _check_with_warcio(report: VerifyReport, path: str) -> None:
    count = 0
    try:
        with open(path, "rb") as f:
            for record in ArchiveIterator(f):
                record.raw_stream.read()
                count += 1
    except (ArchiveLoadFailed, OSError, EOFError, ValueError) as e:
        report.errors.append(f"warcio stopped after {count} records: {e}")
        return
    if count != report.records and report.valid_bytes == os.path.getsize(path):
        report.errors.append(f"warcio read {count} records, the member walk {report.records}")
