# cython: language_level=3, boundscheck=False, wraparound=False
"""A page's links on the worker -> crawl process wire as columns in one ``bytes`` (reference:
``linkwire_ref.py``; the wire itself: ``crawlerd/process/wire.py``).

As a list of ``(url, fp, host_key, nofollow)`` tuples, a page's ~20-60 links cost the crawl loop
a tuple, a string, a long and a memo lookup each in ``pickle.loads``, then a ``Link`` built from
the tuple, and left that many tracked tuples for the cyclic collector. As columns they are one
bytes object pickle copies whole; ``unpack`` builds the native ``Link`` records from it in C
(no tuple, no ``__init__`` call; a ``Link`` is not tracked by the collector).

Layout, little-endian, ``n`` links::

    u32 n | u32 blob length | u64 fp * n | u32 url end * n | u32 host index * n | u8 nofollow * n | blob

``blob`` holds the URLs one after another as UTF-8 (``surrogatepass``: any ``str`` goes through),
link i's URL ends at its ``url end`` (cumulative, from the blob's start). ``host index`` names
the link's host key in the frame's host list (one list for all of a frame's results, so a key is
sent and decoded once per frame, and every link of it refers to the same object); ``pack`` adds
new keys to ``hosts`` (key -> index, in the order they are first seen: ``list(hosts)`` is that
list). ``nofollow`` is 0 or 1. ``fp`` must fit in 64 bits, unsigned (the fingerprints do).
A record ``unpack`` cannot read whole (a length, an end or a host index out of range, bytes that
are not UTF-8) is a ValueError, never a partial list.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject

from crawlerd._native.linkrec cimport Link

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    bint PyUnicode_IS_ASCII(object s)
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)


cdef Py_ssize_t HEAD = 8          # n, blob length
cdef Py_ssize_t PER_LINK = 17     # fp 8, url end 4, host index 4, nofollow 1


cdef inline object _field(object ln, int which):
    """A link's field: in C from a native record with the field set, else by attribute (another
    record type, or a deleted field: AttributeError, as the attribute read gives it)."""
    cdef PyObject* slot = NULL
    if type(ln) is Link:
        if which == 0:
            slot = <PyObject*>(<Link>ln).url
        elif which == 1:
            slot = <PyObject*>(<Link>ln).fp
        elif which == 2:
            slot = <PyObject*>(<Link>ln).host_key
        else:
            slot = <PyObject*>(<Link>ln).nofollow
        if slot != NULL:
            return <object>slot
    if which == 0:
        return ln.url
    if which == 1:
        return ln.fp
    if which == 2:
        return ln.host_key
    return ln.nofollow


def pack(list links not None, dict hosts not None):
    """``links`` (``Link`` records) as one bytes in the layout above; their host keys not in
    ``hosts`` yet are added to it with the next index."""
    cdef Py_ssize_t n = len(links), i, blob = 0, ul, off
    cdef list utf8 = [None] * n          # a non-ASCII URL's encoding (an ASCII one is read in place)
    cdef list urls = [None] * n
    cdef str url
    cdef object enc, key, idx
    cdef const char* u8
    cdef char* out
    cdef uint64_t fp
    cdef uint32_t v
    cdef uint8_t nf
    if n >= (1 << 32) // PER_LINK:
        raise ValueError("too many links for one record")
    for i in range(n):
        url = _field(links[i], 0)        # TypeError if not a str
        urls[i] = url
        if PyUnicode_IS_ASCII(url):
            blob += len(url)
        else:
            enc = url.encode("utf-8", "surrogatepass")
            utf8[i] = enc
            blob += PyBytes_GET_SIZE(enc)
    if HEAD + PER_LINK * n + blob >= (1 << 32):
        raise ValueError("links too long for one record")
    rec = PyBytes_FromStringAndSize(NULL, HEAD + PER_LINK * n + blob)
    out = PyBytes_AS_STRING(rec)
    v = <uint32_t>n
    memcpy(out, &v, 4)
    v = <uint32_t>blob
    memcpy(out + 4, &v, 4)
    cdef char* fps = out + HEAD
    cdef char* ends = fps + 8 * n
    cdef char* hix = ends + 4 * n
    cdef char* nof = hix + 4 * n
    cdef char* body = nof + n
    off = 0
    for i in range(n):
        ln = links[i]
        fp = _field(ln, 1)               # OverflowError if negative or past 64 bits
        memcpy(fps + 8 * i, &fp, 8)
        enc = utf8[i]
        if enc is None:
            u8 = PyUnicode_AsUTF8AndSize(urls[i], &ul)     # ASCII: the string's own characters
        else:
            u8, ul = PyBytes_AS_STRING(enc), PyBytes_GET_SIZE(enc)
        memcpy(body + off, u8, ul)
        off += ul
        v = <uint32_t>off
        memcpy(ends + 4 * i, &v, 4)
        key = _field(ln, 2)
        idx = hosts.get(key)
        if idx is None:
            idx = len(hosts)
            hosts[key] = idx
        v = <uint32_t>idx
        memcpy(hix + 4 * i, &v, 4)
        nf = 1 if _field(ln, 3) else 0
        nof[i] = <char>nf
    return rec


def unpack(object rec, list hosts not None):
    """The ``Link`` records of a ``pack``ed bytes, in order; ``hosts`` the frame's host list."""
    if type(rec) is not bytes:
        raise ValueError(f"links record is a {type(rec).__name__}, not bytes")
    cdef const char* p = PyBytes_AS_STRING(rec)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(rec), n, blob, i, nh = len(hosts)
    cdef uint32_t v, end, prev = 0, h
    cdef uint64_t fp
    if size < HEAD:
        raise ValueError("links record shorter than its head")
    memcpy(&v, p, 4)
    n = v
    memcpy(&v, p + 4, 4)
    blob = v
    if size != HEAD + PER_LINK * n + blob:
        raise ValueError(f"links record of {size} bytes for {n} links and {blob} URL bytes")
    cdef const char* fps = p + HEAD
    cdef const char* ends = fps + 8 * n
    cdef const char* hix = ends + 4 * n
    cdef const uint8_t* nof = <const uint8_t*>(hix + 4 * n)
    cdef const char* body = <const char*>(nof + n)
    cdef list out = []
    cdef Link ln
    for i in range(n):
        memcpy(&end, ends + 4 * i, 4)
        memcpy(&h, hix + 4 * i, 4)
        if end < prev or end > blob:
            raise ValueError(f"link {i}: URL end {end} out of order")
        if h >= nh:
            raise ValueError(f"link {i}: host index {h} past the frame's {nh} hosts")
        memcpy(&fp, fps + 8 * i, 8)
        ln = Link.__new__(Link)
        ln.url = PyUnicode_DecodeUTF8(body + prev, end - prev, "surrogatepass")
        ln.fp = fp
        ln.host_key = hosts[h]
        ln.nofollow = nof[i] != 0
        out.append(ln)
        prev = end
    return out
