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
(a property test checks it). The loop is a native kernel (``crawlerd._native.links``,
reference ``links_ref.py``).
"""

from __future__ import annotations

from xxhash import xxh3_64_intdigest

from crawlerd._native.links import LinkResolver
from crawlerd.records import Link
from crawlerd.url.canonical import normalize, normalize_authority, parse_base, remove_dot_segments
from crawlerd.url.hosts import host_key

__all__ = ["links_from_page", "RESOLVER_HELPERS"]

# what the resolver (native kernel or its reference) is given to work with
RESOLVER_HELPERS = (normalize_authority, normalize, host_key, remove_dot_segments, Link, xxh3_64_intdigest)
resolver = LinkResolver(*RESOLVER_HELPERS)     # the native kernel (links_ref.py: its reference)


def links_from_page(hrefs: list[tuple[str, bool]], base_url: str, *,
                    max_url_length: int = 2048) -> list[Link]:
    """Resolve, normalise and fingerprint a page's ``(href, nofollow)`` pairs, in first-seen order.

    Duplicate results are merged: a URL is ``nofollow`` only if every occurrence
    of it was. Hrefs that do not give an http(s) URL, or give one longer than
    ``max_url_length``, are dropped.
    """
    return resolver.resolve(hrefs, base_url, parse_base(base_url), max_url_length)
