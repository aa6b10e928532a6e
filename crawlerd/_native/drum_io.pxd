"""DRUM's file I/O and sort, shared by the kernel in ``drum.pyx`` (cimported, inlined there).

Whole reads and writes that retry EINTR, the stable radix sort of (key, index) pairs, and the
buffered sequential ``Reader`` / ``Writer`` of a bucket's sorted key file with its running
checksum (``_hash_words``: the sum of ``mix64`` over numbered little-endian words; the format is
in ``crawlerd/seen/drum_files.py``). Error codes are negative ``E_*`` values, turned into
exceptions by ``drum.pyx`` with the GIL held.
"""

from libc.errno cimport errno
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy
from posix.unistd cimport pread, pwrite, read, write


# Error codes of the nogil merge, turned into exceptions with the GIL held.
cdef enum:
    E_OK = 0
    E_IO = -1
    E_SHORT = -2
    E_UNSORTED = -3
    E_NOMEM = -4
    E_SPILL = -5
    BLOCK_HEADER = 40          # bytes of a journal block's header (format in crawlerd/seen/drum_files.py)
    BLOCK_MAGIC = 0x4D555244   # "DRUM" little-endian, a journal block's first word


cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    # splitmix64 finaliser: a bijection with full avalanche.
    x ^= x >> 30
    x *= 0xBF58476D1CE4E5B9ULL
    x ^= x >> 27
    x *= 0x94D049BB133111EBULL
    x ^= x >> 31
    return x


cdef inline uint64_t _hash_words(const uint8_t* p, size_t nbytes, uint64_t word0) noexcept nogil:
    # Sum of mix64(word + index * K1) over little-endian 8-byte words, the
    # last word zero-padded. A sum, so a stream can be hashed chunk by chunk.
    cdef uint64_t K1 = 0x9E3779B97F4A7C15ULL   # the golden-ratio odd constant numbering words
    cdef uint64_t h = 0, w
    cdef size_t i, nw = nbytes >> 3, rest = nbytes & 7
    for i in range(nw):
        memcpy(&w, p + (i << 3), 8)
        h += mix64(w + (word0 + i) * K1)
    if rest:
        w = 0
        memcpy(&w, p + (nw << 3), rest)
        h += mix64(w + (word0 + nw) * K1)
    return h


cdef inline int _full_write(int fd, const uint8_t* p, size_t n) noexcept nogil:
    cdef ssize_t w
    while n:
        w = write(fd, p, n)
        if w < 0:
            if errno == 4:  # EINTR
                continue
            return E_IO
        p += w
        n -= <size_t>w
    return E_OK


cdef inline int _full_pwrite(int fd, const uint8_t* p, size_t n, uint64_t off) noexcept nogil:
    cdef ssize_t w
    while n:
        w = pwrite(fd, p, n, off)
        if w < 0:
            if errno == 4:
                continue
            return E_IO
        p += w
        n -= <size_t>w
        off += <uint64_t>w
    return E_OK


cdef inline int _full_read(int fd, uint8_t* p, size_t n, size_t* got) noexcept nogil:
    # Reads until n bytes or end of file; got = bytes read.
    cdef ssize_t r
    got[0] = 0
    while n:
        r = read(fd, p, n)
        if r < 0:
            if errno == 4:
                continue
            return E_IO
        if r == 0:
            return E_OK
        p += r
        n -= <size_t>r
        got[0] += <size_t>r
    return E_OK


cdef inline int _full_pread(int fd, uint8_t* p, size_t n, uint64_t off) noexcept nogil:
    cdef ssize_t r
    while n:
        r = pread(fd, p, n, off)
        if r < 0:
            if errno == 4:
                continue
            return E_IO
        if r == 0:
            return E_SPILL
        p += r
        n -= <size_t>r
        off += <uint64_t>r
    return E_OK


cdef struct Pair:
    uint64_t key
    uint64_t idx


cdef inline int _radix_sort(Pair* a, Pair* tmp, size_t n) noexcept nogil:
    # Stable LSD radix sort on key, 11-bit digits; a pass whose digit is the
    # same for every pair is skipped (bucket keys share their high bits).
    # The sorted pairs end up in ``a``.
    cdef size_t* hist
    cdef size_t i, d, s, c, total
    cdef int shift
    cdef Pair* src = a
    cdef Pair* dst = tmp
    cdef Pair* t
    cdef Pair x
    cdef size_t j
    cdef bint skip
    if n < 48:
        for i in range(1, n):
            x = a[i]
            j = i
            while j > 0 and a[j - 1].key > x.key:
                a[j] = a[j - 1]
                j -= 1
            a[j] = x
        return E_OK
    hist = <size_t*>calloc(6 * 2048, sizeof(size_t))
    if hist == NULL:
        return E_NOMEM
    for i in range(n):
        for d in range(6):
            hist[d * 2048 + ((a[i].key >> (11 * d)) & 2047)] += 1
    for d in range(6):
        shift = 11 * d
        skip = False
        for c in range(2048):
            if hist[d * 2048 + c] == n:
                skip = True
                break
        if skip:
            continue
        total = 0
        for c in range(2048):
            s = hist[d * 2048 + c]
            hist[d * 2048 + c] = total
            total += s
        for i in range(n):
            c = (src[i].key >> shift) & 2047
            dst[hist[d * 2048 + c]] = src[i]
            hist[d * 2048 + c] += 1
        t = src
        src = dst
        dst = t
    if src != a:
        memcpy(a, src, n * sizeof(Pair))
    free(hist)
    return E_OK


cdef struct Reader:
    # Sequential reader of the old key file payload: ``remaining`` records not
    # yet loaded; ``pos`` / ``len`` index the loaded chunk; ``word`` numbers the
    # chunk's first word for the checksum.
    int fd
    uint8_t* buf
    size_t cap
    size_t pos
    size_t len
    uint64_t remaining
    uint64_t hash
    uint64_t word
    uint64_t prev
    bint started
    size_t rec


cdef struct Writer:
    int fd
    uint8_t* buf
    size_t cap
    size_t len
    uint64_t hash
    uint64_t word
    uint64_t count
    size_t rec


cdef inline int _reader_fill(Reader* r) noexcept nogil:
    # Ensures a record is loaded when any remain; returns 1 if one is, 0 at end.
    cdef size_t want, got
    if r.pos < r.len:
        return 1
    if r.remaining == 0:
        return 0
    want = r.cap
    if <uint64_t>(want // r.rec) > r.remaining:
        want = <size_t>(r.remaining * r.rec)
    if _full_read(r.fd, r.buf, want, &got) != E_OK:
        return E_IO
    if got != want:
        return E_SHORT
    r.hash += _hash_words(r.buf, want, r.word)
    r.word += want >> 3
    r.len = want
    r.pos = 0
    r.remaining -= want // r.rec
    return 1


cdef inline int _writer_flush(Writer* w) noexcept nogil:
    if w.len == 0:
        return E_OK
    w.hash += _hash_words(w.buf, w.len, w.word)
    w.word += w.len >> 3
    if _full_write(w.fd, w.buf, w.len) != E_OK:
        return E_IO
    w.len = 0
    return E_OK


cdef inline int _writer_put(Writer* w, const uint8_t* rec) noexcept nogil:
    if w.len + w.rec > w.cap:
        if _writer_flush(w) != E_OK:
            return E_IO
    memcpy(w.buf + w.len, rec, w.rec)
    w.len += w.rec
    w.count += 1
    return E_OK


cdef inline uint64_t _load64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v
    memcpy(&v, p, 8)
    return v

cdef struct Scratch:
    uint8_t* recs
    Pair* pairs
    Pair* tmp
    uint8_t* cur
    uint8_t* outrec


cdef inline int _copy_below(Reader* r, Writer* w, uint64_t K, bint all_keys, uint64_t* bad_key) noexcept nogil:
    # Copies old records with key < K (all of them if all_keys), checking that
    # the file is strictly sorted. Returns 1 with the next record loaded, 0 at
    # the end of the file, or an error code.
    cdef int rc
    cdef uint64_t ok
    while True:
        rc = _reader_fill(r)
        if rc <= 0:
            return rc
        ok = _load64(r.buf + r.pos)
        if r.started and ok <= r.prev:
            bad_key[0] = ok
            return E_UNSORTED
        if not all_keys and ok >= K:
            return 1
        r.prev = ok
        r.started = True
        rc = _writer_put(w, r.buf + r.pos)
        if rc != E_OK:
            return rc
        r.pos += r.rec
