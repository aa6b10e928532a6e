"""DRUM kernels: RAM buckets, fingerprint cache, journal blocks, radix sort and merge pass.

The native core of one DRUM store (``Core``); its file I/O, checksum and radix sort are in
``drum_io.pxd`` (cimported, inlined here), the decoder of the journal blocks it writes and the
answer object it hands out in ``drum_answers.pyx`` (re-exported here).

DRUM (Lee et al., ACM TWeb 2009, §4) keeps a set of 8-byte keys on disk and
answers check / update / check+update for them in batches. This module is the
native half; ``crawlerd/seen/drum.py`` owns recovery, ``drum_files.py`` the
file formats, ``drum_answers.py`` result dispatch.
``drum_ref.py`` is the pure-Python reference with the same API and the same
bytes on disk; the tests run both.

``Core`` holds, for one DRUM:

* k RAM buckets. Key: bucket ``b = ((key >> 32) * k) >> 32`` (the high bits,
  so bucket b holds one contiguous key range and the buckets in order cover
  the sorted key space). Each holds records ``key u64 | ordop u64 | value``
  (``ordop`` = op << 62 | ordinal, the ordinal numbering the bucketed keys of
  the current epoch in submission order). Invariant: records of a bucket are
  in ordinal order, first those spilled to the bucket's file, then the RAM tail.
* A set-associative cache of recently seen keys (8-way, one 64-byte line per
  set, most recent first). Key: ``mix64(key) & (sets - 1)`` picks the set.
  Invariant: a cached key is in the set (merged, or inserted by an earlier
  submission of this process), and a cached value is its current value.
  Key 0 marks an empty slot and is never cached.

The journal block format, the key file payload and the checksum are
described in ``crawlerd/seen/drum_files.py``; ``hash_words`` is that checksum.
"""

from libc.errno cimport errno
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memmove, memset

from crawlerd._native.drum_answers import Result, decode_blocks, make_results   # the answer side, re-exported
from crawlerd._native.drum_io cimport (
    BLOCK_HEADER, BLOCK_MAGIC, E_IO, E_NOMEM, E_OK, E_SHORT, E_SPILL, E_UNSORTED, Pair, Reader, Scratch, Writer,
    _copy_below,
    _full_pread, _full_pwrite, _full_write, _hash_words, _load64, _radix_sort, _reader_fill,
    _writer_flush, _writer_put, mix64,
)


cdef extern from *:
    void __builtin_prefetch(const void*) nogil

cdef extern from "sys/mman.h" nogil:
    int madvise(void *addr, size_t length, int advice)
    int MADV_DONTNEED

cdef extern from "unistd.h" nogil:
    long sysconf(int name)
    int _SC_PAGESIZE

cdef enum:
    OP_CHECK = 0
    OP_UPDATE = 1
    OP_CHECK_UPDATE = 2
    WAYS = 8
    IO_RECORDS = 8192          # records per merge read/write buffer (times 8, so flushes stay word-aligned)

cdef uint64_t ORD_MASK = (<uint64_t>1 << 62) - 1


def hash_words(const uint8_t[::1] data not None, uint64_t word0=0):
    """Checksum of ``data`` read as little-endian words numbered from ``word0``."""
    if data.shape[0] == 0:
        return 0
    return _hash_words(&data[0], data.shape[0], word0)


cpdef uint32_t bucket_of(uint64_t key, uint32_t buckets) noexcept:
    """Bucket of a key: its high 32 bits scaled to [0, buckets)."""
    return <uint32_t>(((key >> 32) * buckets) >> 32)


def sort_keys(const uint64_t[::1] keys not None):
    """Stable order of ``keys`` (indices, uint64 list) by the DRUM radix sort; for tests."""
    cdef size_t n = keys.shape[0], i
    cdef Pair* a = <Pair*>malloc((n + 1) * sizeof(Pair))
    cdef Pair* t = <Pair*>malloc((n + 1) * sizeof(Pair))
    if a == NULL or t == NULL:
        free(a)
        free(t)
        raise MemoryError()
    for i in range(n):
        a[i].key = keys[i]
        a[i].idx = i
    rc = _radix_sort(a, t, n)
    out = [a[i].idx for i in range(n)]
    free(a)
    free(t)
    if rc != E_OK:
        raise MemoryError()
    return out


cdef class Core:
    """RAM buckets + cache + journal writer + merge pass of one DRUM (see module docstring).

    The wrapper gives it open file descriptors: the journal (appended to) and
    one spill file per bucket (written at ``spilled_bytes(b)``).
    """

    cdef readonly int buckets
    cdef readonly int value_size
    cdef readonly int record_size
    cdef readonly Py_ssize_t bucket_records
    cdef readonly uint64_t ordinals
    cdef readonly uint64_t max_bucket_bytes
    cdef readonly Py_ssize_t cache_capacity
    cdef readonly uint64_t cache_hits
    cdef uint8_t* bufs
    cdef Py_ssize_t* counts
    cdef uint64_t* spilled
    cdef int* spill_fds
    cdef int journal_fd
    cdef uint64_t* ckeys
    cdef uint8_t* cvals
    cdef uint64_t cmask
    cdef bint admit_on_merge
    cdef uint8_t* jbuf
    cdef size_t jcap

    def __cinit__(self, int buckets, Py_ssize_t bucket_buffer_bytes, int value_size,
                  Py_ssize_t cache_entries):
        cdef Py_ssize_t sets
        if buckets < 1 or buckets > 65536:
            raise ValueError("buckets must be in [1, 65536]")
        if value_size < 0 or value_size > 65535:
            raise ValueError("value_size must be in [0, 65535]")
        self.buckets = buckets
        self.value_size = value_size
        self.record_size = 16 + value_size
        self.bucket_records = max(1, bucket_buffer_bytes // self.record_size)
        self.bufs = <uint8_t*>malloc(<size_t>buckets * self.bucket_records * self.record_size)
        self.counts = <Py_ssize_t*>calloc(buckets, sizeof(Py_ssize_t))
        self.spilled = <uint64_t*>calloc(buckets, sizeof(uint64_t))
        self.spill_fds = <int*>malloc(buckets * sizeof(int))
        if self.bufs == NULL or self.counts == NULL or self.spilled == NULL or self.spill_fds == NULL:
            raise MemoryError()
        for b in range(buckets):
            self.spill_fds[b] = -1
        self.journal_fd = -1
        self.admit_on_merge = value_size > 0
        sets = 0
        if cache_entries > 0:
            sets = 1
            while sets * 2 * WAYS <= cache_entries:
                sets *= 2
            self.ckeys = <uint64_t*>calloc(sets * WAYS, 8)
            self.cvals = <uint8_t*>calloc(sets * WAYS * value_size + 1, 1)
            if self.ckeys == NULL or self.cvals == NULL:
                raise MemoryError()
            self.cmask = sets - 1
        self.cache_capacity = sets * WAYS
        self.jcap = 1 << 16
        self.jbuf = <uint8_t*>malloc(self.jcap)
        if self.jbuf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.bufs)
        free(self.counts)
        free(self.spilled)
        free(self.spill_fds)
        free(self.ckeys)
        free(self.cvals)
        free(self.jbuf)

    def set_files(self, int journal_fd, spill_fds):
        """Journal descriptor (append) and one spill descriptor per bucket (read-write)."""
        if len(spill_fds) != self.buckets:
            raise ValueError("need one spill file per bucket")
        self.journal_fd = journal_fd
        for b in range(self.buckets):
            self.spill_fds[b] = spill_fds[b]

    def spilled_bytes(self, int b):
        """Bytes of bucket ``b`` already written to its spill file this epoch."""
        return self.spilled[b]

    def buffered(self, int b):
        """Records of bucket ``b`` held in RAM."""
        return self.counts[b]

    # -- cache -------------------------------------------------------------------------------------

    cdef bint _cache_probe(self, uint64_t key, uint8_t* val_out) noexcept nogil:
        # Hit moves the slot to the front of its set (most recent first).
        cdef uint64_t* s
        cdef int i, V = self.value_size
        cdef uint8_t* vs
        cdef uint8_t tmpv[256]
        if self.ckeys == NULL or key == 0:
            return False
        s = self.ckeys + (mix64(key) & self.cmask) * WAYS
        for i in range(WAYS):
            if s[i] == key:
                vs = self.cvals + (s - self.ckeys) * V
                if V:
                    memcpy(val_out, vs + i * V, V)
                # Move to the front; values above 256 bytes stay put (keys and values move together).
                if i and V <= 256:
                    memmove(s + 1, s, i * 8)
                    s[0] = key
                    if V:
                        memcpy(tmpv, vs + i * V, V)
                        memmove(vs + V, vs, i * V)
                        memcpy(vs, tmpv, V)
                return True
        return False

    cdef void _cache_insert(self, uint64_t key, const uint8_t* val) noexcept nogil:
        cdef uint64_t* s
        cdef int i, pos = WAYS - 1, V = self.value_size
        cdef uint8_t* vs
        if self.ckeys == NULL or key == 0:
            return
        s = self.ckeys + (mix64(key) & self.cmask) * WAYS
        vs = self.cvals + (s - self.ckeys) * V
        for i in range(WAYS):
            if s[i] == key:
                pos = i
                break
        memmove(s + 1, s, pos * 8)
        s[0] = key
        if V:
            memmove(vs + V, vs, pos * V)
            memcpy(vs, val, V)

    def cache_lookup(self, uint64_t key):
        """(hit, value) without touching recency order semantics beyond a normal probe; for tests."""
        cdef uint8_t v[65536]
        hit = self._cache_probe(key, v)
        return hit, (bytes(v[:self.value_size]) if hit and self.value_size else None)

    # -- submission --------------------------------------------------------------------------------

    def submit(self, const uint64_t[::1] keys not None, int op, const uint8_t[::1] values,
               const uint32_t[::1] aux_lens, const uint8_t[::1] aux, uint64_t first_seq):
        """Journal one call's keys, then add the cache misses to the buckets.

        ``values``: n * value_size bytes or None; ``aux_lens`` / ``aux``: per-key
        lengths and their concatenation, or None. The block is written to the
        journal with one write() before any bucket changes, so a key is either
        journalled (and recovered after a crash) or not accepted at all.
        Returns the number of keys answered from the cache.
        """
        cdef size_t n = keys.shape[0], i, V = self.value_size
        cdef size_t aux_bytes = 0, payload, total
        cdef uint8_t flags = 0
        cdef uint8_t* p
        cdef uint8_t* hit
        cdef uint8_t* hitvals
        cdef const uint8_t* vals = NULL
        cdef uint64_t h
        cdef uint64_t hits = 0
        cdef bint may_hit
        if op < 0 or op > 2:
            raise ValueError("bad op")
        if n >= 0xFFFFFFFF:
            raise ValueError("too many keys in one call")
        if values is not None and V:
            if <size_t>values.shape[0] != n * V:
                raise ValueError("values must be len(keys) * value_size bytes")
            flags |= 1
            if n:
                vals = &values[0]
        if aux_lens is not None:
            if <size_t>aux_lens.shape[0] != n or aux is None:
                raise ValueError("aux_lens must have one length per key")
            aux_bytes = aux.shape[0]
            total = 0
            for i in range(n):
                total += aux_lens[i]
            if total != aux_bytes or aux_bytes >= 0xFFFFFFFF:
                raise ValueError("aux lengths do not add up")
            flags |= 2
        payload = n * 8 + n + n * V + (n * V if flags & 1 else 0) + (n * 4 if flags & 2 else 0) + aux_bytes
        payload = (payload + 7) & ~<size_t>7
        total = BLOCK_HEADER + payload
        if total > self.jcap:
            free(self.jbuf)
            self.jcap = total * 2
            self.jbuf = <uint8_t*>malloc(self.jcap)
            if self.jbuf == NULL:
                self.jcap = 0
                raise MemoryError()
            memset(self.jbuf, 0, self.jcap)     # resident as a whole: grows only when the cap doubles
        p = self.jbuf + BLOCK_HEADER
        memset(self.jbuf, 0, total)
        if n:
            memcpy(p, &keys[0], n * 8)
        hit = p + n * 8
        hitvals = hit + n
        p = hitvals + n * V
        # Only updates that change a value must reach the merge; everything else a cached key answers.
        may_hit = not (op == OP_UPDATE and V)
        if may_hit and self.ckeys != NULL:
            # One cache line per probe: ask for all of them before the first compare.
            for i in range(n):
                __builtin_prefetch(self.ckeys + (mix64(keys[i]) & self.cmask) * WAYS)
            for i in range(n):
                if self._cache_probe(keys[i], hitvals + i * V):
                    hit[i] = 1
                    hits += 1
        if flags & 1:
            memcpy(p, vals, n * V)
            p += n * V
        if flags & 2:
            if n:
                memcpy(p, &aux_lens[0], n * 4)
            p += n * 4
            if aux_bytes:
                memcpy(p, &aux[0], aux_bytes)
        (<uint32_t*>self.jbuf)[0] = BLOCK_MAGIC
        self.jbuf[4] = <uint8_t>op
        self.jbuf[5] = flags
        (<uint16_t*>(self.jbuf + 6))[0] = <uint16_t>V
        (<uint32_t*>(self.jbuf + 8))[0] = <uint32_t>n
        (<uint32_t*>(self.jbuf + 12))[0] = <uint32_t>aux_bytes
        (<uint64_t*>(self.jbuf + 16))[0] = first_seq
        (<uint64_t*>(self.jbuf + 24))[0] = payload
        h = _hash_words(self.jbuf, 32, 0) + _hash_words(self.jbuf + BLOCK_HEADER, payload, 4)
        (<uint64_t*>(self.jbuf + 32))[0] = h
        if self.journal_fd < 0:
            raise ValueError("journal not open")
        if _full_write(self.journal_fd, self.jbuf, total) != E_OK:
            raise OSError(errno, "journal write failed")
        self._add_core(&keys[0] if n else NULL, hit, op, vals, n, True)
        self.cache_hits += hits
        return hits

    def replay(self, const uint64_t[::1] keys not None, const uint8_t[::1] hit not None, int op,
               const uint8_t[::1] values):
        """Re-add one journalled block's bucketed keys after a restart (no journal write, no cache)."""
        cdef size_t n = keys.shape[0]
        cdef const uint8_t* vals = NULL
        if <size_t>hit.shape[0] != n:
            raise ValueError("hit flags must match keys")
        if values is not None and self.value_size and n:
            if <size_t>values.shape[0] != n * self.value_size:
                raise ValueError("values size mismatch")
            vals = &values[0]
        if n:
            self._add_core(&keys[0], &hit[0], op, vals, n, False)

    cdef int _add_core(self, const uint64_t* keys, const uint8_t* hit, int op, const uint8_t* vals,
                       size_t n, bint admit) except -1:
        cdef size_t i, V = self.value_size, R = self.record_size
        cdef uint32_t b
        cdef uint64_t k = self.buckets, key, sz
        cdef uint8_t* rec
        cdef uint8_t* base
        cdef uint64_t opbits = (<uint64_t>op) << 62
        cdef Py_ssize_t cap = self.bucket_records
        cdef bint admit_key = admit and (op != OP_CHECK) and (V == 0 or op == OP_UPDATE)
        for i in range(n):
            if hit[i]:
                continue
            key = keys[i]
            b = <uint32_t>(((key >> 32) * k) >> 32)
            base = self.bufs + <size_t>b * cap * R
            rec = base + <size_t>self.counts[b] * R
            memcpy(rec, &key, 8)
            (<uint64_t*>(rec + 8))[0] = opbits | self.ordinals
            if V:
                if vals != NULL:
                    memcpy(rec + 16, vals + i * V, V)
                else:
                    memset(rec + 16, 0, V)
            self.ordinals += 1
            self.counts[b] += 1
            if self.counts[b] == cap:
                if self.spill_fds[b] < 0:
                    raise ValueError("spill files not open")
                if _full_pwrite(self.spill_fds[b], base, <size_t>cap * R, self.spilled[b]) != E_OK:
                    raise OSError(errno, "bucket spill failed")
                self.spilled[b] += <uint64_t>cap * R
                self.counts[b] = 0
            sz = self.spilled[b] + <uint64_t>self.counts[b] * R
            if sz > self.max_bucket_bytes:
                self.max_bucket_bytes = sz
            if admit_key:
                self._cache_insert(key, rec + 16 if V else NULL)
        return 0

    def reset_epoch(self):
        """Forget the buckets after a committed merge (the wrapper truncates the spill files), and
        give their pages back to the kernel: the next epoch faults in what it fills. Kept, a
        bucket's pages would stay resident from the deepest any epoch filled it, a high-water mark
        that ever rarer bursts raise: private memory creeping up with the pages crawled (up to
        ``buckets * bucket_buffer_bytes``, most of which an epoch at the crawl's rate never
        fills)."""
        cdef uintptr_t lo, hi, page = <uintptr_t>sysconf(_SC_PAGESIZE)
        for b in range(self.buckets):
            self.counts[b] = 0
            self.spilled[b] = 0
        self.ordinals = 0
        self.max_bucket_bytes = 0
        if self.bufs != NULL:
            lo = (<uintptr_t>self.bufs + page - 1) & ~(page - 1)     # whole pages inside the buffer only
            hi = (<uintptr_t>self.bufs + <size_t>self.buckets * self.bucket_records * self.record_size) & ~(page - 1)
            if hi > lo:
                madvise(<void*>lo, hi - lo, MADV_DONTNEED)

    # -- merge -------------------------------------------------------------------------------------

    def merge(self, int old_fd, uint64_t old_count, uint64_t old_hash, int new_fd,
              uint8_t[::1] unique_out not None, uint8_t[::1] values_out not None):
        """One DRUM merge pass over every bucket (§4.2).

        Reads the old key file payload (``old_count`` records) sequentially from
        ``old_fd``'s position, writes the new payload to ``new_fd``'s position,
        and sets ``unique_out[o]`` / ``values_out[o*V:(o+1)*V]`` for every
        ordinal o of this epoch. Verifies the old payload's checksum and order.
        Returns (new_count, new_hash). Buckets are left as they are.
        """
        cdef int rc
        cdef uint64_t new_count = 0, new_hash = 0, bad_key = 0
        if <uint64_t>unique_out.shape[0] < self.ordinals:
            raise ValueError("unique_out too small")
        if <uint64_t>values_out.shape[0] < self.ordinals * self.value_size:
            raise ValueError("values_out too small")
        cdef uint8_t* uo = &unique_out[0] if unique_out.shape[0] else NULL
        cdef uint8_t* vo = &values_out[0] if values_out.shape[0] else NULL
        with nogil:
            rc = self._merge(old_fd, old_count, old_hash, new_fd, uo, vo, &new_count, &new_hash, &bad_key)
        if rc == E_IO:
            raise OSError(errno, "DRUM merge I/O error")
        if rc == E_NOMEM:
            raise MemoryError()
        if rc == E_SHORT:
            raise ValueError("key file is shorter than its header says")
        if rc == E_UNSORTED:
            raise ValueError(f"key file is not strictly sorted (at key {bad_key:#x})")
        if rc == E_SPILL:
            raise ValueError("bucket file is shorter than recorded")
        if rc == 1:
            raise ValueError("key file checksum mismatch")
        return new_count, new_hash

    cdef int _merge(self, int old_fd, uint64_t old_count, uint64_t old_hash, int new_fd,
                    uint8_t* uo, uint8_t* vo, uint64_t* new_count, uint64_t* new_hash,
                    uint64_t* bad_key) noexcept nogil:
        # Allocates the pass's buffers (sized for the largest bucket), runs it, frees them.
        cdef Reader r
        cdef Writer w
        cdef Scratch s
        cdef int rc, b
        cdef size_t n, R = self.record_size, OR = 8 + self.value_size, most = 1
        for b in range(self.buckets):
            n = <size_t>(self.spilled[b] // R) + <size_t>self.counts[b]
            if n > most:
                most = n
        memset(&r, 0, sizeof(Reader))
        memset(&w, 0, sizeof(Writer))
        memset(&s, 0, sizeof(Scratch))
        r.fd = old_fd
        r.rec = OR
        r.cap = OR * IO_RECORDS
        r.remaining = old_count
        w.fd = new_fd
        w.rec = OR
        w.cap = OR * IO_RECORDS
        r.buf = <uint8_t*>malloc(r.cap)
        w.buf = <uint8_t*>malloc(w.cap)
        s.cur = <uint8_t*>malloc(OR)
        s.outrec = <uint8_t*>malloc(OR)
        s.recs = <uint8_t*>malloc(most * R)
        s.pairs = <Pair*>malloc(most * sizeof(Pair))
        s.tmp = <Pair*>malloc(most * sizeof(Pair))
        if (r.buf == NULL or w.buf == NULL or s.cur == NULL or s.outrec == NULL or s.recs == NULL
                or s.pairs == NULL or s.tmp == NULL):
            rc = E_NOMEM
        else:
            rc = self._merge_pass(&r, &w, &s, uo, vo, bad_key)
            if rc == E_OK and r.hash != old_hash:
                rc = 1
        if rc == E_OK:
            new_count[0] = w.count
            new_hash[0] = w.hash
        free(r.buf)
        free(w.buf)
        free(s.cur)
        free(s.outrec)
        free(s.recs)
        free(s.pairs)
        free(s.tmp)
        return rc

    cdef int _merge_pass(self, Reader* r, Writer* w, Scratch* s, uint8_t* uo, uint8_t* vo,
                         uint64_t* bad_key) noexcept nogil:
        cdef int rc, b
        cdef size_t n, nspill, R = self.record_size
        for b in range(self.buckets):
            n = <size_t>(self.spilled[b] // R) + <size_t>self.counts[b]
            if n == 0:
                continue
            nspill = <size_t>(self.spilled[b] // R)
            if nspill:
                rc = _full_pread(self.spill_fds[b], s.recs, nspill * R, 0)
                if rc != E_OK:
                    return rc
            memcpy(s.recs + nspill * R, self.bufs + <size_t>b * self.bucket_records * R,
                   <size_t>self.counts[b] * R)
            rc = self._merge_bucket(r, w, s, n, uo, vo, bad_key)
            if rc != E_OK:
                return rc
        # The old keys above the last pending one.
        rc = _copy_below(r, w, 0, True, bad_key)
        if rc < 0:
            return rc
        return _writer_flush(w)

    cdef int _merge_bucket(self, Reader* r, Writer* w, Scratch* s, size_t n, uint8_t* uo, uint8_t* vo,
                           uint64_t* bad_key) noexcept nogil:
        # Sorts one bucket's records (stable, so equal keys stay in submission
        # order) and merges them into the stream in one sequential step.
        cdef size_t i, j, V = self.value_size, R = self.record_size, OR = 8 + V
        cdef uint64_t K, o, op, ordop
        cdef bint present
        cdef uint8_t* rec
        cdef int rc
        for i in range(n):
            s.pairs[i].key = _load64(s.recs + i * R)
            s.pairs[i].idx = i
        rc = _radix_sort(s.pairs, s.tmp, n)
        if rc != E_OK:
            return rc
        i = 0
        while i < n:
            K = s.pairs[i].key
            rc = _copy_below(r, w, K, False, bad_key)
            if rc < 0:
                return rc
            present = False
            if rc == 1 and _load64(r.buf + r.pos) == K:
                present = True
                memcpy(s.cur, r.buf + r.pos + 8, V)
                r.prev = K
                r.started = True
                r.pos += OR
            # Apply the pending operations on K in submission order.
            j = i
            while j < n and s.pairs[j].key == K:
                rec = s.recs + s.pairs[j].idx * R
                ordop = _load64(rec + 8)
                op = ordop >> 62
                o = ordop & ORD_MASK
                uo[o] = 0 if present else 1
                if V:
                    if present:
                        memcpy(vo + o * V, s.cur, V)
                    else:
                        memset(vo + o * V, 0, V)
                if op == OP_UPDATE or (op == OP_CHECK_UPDATE and not present):
                    present = True
                    memcpy(s.cur, rec + 16, V)
                j += 1
            if present:
                memcpy(s.outrec, &K, 8)
                memcpy(s.outrec + 8, s.cur, V)
                rc = _writer_put(w, s.outrec)
                if rc != E_OK:
                    return rc
                if self.admit_on_merge:
                    self._cache_insert(K, s.cur)
            i = j
        return E_OK
