"""Outlinks of one page: raw hrefs in, normalised fingerprinted :class:`Link` records out.

This runs once per extracted href (tens of millions an hour), so the common
case avoids the general RFC 3986 path: an href that is already an absolute,
network-path (``//host/...``), root-relative, plain relative, query-only
(``?q``) or fragment-only (``#f``) reference made only of characters that need
no escaping is assembled directly from the page's normalised base, its dot
segments removed (``remove_dot_segments``, as ``normalize`` does); its authority
goes through :func:`crawlerd.url.canonical.normalize_authority`, whose
per-process LRU cache makes repeat hosts a dictionary hit. Everything
else takes :func:`crawlerd.url.canonical.normalize`. Both paths give the same string
(a property test checks it).
"""

from __future__ import annotations

import re

from xxhash import xxh3_64_intdigest

from crawlerd.records import Link
from crawlerd.url.canonical import (
    PATH_CHARS,
    QUERY_CHARS,
    normalize,
    normalize_authority,
    parse_base,
    remove_dot_segments,
)
from crawlerd.url.hosts import host_key

__all__ = ["links_from_page"]

# Absolute or network-path reference with a plain authority (no userinfo, no IPv6 literal).
_ABSOLUTE = re.compile(
    rf"(?:(https?):)?//([A-Za-z0-9_.\-]+(?::[0-9]{{1,5}})?)(/[{PATH_CHARS}]*)?(?:\?([{QUERY_CHARS}]*))?(?:#.*)?",
    re.S)
_NETWORK_PREFIXES = ("http", "//")     # candidates for _ABSOLUTE
# Same-authority reference: a root-relative path (not "//"), or a relative path without ":" (else its
# first segment could read as a scheme; "./x", "../x" included); or no path at all ("?q", "#f", "").
_NO_COLON = PATH_CHARS.replace(":", "")
_SAME_HOST = re.compile(
    rf"(/(?!/)[{PATH_CHARS}]*|[{_NO_COLON.replace('/', '')}][{_NO_COLON}]*)?"
    rf"(?:\?([{QUERY_CHARS}]*))?(?:#.*)?", re.S)


def links_from_page(hrefs: list[tuple[str, bool]], base_url: str, *,
                    max_url_length: int = 2048) -> list[Link]:
    """Resolve, normalise and fingerprint a page's ``(href, nofollow)`` pairs, in first-seen order.

    Duplicate results are merged: a URL is ``nofollow`` only if every occurrence
    of it was. Hrefs that do not give an http(s) URL, or give one longer than
    ``max_url_length``, are dropped.
    """
    base = parse_base(base_url)
    if base is None:
        scheme = key = base_dir = base_path = here = ""
    else:
        scheme, base_dir, base_path = base.scheme, base.dir, base.path
        key = f"{scheme}://{base.netloc}"
        here = f"{key}{base_path}?{base.query}" if base.query else key + base_path    # the base, normalised
    absolute, same_host = _ABSOLUTE.fullmatch, _SAME_HOST.fullmatch
    out: dict[str, Link] = {}
    # No dedup of hrefs first: a repeated href gives the same URL, merged below (extract's hrefs are unique).
    for href, nofollow in hrefs:
        url = None
        if base is not None:
            if href.startswith(_NETWORK_PREFIXES):
                m = absolute(href)
                if m is not None:
                    link_scheme, authority, path, query = m.groups()
                    link_scheme = link_scheme or scheme
                    netloc = normalize_authority(link_scheme, authority)
                    if netloc is None:
                        continue
                    if path is None:
                        path = "/"
                    elif "/." in path:
                        path = remove_dot_segments(path)
                    link_key = f"{link_scheme}://{netloc}"
                    url = f"{link_key}{path}?{query}" if query else link_key + path
            else:
                m = same_host(href)
                if m is not None:
                    path, query = m.groups()
                    if path is None:
                        # "?q" keeps the base path; "" and "#f" are the base itself (RFC 3986 §5.2.2)
                        url = here if query is None else (f"{key}{base_path}?{query}" if query
                                                          else key + base_path)
                    else:
                        if path[0] != "/":
                            path = base_dir + path
                        if "/." in path:
                            path = remove_dot_segments(path)
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
        if link is None:
            out[url] = Link(url, xxh3_64_intdigest(url.encode()), link_key, nofollow)
        elif not nofollow:
            link.nofollow = False
    return list(out.values())
