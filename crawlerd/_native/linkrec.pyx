"""A page's outlink as a native record: ``crawlerd.records.Link`` (reference: ``linkrec_ref.Link``).

A page brings dozens of links, made twice (the worker's resolver, then the crawl process's
answer decoding) and held while the page's lease waits. As a dataclass each cost a Python
``__init__`` call (~0.1 us) and was an object the crawl loop's collector passes walked (gcpace);
this type is built in C and is not tracked by the cyclic collector (``no_gc``: a link holds two
strings, an int and a bool, which cannot make a cycle).
"""

cimport cython


@cython.no_gc
@cython.freelist(512)
cdef class Link:
    """An outlink: ``url`` (normalised absolute URL), ``fp`` (its 64-bit fingerprint, unsigned),
    ``host_key`` (scheme://host[:port], the politeness key), ``nofollow``. The reference's
    fields, constructor, equality (field by field, with another ``Link`` only), repr and
    pickling; unhashable like it (compared by value and mutable)."""

    cdef public object url
    cdef public object fp
    cdef public object host_key
    cdef public object nofollow

    __match_args__ = ("url", "fp", "host_key", "nofollow")

    def __init__(self, url, fp, host_key, nofollow=False):
        self.url = url
        self.fp = fp
        self.host_key = host_key
        self.nofollow = nofollow

    def __repr__(self):
        return f"Link(url={self.url!r}, fp={self.fp!r}, host_key={self.host_key!r}, nofollow={self.nofollow!r})"

    def __eq__(self, other):
        if type(other) is not Link:
            return NotImplemented
        cdef Link o = <Link>other
        return (self.url, self.fp, self.host_key, self.nofollow) == (o.url, o.fp, o.host_key, o.nofollow)

    __hash__ = None

    def __reduce__(self):
        return (Link, (self.url, self.fp, self.host_key, self.nofollow))
