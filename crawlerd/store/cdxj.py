"""CDXJ index lines: ``SURT TIMESTAMP14 {json}``, one per captured response.

The format is the one pywb and OutbackCDX read: a SURT-form key, the 14-digit
UTC capture time, then a JSON object with ``url, mime, status, digest,
length, offset, filename``. ``digest`` is the bare base32 SHA-1 of the payload
(no ``sha1:`` prefix, as pywb writes it); ``offset``/``length`` are the
compressed bytes of the record's gzip member in ``filename``. A file of lines
is sorted bytewise (``LC_ALL=C sort``) so that a binary search by key works.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str  # a JSON string literal, ASCII-only
from urllib.parse import urlsplit

from crawlerd.store.segment import (
    BadRecord,
    check_member,
    http_header,
    http_split,
    http_status,
    iter_members,
)

INDEXED_TYPES = frozenset({"response", "revisit", "resource"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}


def surt(url: str) -> str:
    """Sort-friendly URI Reordering Transform: ``http://www.Ex.com/a?b=2&a=1`` -> ``com,ex)/a?a=1&b=2``.

    Canonicalised as pywb does for lookup: lower case, no scheme, no ``www.``,
    no default port, no fragment, query arguments sorted.
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url.lower()
    host = (parts.hostname or "").strip(".")
    if host.startswith("www.") or (host.startswith("www") and host[3:4].isdigit() and "." in host):
        host = host.split(".", 1)[1]
    if host.replace(".", "").isdigit() or ":" in host:
        key = host                               # an IP address is not reversed
    else:
        key = ",".join(reversed(host.split(".")))
    if port is not None and str(port) != _DEFAULT_PORTS.get(parts.scheme.lower()):
        key += f":{port}"
    path = parts.path or "/"
    out = f"{key}){path}"
    if parts.query:
        out += "?" + "&".join(sorted(parts.query.split("&")))
    return out.lower()


def timestamp14(warc_date: str) -> str:
    """``2024-05-06T07:08:09.123456Z`` -> ``20240506070809``."""
    digits = "".join(c for c in warc_date[:19] if c.isdigit())
    return digits.ljust(14, "0")[:14]


@dataclass(slots=True)
class Capture:
    """What one CDXJ line says about one record."""

    url: str
    warc_date: str
    mime: str
    status: int
    digest: str          # "sha1:BASE32" or bare; written bare
    length: int
    offset: int
    filename: str

    def line(self) -> str:
        """``SURT TIMESTAMP14 {json}``; the JSON is byte for byte what ``json.dumps(fields)`` gives
        (a test holds it to that), assembled from escaped strings without building a dict."""
        q = _json_str
        status = f', "status": {q(str(self.status))}' if self.status else ""
        digest = f', "digest": {q(self.digest.split(":", 1)[-1])}' if self.digest else ""
        return (f'{surt(self.url)} {timestamp14(self.warc_date)} {{"url": {q(self.url)}, '
                f'"mime": {q(self.mime or "unk")}{status}{digest}, "length": {q(str(self.length))}, '
                f'"offset": {q(str(self.offset))}, "filename": {q(self.filename)}}}')


def mime_of(content_type: bytes | str | None) -> str:
    """Media type without parameters, lower case (``text/html; charset=x`` -> ``text/html``)."""
    if not content_type:
        return ""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return content_type.split(";", 1)[0].strip().lower()


def index(path: str) -> list[str]:
    """CDXJ lines, sorted, for the indexed records of one segment (.warc.gz or .warc.gz.open).

    Reads until the first member that is not a whole record (a torn tail).
    """
    filename = os.path.basename(path).removesuffix(".open")
    out = []
    with open(path, "rb") as f:
        for member in iter_members(f):
            try:
                head = check_member(member)
            except (BadRecord, ValueError):
                break
            if head.type not in INDEXED_TYPES:
                continue
            block = member.head[head.block_offset:]
            status, mime = 0, ""
            if head.type == "revisit":
                mime = "warc/revisit"
                status = http_status(block)
            elif (head.get("Content-Type") or "").startswith("application/http"):
                http_head, _ = http_split(block)
                status = http_status(http_head)
                mime = mime_of(http_header(http_head, b"content-type"))
            else:
                mime = mime_of(head.get("Content-Type"))
            out.append(Capture(
                url=head.get("WARC-Target-URI", "") or "", warc_date=head.get("WARC-Date", "") or "",
                mime=mime, status=status, digest=head.get("WARC-Payload-Digest", "") or "",
                length=member.length, offset=member.offset, filename=filename).line())
    out.sort(key=lambda s: s.encode("utf-8"))
    return out


def write_lines(lines: list[str], path: str) -> None:
    """Write sorted CDXJ lines to ``path`` atomically (temp name, fsync, rename; DESIGN §4)."""
    tmp = path + ".tmp"
    data = "".join(line + "\n" for line in sorted(lines, key=lambda s: s.encode("utf-8")))
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cdxj_path(segment_path: str, index_dir: str | None = None) -> str:
    """Where a segment's CDXJ goes: ``<index_dir>/<segment name without .warc.gz>.cdxj``."""
    name = os.path.basename(segment_path).removesuffix(".open").removesuffix(".gz").removesuffix(".warc")
    return os.path.join(index_dir or os.path.dirname(segment_path), name + ".cdxj")
