"""Pure-Python reference for ``crawlerd._native.links.LinkResolver`` (the same links, in the same order).

The fast path of :func:`crawlerd.process.links.links_from_page`: an href that is an absolute,
network-path, root-relative, plain relative, query-only or fragment-only reference made only of
characters that need no escaping is assembled from the page's normalised base (see that
module). Two regular expressions say which hrefs qualify; the native kernel scans for the
same character classes without them.
"""

from __future__ import annotations

import re

# RFC 3986 §3.3 pchar plus "/" (path) and §3.4 "/" "?" (query), without "%": the same classes as
# crawlerd.url.canonical.PATH_CHARS / QUERY_CHARS (a test holds them equal).
PATH_CHARS = r"A-Za-z0-9\-._~!$&'()*+,;=:@/"
QUERY_CHARS = PATH_CHARS + "?"
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


class LinkResolver:
    """Resolves a page's hrefs with the helpers it is given (so this module imports nothing of
    crawlerd): ``normalize_authority(scheme, authority)``, ``normalize(href, base_url)``,
    ``host_key(url)``, ``remove_dot_segments(path)``, ``link(url, fp, host_key, nofollow)``
    (the record made per URL) and ``fingerprint(url_bytes)``."""

    def __init__(self, normalize_authority, normalize, host_key, remove_dot_segments, link, fingerprint):
        self.normalize_authority = normalize_authority
        self.normalize = normalize
        self.host_key = host_key
        self.remove_dot_segments = remove_dot_segments
        self.link = link
        self.fingerprint = fingerprint

    def resolve(self, hrefs: list, base_url: str, base, max_url_length: int) -> list:
        """Links of ``(href, nofollow)`` pairs against ``base_url`` (``base``: its parsed form, a
        ``BaseUrl``, or None), in first-seen order; a URL is nofollow only if every occurrence was."""
        normalize_authority, remove_dot_segments = self.normalize_authority, self.remove_dot_segments
        if base is None:
            scheme = key = base_dir = base_path = here = ""
        else:
            scheme, base_dir, base_path = base.scheme, base.dir, base.path
            key = f"{scheme}://{base.netloc}"
            here = f"{key}{base_path}?{base.query}" if base.query else key + base_path    # the base, normalised
        absolute, same_host = _ABSOLUTE.fullmatch, _SAME_HOST.fullmatch
        out: dict = {}
        # No dedup of hrefs first: a repeated href gives the same URL, merged below.
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
                url = self.normalize(href, base_url)
                if url is None:
                    continue
                link_key = self.host_key(url)
            if len(url) > max_url_length:
                continue
            link = out.get(url)
            if link is None:
                out[url] = self.link(url, self.fingerprint(url.encode()), link_key, nofollow)
            elif not nofollow:
                link.nofollow = False
        return list(out.values())
