# cython: language_level=3, boundscheck=False, wraparound=False
"""A page's outlinks resolved against its base, in C: the fast path of ``links_from_page``.

Every extracted href passes here (tens of millions an hour). The reference (``links_ref.py``)
decides with two regular expressions which hrefs are plain enough to assemble from the page's
normalised base; this kernel scans the same character classes with one table lookup per
character, and keeps the per-link Python work to building the URL, its fingerprint and its
record. Everything else goes to the helpers it is given (``normalize`` and friends), exactly
as in the reference; one test class runs the same cases against both (tests/process/test_links.py).
"""

from cpython.unicode cimport PyUnicode_AsUTF8String

# character classes (ASCII only; anything else is in none)
cdef enum:
    AUTH = 1        # [A-Za-z0-9_.-]: a plain authority's host
    PATH = 2        # RFC 3986 pchar + "/", no "%": PATH_CHARS
    QUERY = 4       # PATH_CHARS + "?": QUERY_CHARS
    NO_COLON = 8    # PATH_CHARS without ":"
    FIRST = 16      # the first character of a relative path: NO_COLON without "/"
    DIGIT = 32      # [0-9]: a port

cdef unsigned char _CLASS[128]


cdef void _fill_classes():
    cdef int c
    cdef bytes path = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/"
    cdef bytes auth = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"
    for c in range(128):
        _CLASS[c] = 0
    for c in path:
        _CLASS[c] |= PATH | QUERY
        if c != 58:                     # ":"
            _CLASS[c] |= NO_COLON
            if c != 47:                 # "/"
                _CLASS[c] |= FIRST
    _CLASS[63] |= QUERY                 # "?"
    for c in auth:
        _CLASS[c] |= AUTH
    for c in range(48, 58):
        _CLASS[c] |= DIGIT


_fill_classes()


cdef inline bint _is(Py_UCS4 c, unsigned char cls) noexcept:
    return c < 128 and (_CLASS[c] & cls) != 0


cdef inline Py_ssize_t _scan(str s, Py_ssize_t i, Py_ssize_t n, unsigned char cls) noexcept:
    """First index at or after ``i`` whose character is not in ``cls`` (``n`` if none)."""
    while i < n and _is(s[i], cls):
        i += 1
    return i


cdef tuple _tail(str s, Py_ssize_t i, Py_ssize_t n, unsigned char path_cls):
    """``(matched, path, query)`` for ``s[i:]`` read as ``(path)? (?query)? (#anything)?``; a path
    is the character at ``i`` (the caller checked it may start one) and more of ``path_cls``,
    none when ``path_cls`` is 0; ``path`` and ``query`` are None when absent."""
    cdef Py_ssize_t j
    cdef object path = None, query = None
    if path_cls and i < n and s[i] != "?" and s[i] != "#":
        j = _scan(s, i + 1, n, path_cls)
        path = s[i:j]
        i = j
    if i < n and s[i] == "?":
        j = _scan(s, i + 1, n, QUERY)
        query = s[i + 1:j]
        i = j
    if i < n and s[i] != "#":
        return False, None, None
    return True, path, query


cdef class LinkResolver:
    """Resolves a page's hrefs with the helpers it is given (see ``links_ref.LinkResolver``)."""

    cdef object normalize_authority, normalize, host_key, remove_dot_segments, link, fingerprint

    def __init__(self, normalize_authority, normalize, host_key, remove_dot_segments, link, fingerprint):
        self.normalize_authority = normalize_authority
        self.normalize = normalize
        self.host_key = host_key
        self.remove_dot_segments = remove_dot_segments
        self.link = link
        self.fingerprint = fingerprint

    cpdef list resolve(self, list hrefs, str base_url, object base, Py_ssize_t max_url_length):
        """Links of ``(href, nofollow)`` pairs against ``base_url`` (``base``: its parsed form, or
        None), in first-seen order; a URL is nofollow only if every occurrence was."""
        cdef str scheme = "", key = "", base_dir = "", base_path = "", here = ""
        cdef str href, url, link_key, link_scheme, path, query, netloc
        cdef object nofollow, link
        cdef Py_ssize_t n, i, j, k, end
        cdef bint has_base = base is not None, ok
        cdef dict out = {}
        cdef Py_UCS4 c
        if has_base:
            scheme, base_dir, base_path = base.scheme, base.dir, base.path
            key = scheme + "://" + base.netloc
            here = key + base_path + "?" + base.query if base.query else key + base_path
        for pair in hrefs:
            href, nofollow = pair
            url = None
            link_key = None
            if has_base:
                n = len(href)
                ok = False
                path = query = None
                if href.startswith("http") or href.startswith("//"):
                    # (?:(https?):)?//  host(:port)?  (/path)?  (?query)?  (#anything)?
                    i = 0
                    link_scheme = scheme
                    if href.startswith("http:"):
                        link_scheme, i = "http", 5
                    elif href.startswith("https:"):
                        link_scheme, i = "https", 6
                    if i + 1 < n and href[i] == "/" and href[i + 1] == "/":
                        i += 2
                        j = _scan(href, i, n, AUTH)
                        end = j
                        ok = j > i
                        if ok and j < n and href[j] == ":":
                            end = _scan(href, j + 1, n, DIGIT)
                            ok = 1 <= end - j - 1 <= 5
                        if ok and end < n:
                            c = href[end]
                            ok = c == "/" or c == "?" or c == "#"
                        if ok:
                            ok, path, query = _tail(href, end, n, PATH)
                        if ok:
                            netloc = self.normalize_authority(link_scheme, href[i:end])
                            if netloc is None:
                                continue
                            if path is None:
                                path = "/"
                            elif "/." in path:
                                path = self.remove_dot_segments(path)
                            link_key = link_scheme + "://" + netloc
                            url = link_key + path + "?" + query if query else link_key + path
                else:
                    # (/(?!/)PATH* | FIRST NO_COLON*)?  (?query)?  (#anything)?
                    if n == 0:
                        ok, path, query = True, None, None
                    else:
                        c = href[0]
                        if c == "/":
                            if n == 1 or href[1] != "/":
                                ok, path, query = _tail(href, 0, n, PATH)
                        elif _is(c, FIRST):
                            ok, path, query = _tail(href, 0, n, NO_COLON)
                        elif c == "?" or c == "#":
                            ok, path, query = _tail(href, 0, n, 0)
                    if ok:
                        if path is None:
                            # "?q" keeps the base path; "" and "#f" are the base itself (RFC 3986 §5.2.2)
                            if query is None:
                                url = here
                            elif query:
                                url = key + base_path + "?" + query
                            else:
                                url = key + base_path
                        else:
                            if path[0] != "/":
                                path = base_dir + path
                            if "/." in path:
                                path = self.remove_dot_segments(path)
                            url = key + path + "?" + query if query else key + path
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
                out[url] = self.link(url, self.fingerprint(PyUnicode_AsUTF8String(url)), link_key, nofollow)
            elif not nofollow:
                link.nofollow = False
        return list(out.values())
