"""Outlinks of one page: raw hrefs in, normalised fingerprinted :class:`Link` records out.

This runs once per extracted href (tens of millions an hour), so the common
case avoids the general RFC 3986 path: an href that is already an absolute,
network-path (``//host/...``), root-relative or plain relative reference made
only of characters that need no escaping, with no dot segments, is assembled
directly; its authority goes through :func:`crawlerd.url.normalize_authority`,
whose per-process LRU cache makes repeat hosts a dictionary hit. Everything
else takes :func:`crawlerd.url.normalize`. Both paths give the same string
(a property test checks it).
"""

from __future__ import annotations

import re

from xxhash import xxh3_64_intdigest

from crawlerd.records import Link
from crawlerd.url import PATH_CHARS, QUERY_CHARS, host_key, normalize, normalize_authority, parse_base

__all__ = ["links_from_page"]

# Absolute or network-path reference with a plain authority (no userinfo, no IPv6 literal).
_ABSOLUTE = re.compile(
    rf"(?:(https?):)?//([A-Za-z0-9_.\-]+(?::[0-9]{{1,5}})?)(/[{PATH_CHARS}]*)?(?:\?(?P<q>[{QUERY_CHARS}]*))?(?:#.*)?",
    re.S)
_ROOT_RELATIVE = re.compile(rf"(/[{PATH_CHARS}]*)(?:\?(?P<q>[{QUERY_CHARS}]*))?(?:#.*)?", re.S)
# A relative path without ":" (else its first segment could read as a scheme) that does not start with ".".
_NO_COLON = PATH_CHARS.replace(":", "")
_RELATIVE = re.compile(
    rf"([{_NO_COLON.replace('.', '').replace('/', '')}][{_NO_COLON}]*)(?:\?(?P<q>[{QUERY_CHARS}]*))?(?:#.*)?", re.S)
_GENERAL = ("", "")     # _fast's answer when the general path must decide


def _fast(href: str, scheme: str, netloc: str, base_dir: str) -> tuple[str, str] | None:
    """(normalised URL, host key) for a clean href; None for an invalid host; _GENERAL when undecided."""
    first = href[:1]
    if first == "/":
        if href[:2] == "//":
            m = _ABSOLUTE.fullmatch(href)
            if m is None:
                return _GENERAL
            scheme = m.group(1) or scheme
            netloc = normalize_authority(scheme, m.group(2))
            if netloc is None:
                return None
            path = m.group(3) or "/"
        else:
            m = _ROOT_RELATIVE.fullmatch(href)
            if m is None:
                return _GENERAL
            path = m.group(1)
    elif first == "h" and href[:4] == "http":
        m = _ABSOLUTE.fullmatch(href)
        if m is None or m.group(1) is None:
            return _GENERAL
        scheme = m.group(1)
        netloc = normalize_authority(scheme, m.group(2))
        if netloc is None:
            return None
        path = m.group(3) or "/"
    else:
        m = _RELATIVE.fullmatch(href)
        if m is None:
            return _GENERAL
        path = base_dir + m.group(1)
    if "/." in path:
        return _GENERAL                 # dot segments: let the general path remove them
    key = f"{scheme}://{netloc}"
    query = m.group("q")
    return (f"{key}{path}?{query}" if query else key + path), key


def links_from_page(hrefs: list[tuple[str, bool]], base_url: str, *,
                    max_url_length: int = 2048) -> list[Link]:
    """Resolve, normalise and fingerprint a page's ``(href, nofollow)`` pairs, in first-seen order.

    Duplicate hrefs are dropped before normalising and duplicate results after;
    a URL is ``nofollow`` only if every occurrence of it was. Hrefs that do not
    give an http(s) URL, or give one longer than ``max_url_length``, are dropped.
    """
    unique: dict[str, bool] = {}
    for href, nofollow in hrefs:
        if unique.get(href, True):
            unique[href] = nofollow
    base = parse_base(base_url)
    if base is None:
        scheme = netloc = base_dir = ""
    else:
        scheme, netloc, base_dir = base.scheme, base.netloc, base.dir
    out: dict[str, Link] = {}
    for href, nofollow in unique.items():
        fast = _fast(href, scheme, netloc, base_dir) if base is not None else _GENERAL
        if fast is _GENERAL:
            url = normalize(href, base_url)
            if url is None:
                continue
            key = host_key(url)
        elif fast is None:
            continue
        else:
            url, key = fast
        if len(url) > max_url_length:
            continue
        link = out.get(url)
        if link is not None:
            if not nofollow:
                link.nofollow = False
            continue
        out[url] = Link(url, xxh3_64_intdigest(url.encode()), key, nofollow)
    return list(out.values())
