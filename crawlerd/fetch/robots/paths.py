"""robots.txt paths: the path part of a URL and the percent-encoding both sides are matched in.

RFC 9309 §2.2.2 with RFC 3986 §2.3: ``%XX`` of an unreserved character is decoded, any other
``%XX`` is upper-cased, a ``%`` not starting ``%XX`` is ``%25``, and every octet outside printable ASCII (non-ASCII as UTF-8, controls,
space) is %-encoded. Applied to rules and URLs alike, so a rule and a path that name the same
resource compare equal octet for octet.

RFC 9309 §2.2.3: in a rule ``*`` and a final ``$`` are special, and ``%2A`` / ``%24`` stand
for the literal characters. Paths are matched with ``%2A`` and ``%24`` decoded
(:func:`match_path`), so a rule's ``%2A`` matches a URL's ``*`` however the URL spells it;
the rule compiler decodes them in the literal pieces it cuts at the wildcards
(:func:`literal`). Decoding (not encoding) keeps every ``%`` of a path the start of a
``%XX`` triplet, so a rule can never match across one.
"""

from __future__ import annotations

import re

__all__ = ["is_canonical", "literal", "match_path", "normalize_path", "normalize_patterns", "path_of"]

# A token is one character that is "%" or outside printable ASCII, and up to two hex digits
# after it (so "%XX" is one token); a single character class keeps the scan fast.
_NORM_TOKEN = re.compile(r"[^\x21-\x24\x26-\x7e][0-9A-Fa-f]{0,2}")
_NORM_TOKEN_LINES = re.compile(r"[^\x21-\x24\x26-\x7e\n][0-9A-Fa-f]{0,2}")     # keeps newlines
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

# Optional "scheme://" or "//", the authority, then (group 1) path, params and query.
_AFTER_AUTHORITY = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.\-]*://|//)?[^/?;#]*([^#]*)")


def _octets(text: str) -> bytes:
    try:
        # surrogateescape gives back the raw bytes of a body that was not valid UTF-8
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _norm_repl(m: re.Match) -> str:
    token = m.group(0)
    if token[0] == "%":
        if len(token) < 3:
            return "%25" + token[1:]    # a "%" not followed by two hex digits is a literal "%"
        octet = int(token[1:], 16)
        return chr(octet) if octet in _UNRESERVED else token.upper()
    return "".join(f"%{b:02X}" for b in _octets(token[0])) + token[1:]


def is_canonical(text: str) -> bool:
    """True if normalisation cannot change ``text`` (printable ASCII without "%" or space)."""
    return text.isascii() and "%" not in text and " " not in text and text.isprintable()


def normalize_path(path: str) -> str:
    """Path (and query) in the canonical percent-encoding used for matching (RFC 9309 §2.2.2)."""
    return path if is_canonical(path) else _NORM_TOKEN.sub(_norm_repl, path)


def match_path(url: str) -> str:
    """The path of ``url`` as rules are matched against it: canonical, ``%2A`` and ``%24`` decoded."""
    path = path_of(url)
    if not is_canonical(path):
        path = _NORM_TOKEN.sub(_norm_repl, path)
    if "%2" in path:
        path = literal(path)
    return path


def literal(piece: str) -> str:
    """A canonical rule piece or path with ``%2A`` and ``%24`` as the characters they encode."""
    return piece.replace("%2A", "*").replace("%24", "$")


def normalize_patterns(patterns: list[str]) -> list[str]:
    """Rule patterns (no newline in any) in canonical percent-encoding (``%2A``, ``%24`` kept)."""
    joined = "\n".join(patterns)      # normalise them all in one pass
    if not is_canonical(joined.replace("\n", "")):
        patterns = _NORM_TOKEN_LINES.sub(_norm_repl, joined).split("\n")
    return patterns


def path_of(url: str) -> str:
    """Path, params and query of an absolute URL or of a path; "/" when there is none.

    The fragment is dropped. Without a scheme the first segment is taken as the authority
    ("example.com/a" -> "/a"), as google/robotstxt does.
    """
    if url[:1] == "/" and url[1:2] != "/":
        end = url.find("#")
        return url if end < 0 else url[:end]
    rest = _AFTER_AUTHORITY.match(url).group(1)
    if not rest:
        return "/"
    return rest if rest[0] == "/" else "/" + rest
