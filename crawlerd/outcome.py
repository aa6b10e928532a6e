"""How a fetch or a URL ends: one named outcome, counted and logged by name.

Every transfer ends in exactly one :class:`Outcome`. An HTTP answer of any
status is ``ok`` at the transport level (the status code is recorded beside
it); the other values name why no usable answer came back, or why the URL was
never fetched at all.
"""

import errno
import os
from enum import StrEnum


class Outcome(StrEnum):
    # an HTTP answer arrived and was kept
    OK = "ok"
    NOT_MODIFIED = "not_modified"          # 304 to a conditional GET
    # the URL was not fetched
    ROBOTS_DENIED = "robots_denied"        # robots.txt disallows the path
    ROBOTS_UNAVAILABLE = "robots_unavailable"  # robots.txt 5xx / unreachable: disallow all for now
    BLOCKED = "blocked"                    # operator blocklist
    BLOCKED_ADDRESS = "blocked_address"    # address guard refused the IP
    UNSUPPORTED_SCHEME = "unsupported_scheme"
    URL_TOO_LONG = "url_too_long"
    BAD_URL = "bad_url"
    TOO_MANY_REDIRECTS = "too_many_redirects"
    DUST_SKIPPED = "dust_skipped"          # a trusted DUST rule maps it onto content already archived
    DEAD_LETTER = "dead_letter"            # gave up after max attempts
    ABORTED = "aborted"                    # abandoned at shutdown (URL stays queued)
    # DNS
    DNS_NXDOMAIN = "dns_nxdomain"
    DNS_SERVFAIL = "dns_servfail"
    DNS_TIMEOUT = "dns_timeout"
    DNS_ERROR = "dns_error"
    # transport
    CONNECT_REFUSED = "connect_refused"
    CONNECT_TIMEOUT = "connect_timeout"
    TIMEOUT = "timeout"                    # total transfer time exceeded
    TOO_SLOW = "too_slow"                  # below the low-speed limit (drip)
    TOO_LARGE = "too_large"                # raw or decoded body over its cap
    HEADERS_TOO_LARGE = "headers_too_large"
    CONNECTION_RESET = "connection_reset"
    TLS_ERROR = "tls_error"
    BAD_RESPONSE = "bad_response"          # not HTTP, or malformed framing
    BAD_ENCODING = "bad_encoding"          # content-encoding could not be decoded
    NETWORK_ERROR = "network_error"        # any other transport failure
    # processing
    PROCESS_ERROR = "process_error"        # the processor raised on this response (bug); raw record kept
    PROCESS_CRASHED = "process_crashed"    # workers died processing this response (poison page)


# Outcomes after which the host is backed off (transport trouble, not content).
BACKOFF_OUTCOMES = frozenset({
    Outcome.DNS_SERVFAIL, Outcome.DNS_TIMEOUT, Outcome.DNS_ERROR,
    Outcome.CONNECT_REFUSED, Outcome.CONNECT_TIMEOUT, Outcome.TIMEOUT, Outcome.TOO_SLOW,
    Outcome.CONNECTION_RESET, Outcome.TLS_ERROR, Outcome.BAD_RESPONSE, Outcome.NETWORK_ERROR,
})


# What a failed write says about the storage (status lines: "paused (disk full: <path>)").
_STORAGE_KINDS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk full", errno.EROFS: "read-only",
                  errno.EIO: "I/O error", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                  errno.EFBIG: "file too large"}


def storage_error(err: BaseException, path: str) -> str:
    """``"<kind>: <path>"`` for a failed write (an OSError, or an error whose text carries one)."""
    code = getattr(err, "errno", None)
    kind = _STORAGE_KINDS.get(code) if code is not None else None
    if kind is None:
        text = str(err)
        kind = next((name for c, name in _STORAGE_KINDS.items() if os.strerror(c) in text), "write error")
    return f"{kind}: {path}"
