"""Host keys, hosts, ports and registered domains of normalised URLs.

The URLs given here are ones ``crawlerd.url.canonical.normalize`` returned:
``host_key`` is the politeness key (one queue per key), ``registered_domain``
the owner a per-domain budget follows, ``shard_of`` the crawl shard that owns it.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache

import xxhash
from publicsuffixlist import PublicSuffixList

from crawlerd.url.canonical import DEFAULT_PORTS

__all__ = ["host_key", "host_of", "port_of", "registered_domain", "shard_of", "shard_of_url"]


def _netloc(url: str) -> str:
    start = url.find("://")
    if start < 0 or url[:start] not in DEFAULT_PORTS:
        raise ValueError(f"not a normalised http(s) URL: {url!r}")
    start += 3
    end = url.find("/", start)
    return url[start:] if end < 0 else url[start:end]


def host_key(url: str) -> str:
    """``scheme://host[:port]`` of a normalised URL: the politeness key (one queue per key)."""
    start = url.find("://")
    end = url.find("/", start + 3) if start >= 0 else -1
    if start < 0 or url[:start] not in DEFAULT_PORTS:
        raise ValueError(f"not a normalised http(s) URL: {url!r}")
    return url if end < 0 else url[:end]


def host_of(url: str) -> str:
    """Host of a normalised URL, without port; an IPv6 literal without its brackets (for DNS)."""
    netloc = _netloc(url)
    if netloc.startswith("["):
        return netloc[1:netloc.index("]")]
    return netloc.partition(":")[0]


def port_of(url: str) -> int:
    """TCP port of a normalised URL: the explicit one, else 80/443 by scheme."""
    netloc = _netloc(url)
    tail = netloc[netloc.index("]") + 1:] if netloc.startswith("[") else netloc
    _, colon, port = tail.partition(":")
    return int(port) if colon else DEFAULT_PORTS[url[:url.index(":")]]


_PSL: PublicSuffixList | None = None


@lru_cache(maxsize=1 << 16)
def registered_domain(host: str) -> str:
    """Registrable domain (public suffix + one label) of a host; IPs and suffixes return themselves.

    Uses the list bundled with ``publicsuffixlist`` (offline), private section
    included, so ``alice.github.io`` is its own domain: its owner differs from
    ``bob.github.io``'s, and per-domain budgets follow owners.
    """
    global _PSL
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if bare[-1:].isdigit() or ":" in bare:      # an IPv4 literal ends in a digit, an IPv6 one has colons
        try:
            ipaddress.ip_address(bare)
            return host
        except ValueError:
            pass
    if _PSL is None:
        _PSL = PublicSuffixList()
    return _PSL.privatesuffix(host.lower()) or host.lower()


def shard_of(host: str, shards: int) -> int:
    """The crawl shard that owns ``host``: xxh3_64 of its registered domain, mod ``shards``.

    The one partition function of the crawl (seeds, sitemap entries, redirects, outlinks,
    ``seed add``, the hand-off): a registered domain's hosts, their politeness, robots and
    budget all live in one shard. ``shards`` is fixed for the life of a crawl (``crawl.json``).
    """
    if shards == 1:
        return 0
    return _domain_hash(host) % shards


@lru_cache(maxsize=1 << 16)
def _domain_hash(host: str) -> int:
    return xxhash.xxh3_64_intdigest(registered_domain(host).encode("utf-8", "surrogateescape"))


def shard_of_url(url: str, shards: int) -> int:
    """``shard_of`` the host of a normalised URL."""
    return 0 if shards == 1 else shard_of(host_of(url), shards)
