"""robots.txt lines to the rules of the group that applies to one product token (RFC 9309 §2.2).

Where Google's parser (google/robotstxt) is more lenient than the RFC and the leniency is
harmless, it is followed: a missing colon, misspelt directive names, partial UTF-8 BOMs, lines
cut at 16663 bytes.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["Groups", "parse_groups"]

# Google cuts lines at 2083 * 8 - 1 bytes; we cut at as many characters (same for ASCII).
_MAX_LINE = 2083 * 8 - 1
_UTF8_BOM = b"\xef\xbb\xbf"

_UA, _ALLOW, _DISALLOW, _DELAY, _SITEMAP = range(5)
# Directive names, lower-cased, with the common misspellings Google also accepts.
_DIRECTIVES = {
    "user-agent": _UA, "useragent": _UA, "user agent": _UA,
    "allow": _ALLOW,
    "disallow": _DISALLOW, "dissallow": _DISALLOW, "dissalow": _DISALLOW, "disalow": _DISALLOW,
    "diasllow": _DISALLOW, "disallaw": _DISALLOW,
    "crawl-delay": _DELAY, "crawldelay": _DELAY,
    "sitemap": _SITEMAP, "site-map": _SITEMAP,
}
_SPACES = " \t\v\f"
# RFC 9309 §2.2.1: the product token is [a-zA-Z_-]+; what follows it ("Foo/1.0", "Foo Bar") is not.
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_-")


class Groups(NamedTuple):
    """What applies to one token: ``rules`` as (allow, pattern as written) in file order,
    the group's Crawl-delay in seconds (None if absent), and every Sitemap URL of the file."""

    rules: list[tuple[bool, str]]
    crawl_delay: float | None
    sitemaps: list[str]


def parse_groups(body: bytes, agent_token: str, max_bytes: int) -> Groups:
    """Parse the first ``max_bytes`` of a robots.txt body for ``agent_token`` (a product token).

    The group whose user-agent matches the token case-insensitively is used, all such groups
    merged (RFC 9309 §2.2.1); else the ``*`` groups, merged; else nothing is disallowed.
    Lines that are not understood are skipped and do not end a group (§2.2.4).
    """
    if len(body) > max_bytes:
        # RFC 9309 §2.5: parse at least 500 KiB; a line cut by the limit is dropped, as its
        # rule would be broader than the one written
        body = body[:max_bytes]
        body = body[:max(body.rfind(b"\n"), body.rfind(b"\r")) + 1]
    if body[:1] == b"\xef":
        if body.startswith(_UTF8_BOM):
            body = body[3:]
        else:       # a partial BOM, skipped as Google does
            body = body[2:] if body[1:2] == b"\xbb" else body[1:]
    text = body.decode("utf-8", "surrogateescape")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if len(text) > _MAX_LINE:
        lines = text.split("\n")
        if max(map(len, lines)) > _MAX_LINE:
            text = "\n".join(line[:_MAX_LINE] for line in lines)
    # a token with other characters ("Foo Bar", "Foo/1.0") can match no user-agent line
    agent = agent_token.lower() if _TOKEN_CHARS.issuperset(agent_token) else ""
    agent_len = len(agent)

    specific: list[tuple[bool, str]] = []    # rules of the groups naming our token
    fallback: list[tuple[bool, str]] = []    # rules of the "*" groups
    delay_specific: float | None = None     # crawl-delay of the groups naming our token
    group_delay: float | None = None        # crawl-delay of the current group
    delay_fallback: float | None = None
    sitemaps: list[str] = []
    seen_specific = seen_fallback = False
    in_specific = in_fallback = False        # the current group applies to us / to "*"
    in_agent_lines = False                   # inside the user-agent lines that open a group

    for line in text.split("\n"):
        if not line:
            continue
        key, colon, value = line.partition(":")
        kind = _DIRECTIVES.get(key.lower())
        if kind is None:
            # not a plain "Key: value" line: spaces around the key, a comment, garbage, or
            # Google's leniency "Key value" (no colon, exactly two words)
            cut = line.find("#")
            if cut >= 0:
                line = line[:cut]
                key, colon, value = line.partition(":")
            if colon:
                kind = _DIRECTIVES.get(key.strip(_SPACES).lower())
            else:
                words = line.split()
                if len(words) == 2:
                    kind = _DIRECTIVES.get(words[0].lower())
                    value = words[1]
            if kind is None:
                continue
        elif "#" in value:
            value = value[:value.index("#")]
        value = value.strip(_SPACES)
        if kind == _ALLOW or kind == _DISALLOW:
            in_agent_lines = False
            if value:
                rule = (kind == _ALLOW, value)
                if in_specific:
                    specific.append(rule)
                if in_fallback:
                    fallback.append(rule)
        elif kind == _UA:
            if not in_agent_lines:
                if group_delay is not None:
                    if in_specific:
                        delay_specific = max(group_delay, delay_specific or 0.0)
                    if in_fallback:
                        delay_fallback = max(group_delay, delay_fallback or 0.0)
                in_agent_lines = True
                in_specific = in_fallback = False
                group_delay = None
            if value[:1] == "*" and (len(value) == 1 or value[1] in _SPACES):
                in_fallback = seen_fallback = True
            elif agent and value[:agent_len].lower() == agent and (
                    len(value) == agent_len or value[agent_len] not in _TOKEN_CHARS):
                in_specific = seen_specific = True
        elif kind == _DELAY:
            # not in RFC 9309 (§2.2.4 other records): it belongs to the current group (also
            # to user-agent lines after it, as it does not end them); the largest value
            # wins when groups merge
            delay = _parse_delay(value)
            if delay is not None:
                group_delay = delay if group_delay is None else max(delay, group_delay)
        elif value:      # sitemap: not tied to any group
            sitemaps.append(value)
    if group_delay is not None:
        if in_specific:
            delay_specific = max(group_delay, delay_specific or 0.0)
        if in_fallback:
            delay_fallback = max(group_delay, delay_fallback or 0.0)

    if seen_specific:
        raw, delay = specific, delay_specific
    elif seen_fallback:
        raw, delay = fallback, delay_fallback
    else:
        raw, delay = [], None
    return Groups(raw, delay, sitemaps)


def _parse_delay(value: str) -> float | None:
    try:
        delay = float(value)
    except ValueError:
        return None
    return delay if math.isfinite(delay) and delay >= 0 else None
