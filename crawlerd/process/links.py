"""Outlinks of one page: raw hrefs in, normalised fingerprinted :class:`Link` records out.

This runs once per extracted href (tens of millions an hour), so the common
case avoids the general RFC 3986 path: an href that is already an absolute,
network-path (``//host/...``), root-relative, plain relative, query-only
(``?q``) or fragment-only (``#f``) reference made only of characters that need
no escaping, with no dot segments, is assembled directly from the page's
normalised base; its authority goes through :func:`crawlerd.url.normalize_authority`,
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
# Same-authority reference: a root-relative path (not "//"), or a relative path without ":" (else its
# first segment could read as a scheme) that does not start with "."; or no path at all ("?q", "#f", "").
_NO_COLON = PATH_CHARS.replace(":", "")
_SAME_HOST = re.compile(
    rf"(/(?!/)[{PATH_CHARS}]*|[{_NO_COLON.replace('.', '').replace('/', '')}][{_NO_COLON}]*)?"
    rf"(?:\?([{QUERY_CHARS}]*))?(?:#.*)?", re.S)


def _absolute(href: str, scheme: str) -> tuple[str, str] | None | bool:
    """(normalised URL, host key) of a clean absolute or ``//`` href; None for an invalid host;
    False when the general path must decide."""
    m = _ABSOLUTE.fullmatch(href)
    if m is None:
        return False
    scheme = m.group(1) or scheme
    netloc = normalize_authority(scheme, m.group(2))
    if netloc is None:
        return None
    path = m.group(3) or "/"
    if "/." in path:
        return False                    # dot segments: let the general path remove them
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
        scheme = key = base_dir = base_path = here = ""
    else:
        scheme, base_dir, base_path = base.scheme, base.dir, base.path
        key = f"{scheme}://{base.netloc}"
        here = f"{key}{base_path}?{base.query}" if base.query else key + base_path    # the base, normalised
    same_host = _SAME_HOST.fullmatch
    out: dict[str, Link] = {}
    for href, nofollow in unique.items():
        url = None
        if base is not None:
            first = href[:1]
            if href[:4] == "http" or href[:2] == "//":
                fast = _absolute(href, scheme)
                if fast is None:
                    continue
                if fast:
                    url, link_key = fast
            else:
                m = same_host(href)
                if m is not None:
                    path, query = m.groups()
                    if path is None:
                        # "?q" keeps the base path; "" and "#f" are the base itself (RFC 3986 §5.2.2)
                        url = here if query is None else (f"{key}{base_path}?{query}" if query
                                                          else key + base_path)
                    else:
                        if first != "/":
                            path = base_dir + path
                        if "/." not in path:
                            url = f"{key}{path}?{query}" if query else key + path
                    link_key = key
        if url is None:
            url = normalize(href, base_url)
            if url is None:
                continue
            link_key = host_key(url)
        if len(url) > max_url_length:
            continue
        link = out.get(url)
        if link is not None:
            if not nofollow:
                link.nofollow = False
            continue
        out[url] = Link(url, xxh3_64_intdigest(url.encode()), link_key, nofollow)
    return list(out.values())
