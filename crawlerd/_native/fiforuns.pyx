# cython: language_level=3, boundscheck=False, wraparound=False
"""BEAST's intake in C: a page's links split into host blocks, a host's block of deferred URLs packed as one run.

A run's value (``crawlerd.frontier.budgets.fifo``) is entries ``seq u64 | length u32 | fp u64 |
record`` (little-endian), one per deferred URL of one host, consecutive turns and arrivals. Intake
defers ~20 URLs per page in a few hosts' blocks; packing them one Python call per URL was the
budgets' largest per-URL cost on the loop (bench/RESULTS.md, eighteenth pass, branch budget18).
The reference (``fiforuns_ref.py``) gives the same bytes (``tests/_native/test_fiforuns.py``).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_ITEM, PySequence_Fast_GET_SIZE
from cpython.object cimport Py_EQ, PyObject_RichCompareBool
from libc.string cimport memcpy

cdef enum:
    ENTRY = 12          # seq u64 | length u32 before fp | record


cdef inline void _le64(char *p, unsigned long long v) noexcept:
    cdef int k
    for k in range(8):
        p[k] = <char> ((v >> (8 * k)) & 0xFF)


def pack_block(hosts, Py_ssize_t i, Py_ssize_t j, unsigned long long seq, fps, records,
               Py_ssize_t used, Py_ssize_t cap):
    """Entries of the URLs ``i``, ``i+1``, ... of one host (``hosts[i]``), arrivals ``seq``, ``seq+1``,
    ...: up to ``j``, the next URL of another host, or the first entry that would take the run's
    bytes (``used``, counting each entry's ENTRY-byte head) past ``cap`` (a run's first entry,
    ``used`` 0, always fits). Returns (the entries as one bytes, the index after the last one
    packed, ``used`` after them). The three sequences are lists or tuples (read in place), the
    records bytes and the fingerprints ints below 2**64."""
    hosts = PySequence_Fast(hosts, "pack_block: hosts is not a sequence")
    fps = PySequence_Fast(fps, "pack_block: fps is not a sequence")
    records = PySequence_Fast(records, "pack_block: records is not a sequence")
    if j > PySequence_Fast_GET_SIZE(hosts) or j > PySequence_Fast_GET_SIZE(fps) \
            or j > PySequence_Fast_GET_SIZE(records) or i < 0 or i >= j:
        raise IndexError("pack_block: i..j outside the lists")
    cdef object host = <object> PySequence_Fast_GET_ITEM(hosts, i)
    cdef Py_ssize_t e = i, total = 0, u = used, n
    cdef object other, rec
    while e < j:
        if e > i:
            other = <object> PySequence_Fast_GET_ITEM(hosts, e)
            if other is not host and not PyObject_RichCompareBool(other, host, Py_EQ):
                break
        rec = <object> PySequence_Fast_GET_ITEM(records, e)
        if type(rec) is not bytes:
            raise TypeError(f"pack_block: a record is bytes, not {type(rec).__name__}")
        n = PyBytes_GET_SIZE(rec) + 8
        if u and u + n > cap:
            break
        u += n + ENTRY
        total += n + ENTRY
        e += 1
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef char *p = PyBytes_AS_STRING(out)
    cdef Py_ssize_t x
    cdef unsigned int m
    cdef unsigned long long fp
    for x in range(i, e):
        rec = <object> PySequence_Fast_GET_ITEM(records, x)
        n = PyBytes_GET_SIZE(rec)
        _le64(p, seq + <unsigned long long> (x - i))
        m = <unsigned int> (n + 8)
        p[8] = <char> (m & 0xFF)
        p[9] = <char> ((m >> 8) & 0xFF)
        p[10] = <char> ((m >> 16) & 0xFF)
        p[11] = <char> ((m >> 24) & 0xFF)
        fp = <object> PySequence_Fast_GET_ITEM(fps, x)        # OverflowError past 2**64 - 1
        _le64(p + ENTRY, fp)
        memcpy(p + ENTRY + 8, PyBytes_AS_STRING(rec), n)
        p += ENTRY + 8 + n
    return out, e, u


def block_ends(items):
    """The end index of each block of consecutive equal items (a list or tuple), in order: a page's
    links come as a few hosts' blocks, each judged as one (``Budgets.offer_many``)."""
    items = PySequence_Fast(items, "block_ends: not a sequence")
    cdef Py_ssize_t n = PySequence_Fast_GET_SIZE(items), k
    cdef list out = []
    if n == 0:
        return out
    cdef object last = <object> PySequence_Fast_GET_ITEM(items, 0), cur
    for k in range(1, n):
        cur = <object> PySequence_Fast_GET_ITEM(items, k)
        if cur is not last and not PyObject_RichCompareBool(cur, last, Py_EQ):
            out.append(k)
            last = cur
    out.append(n)
    return out
