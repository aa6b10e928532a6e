# cython: language_level=3, boundscheck=False, wraparound=False
"""The shard intake's per-URL passes in C (``crawlerd/shard/intake.py``): a page's links into
seen-set records (``links``) and a slice of DRUM answers into the unique URLs' columns (``answers``).

About 22 links a page pass both, so their per-URL Python was multiplied by ~22 per request. Each
pass keeps to the same decisions as its plain-Python reference (``intake_ref.py``; one test class
runs the same streams through both, tests/_native/test_intake.py): ``links`` leaves every link the
filter's quick test cannot pass to ``UrlFilter.check`` in order (so the filter's per-host state
sees the same URLs in the same order), ``answers`` reads a delivery's answer arrays directly (no
answer object per answer, duplicates included) and calls ``host_key`` only where the reference does.
"""

import numpy as np

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8

from crawlerd._native.linkrec cimport Link

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    int PyUnicode_KIND(object s)
    const uint8_t* PyUnicode_1BYTE_DATA(object s)
    Py_UCS4 PyUnicode_READ_CHAR(object s, Py_ssize_t i)
    int PyUnicode_1BYTE_KIND


cdef inline bint _quick(str url, str key, Py_ssize_t max_len, Py_ssize_t few) noexcept:
    """``UrlFilter.check``'s quick pass: a host key, no query, a short URL, few slashes after the host."""
    cdef Py_ssize_t i, n = len(url), slashes = 0, k = len(key)
    cdef const uint8_t* b
    cdef Py_UCS4 c
    if k == 0 or n > max_len:
        return False
    if PyUnicode_KIND(url) == PyUnicode_1BYTE_KIND:
        # one byte a character (every ASCII URL): the characters read in place, no index checks
        b = PyUnicode_1BYTE_DATA(url)
        if memchr(b, 63, n) != NULL:            # "?"
            return False
        for i in range(k, n):
            if b[i] == 47:                      # "/"
                slashes += 1
        return slashes <= few
    for i in range(n):
        c = PyUnicode_READ_CHAR(url, i)
        if c == u"?":
            return False
        if c == u"/" and i >= k:
            slashes += 1
    return slashes <= few


cdef inline bint _fields_set(Link ln) noexcept:
    """Whether the record's url, host key and fingerprint are all there (``del link.url`` leaves a
    NULL slot, which Python-level access turns into AttributeError: the caller takes that path)."""
    return (<PyObject*>ln.url != NULL and <PyObject*>ln.host_key != NULL
            and <PyObject*>ln.fp != NULL)


def links(list links not None, bytes head not None, Py_ssize_t max_len, Py_ssize_t few, object check, list reasons not None):
    """The seen-set records of a page's ``links`` (``Link``: url, fp, host key) that pass the filter:
    ``(keys, aux, lens)``, the fingerprints as a uint64 array, each ``head + url`` as UTF-8 bytes
    and their lengths as a little-endian uint32 array (the intake log's), in order. A link the quick test (``max_len`` characters, ``few`` slashes after the host, no
    query) does not pass goes to ``check(url, host_key)``; its drop reason is appended to ``reasons``."""
    cdef Py_ssize_t n = len(links), m = 0, hl = len(head), ul
    cdef object karr = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] kv = karr
    cdef object larr = np.empty(n, dtype="<u4")
    cdef uint32_t[::1] lv = larr
    cdef list aux = []
    cdef str url, key
    cdef bytes rec
    cdef const char* u8
    cdef char* out
    cdef object fp
    cdef Link rec_ln
    for ln in links:
        if type(ln) is Link and _fields_set(<Link>ln):
            rec_ln = <Link>ln           # the native record: its fields read in C
            url = rec_ln.url
            key = rec_ln.host_key
            fp = rec_ln.fp
        else:                           # another record type (the reference's), or a field deleted
            url = ln.url
            key = ln.host_key
            fp = ln.fp
        if not _quick(url, key, max_len, few):
            reason = check(url, key)
            if reason:
                reasons.append(reason)
                continue
        kv[m] = fp
        u8 = PyUnicode_AsUTF8AndSize(url, &ul)     # an ASCII URL's own characters: no copy
        rec = PyBytes_FromStringAndSize(NULL, hl + ul)
        out = PyBytes_AS_STRING(rec)
        memcpy(out, PyBytes_AS_STRING(head), hl)
        memcpy(out + hl, u8, ul)
        aux.append(rec)
        lv[m] = <uint32_t>(hl + ul)
        m += 1
    return karr[:m], aux, larr[:m]


def answers(list runs not None, uint64_t mark, object host_key):
    """The unique URLs of a slice of DRUM answers, given as ``runs`` of ``(keys, unique, seq, i0, i1,
    aux, ends)`` (answers ``i0`` to ``i1 - 1`` of one run whose answer j has seq ``seq + j``; ``aux``
    the run's records one after another, ``ends[j]`` just past answer j's). Returns ``(fresh, hosts,
    dup, again)``: ``fresh`` one ``(key, aux, depth, hops, priority, url, host key)`` per unique
    answer at or past ``mark``, in order; ``hosts`` ``(index in fresh, host key)`` where the host
    changes; ``dup`` the duplicates, ``again`` the answers before ``mark`` (already added)."""
    cdef list fresh = [], hosts = []
    cdef Py_ssize_t dup = 0, again = 0, j, i0, i1, hl = -1, ulen, sp, plen = 0
    cdef const uint64_t[::1] keys
    cdef const uint8_t[::1] unique
    cdef const uint8_t[::1] aux
    cdef const int64_t[::1] ends
    cdef uint64_t seq
    cdef int64_t prev, end
    cdef const char* p
    cdef const char* q
    cdef const char* r
    cdef Py_ssize_t left
    cdef const char* last_head = NULL
    cdef bytes head_b = None, prefix = None, rec
    cdef object hk = "", d = None, h = None, pr = None
    cdef str url
    for run in runs:
        keys, unique, seq, i0, i1, aux, ends = run
        if i0 < 0 or i1 > keys.shape[0] or i1 > unique.shape[0]:
            raise IndexError("answers out of range")
        if aux is None or ends is None or i1 > ends.shape[0]:
            raise ValueError("an intake answer needs its record")
        prev = ends[i0 - 1] if i0 > 0 else 0
        for j in range(i0, i1):
            end = ends[j]
            if end < prev or end > aux.shape[0]:
                raise ValueError("aux ends out of order")
            p = <const char*>&aux[0] + prev if end > prev else NULL
            ulen = end - prev
            prev = end
            if seq + <uint64_t>j < mark:
                again += 1          # delivered again after a crash, but already added and committed
                continue
            if not unique[j]:
                dup += 1
                continue
            # the record: "depth hops priority url"; a slice's records share a few heads
            q, left = p, ulen
            for _ in range(3):
                r = <const char*>memchr(q, 32, left) if left > 0 else NULL
                if r == NULL:
                    raise ValueError(f"not an intake record: {PyBytes_FromStringAndSize(p, ulen)!r}")
                left -= r - q + 1
                q = r + 1
            sp = q - p - 1                  # the head's length (to its third space)
            if sp != hl or memcmp(p, last_head, sp) != 0:
                head_b = PyBytes_FromStringAndSize(p, sp)
                fields = head_b.split(b" ")
                d, h, pr = int(fields[0]), int(fields[1]), int(fields[2])
                last_head, hl = PyBytes_AS_STRING(head_b), sp
            url = PyUnicode_DecodeUTF8(q, ulen - sp - 1, NULL)
            if prefix is None or ulen - sp - 1 < plen or memcmp(q, PyBytes_AS_STRING(prefix), plen) != 0:
                key = host_key(url)         # not on the last URL's host
                if key != hk:
                    hk = key
                    prefix = PyUnicode_AsUTF8String(key + "/")
                    plen = PyBytes_GET_SIZE(prefix)
                    hosts.append((len(fresh), hk))
            rec = PyBytes_FromStringAndSize(p, ulen)
            fresh.append((keys[j], rec, d, h, pr, url, hk))
    return fresh, hosts, dup, again
