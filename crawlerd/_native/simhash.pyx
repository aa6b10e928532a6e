"""64-bit simhash of page text (fingerprint and Hamming distance).

Fingerprint (Charikar 2002; Manku, Jain, Das Sarma, WWW 2007 §2):

1. Words: ``text.lower()``, then every maximal run of code points ``c`` with
   ``c.isalnum()`` (the regex ``[^\\W_]+``), so "Don't" gives "don", "t".
2. Features: 3-word shingles, the words joined by one space and UTF-8 encoded.
   One or two words give a single shingle of all of them; no words give 0.
3. Each shingle occurrence is hashed with ``shingle_hash`` (below) and votes
   +1 on the bits set in its hash and -1 on the others; a shingle that occurs
   w times thus weighs w. Bit b of the simhash is 1 iff its vote is > 0.

``shingle_hash`` is a murmur3-style 64-bit hash of our own: h = n * 0x9E3779B97F4A7C15;
per 8-byte little-endian block k (the last one zero-padded): k *= C1, k = rotl(k, 31),
k *= C2, h ^= k, h = rotl(h, 27), h = h * 5 + 0x52dce729; finally the murmur3 fmix64.
The pure-Python reference (``simhash_ref``) computes the same values bit for bit.

Votes are counted eight bits at a time: each hash byte indexes a table that
spreads its 8 bits into the 8 byte-lanes of a uint64, so a shingle costs 8 adds
instead of 64; lanes are flushed to wide counters before they can overflow.

The near-duplicate index over these fingerprints has its own kernel,
``blocktables.pyx``.
"""

from libc.stdint cimport int32_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    unsigned int PyUnicode_KIND(object o)
    const void* PyUnicode_DATA(object o)
    # A pure function of the code point (Unicode database lookup): safe without the GIL.
    bint cd_isalnum "Py_UNICODE_ISALNUM"(uint32_t ch) nogil

cdef extern from *:
    """
    #include <string.h>
    #include <stdint.h>
    #include "bits.h"

    static inline uint64_t cd_load_le64(const unsigned char *p) {
        uint64_t v;
        memcpy(&v, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }

    static inline uint64_t cd_round(uint64_t h, uint64_t k) {
        k *= 0x87c37b91114253d5ULL;
        k = cd_rotl64(k, 31);
        k *= 0x4cf5ad432745937fULL;
        h ^= k;
        h = cd_rotl64(h, 27);
        return h * 5 + 0x52dce729ULL;
    }

    static inline uint64_t cd_fmix64(uint64_t k) {
        k ^= k >> 33;
        k *= 0xff51afd7ed558ccdULL;
        k ^= k >> 33;
        k *= 0xc4ceb9fe1a85ec53ULL;
        k ^= k >> 33;
        return k;
    }

    /* The caller guarantees 8 readable bytes at p + (n & ~7): the last block is
       loaded whole and masked, which avoids a byte loop per shingle. */
    static inline uint64_t cd_shingle_hash_padded(const unsigned char *p, Py_ssize_t n) {
        uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ULL;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) h = cd_round(h, cd_load_le64(p + i));
        Py_ssize_t rem = n - i;
        if (rem) h = cd_round(h, cd_load_le64(p + i) & ((1ULL << (8 * rem)) - 1));
        return cd_fmix64(h);
    }

    static inline uint64_t cd_shingle_hash(const unsigned char *p, Py_ssize_t n) {
        uint64_t h = (uint64_t)n * 0x9E3779B97F4A7C15ULL;
        Py_ssize_t i = 0;
        for (; i + 8 <= n; i += 8) h = cd_round(h, cd_load_le64(p + i));
        Py_ssize_t rem = n - i;
        if (rem) {
            unsigned char last[8] = {0};
            memcpy(last, p + i, (size_t)rem);
            h = cd_round(h, cd_load_le64(last));
        }
        return cd_fmix64(h);
    }

    /* Frequency-weighted bit votes over the shingles of the stream buf[0:n]
       ("w1 w2 ...", word i starting at starts[i]). Counted in 8-bit lanes:
       spread[b] puts bit m of byte b into byte m of a uint64, so one add counts
       8 bits; after at most 255 votes the lanes are flushed to wide totals.
       Runs after tokenizing: hashing bytes right after writing them one by one
       would stall on store-to-load forwarding of the 8-byte block loads. */
    static uint64_t cd_vote_shingles(const unsigned char *buf, Py_ssize_t n, const int32_t *starts,
                                     Py_ssize_t words, const uint64_t *spread) {
        if (words == 0) return 0;
        int64_t total[64] = {0};
        Py_ssize_t nsh = words < 3 ? 1 : words - 2;
        for (Py_ssize_t base = 0; base < nsh; base += 255) {
            Py_ssize_t stop = nsh - base < 255 ? nsh : base + 255;
            uint64_t lane[8] = {0};
            for (Py_ssize_t i = base; i < stop; i++) {
                Py_ssize_t s = 0, e = n;
                if (words >= 3) {
                    s = starts[i];
                    e = i + 3 < words ? starts[i + 3] - 1 : n;
                }
                uint64_t h = cd_shingle_hash_padded(buf + s, e - s);
                for (int j = 0; j < 8; j++) lane[j] += spread[(h >> (8 * j)) & 0xFF];
            }
            for (int j = 0; j < 8; j++)
                for (int m = 0; m < 8; m++) total[8 * j + m] += (lane[j] >> (8 * m)) & 0xFF;
        }
        uint64_t out = 0;
        for (int b = 0; b < 64; b++)
            if (2 * total[b] > nsh) out |= (uint64_t)1 << b;  /* vote = ones - zeros > 0 */
        return out;
    }

    /* The ASCII special case of _tokenize: table[c] is the lowercase of c if c is
       alphanumeric, else 0. Branch-free: word boundaries are irregular, and a
       mispredicted branch per boundary costs more than a few extra stores. A
       non-word byte is written as a space and kept only right after a word, so
       each gap collapses to one separator; starts[words] is written speculatively
       and only kept when a word begins there. */
    static Py_ssize_t cd_tokenize_ascii(const unsigned char *s, Py_ssize_t len, const unsigned char *table,
                                        unsigned char *buf, int32_t *starts, Py_ssize_t *nbytes) {
        Py_ssize_t n = 0, words = 0;
        unsigned prev = 0;
        for (Py_ssize_t i = 0; i < len; i++) {
            unsigned a = table[s[i]];
            unsigned w = a != 0;
            buf[n] = (unsigned char)(a | ((w ^ 1u) << 5));
            starts[words] = (int32_t)n;
            words += w & (prev ^ 1u);
            n += w | prev;
            prev = w;
        }
        if (!prev && n > 0) n--;
        *nbytes = n;
        return words;
    }

    """
    uint64_t cd_rotl64(uint64_t x, int r) nogil
    uint64_t cd_shingle_hash_padded(const unsigned char *p, Py_ssize_t n) nogil
    uint64_t cd_shingle_hash(const unsigned char *p, Py_ssize_t n) nogil
    uint64_t cd_vote_shingles(const unsigned char *buf, Py_ssize_t n, const int32_t *starts,
                              Py_ssize_t words, const uint64_t *spread) nogil
    Py_ssize_t cd_tokenize_ascii(const unsigned char *s, Py_ssize_t len, const unsigned char *table,
                                 unsigned char *buf, int32_t *starts, Py_ssize_t *nbytes) nogil
    int cd_popcount64(uint64_t x) nogil


# _SPREAD[b]: byte lane m of the result holds bit m of b (0 or 1).
cdef uint64_t _SPREAD[256]
# _ASCII_WORD[c]: the lowercase of ASCII c if c is alphanumeric, else 0 (0 above 127).
cdef uint8_t _ASCII_WORD[256]
# _LATIN1_ALNUM[c]: str.isalnum() of U+0000..U+00FF (saves a database lookup per Latin-1 letter).
cdef uint8_t _LATIN1_ALNUM[256]


cdef void _init_tables() noexcept:
    cdef int b, m
    for b in range(256):
        _SPREAD[b] = 0
        for m in range(8):
            if (b >> m) & 1:
                _SPREAD[b] |= (<uint64_t>1) << (8 * m)
    for b in range(256):
        _ASCII_WORD[b] = 0
        if 48 <= b <= 57 or 97 <= b <= 122:
            _ASCII_WORD[b] = b
        elif 65 <= b <= 90:
            _ASCII_WORD[b] = b + 32
    for b in range(256):
        _LATIN1_ALNUM[b] = cd_isalnum(b)


_init_tables()


cdef inline Py_ssize_t _put_utf8(unsigned char* out, uint32_t c) noexcept nogil:
    if c < 0x80:
        out[0] = <unsigned char>c
        return 1
    if c < 0x800:
        out[0] = <unsigned char>(0xC0 | (c >> 6))
        out[1] = <unsigned char>(0x80 | (c & 0x3F))
        return 2
    if c < 0x10000:
        out[0] = <unsigned char>(0xE0 | (c >> 12))
        out[1] = <unsigned char>(0x80 | ((c >> 6) & 0x3F))
        out[2] = <unsigned char>(0x80 | (c & 0x3F))
        return 3
    out[0] = <unsigned char>(0xF0 | (c >> 18))
    out[1] = <unsigned char>(0x80 | ((c >> 12) & 0x3F))
    out[2] = <unsigned char>(0x80 | ((c >> 6) & 0x3F))
    out[3] = <unsigned char>(0x80 | (c & 0x3F))
    return 4


ctypedef fused uchar_t:
    uint8_t
    uint16_t
    uint32_t


cdef Py_ssize_t _tokenize(const uchar_t* s, Py_ssize_t length, unsigned char* buf, int32_t* starts,
                          Py_ssize_t* nbytes) noexcept nogil:
    """Write the words of s to buf as "w1 w2 ..." (UTF-8), their offsets to starts; return the count.

    s is already lowercased except for ASCII letters, which the table folds.
    starts needs room for words + 1 entries (one speculative write per character).
    """
    cdef Py_ssize_t i, n = 0, words = 0
    cdef bint prev = False, w
    cdef uint32_t c
    cdef uint8_t a
    for i in range(length):
        c = s[i]
        if c < 128:
            # the same branch-free step as cd_tokenize_ascii
            a = _ASCII_WORD[c]
            w = a != 0
            buf[n] = a if w else 32
            starts[words] = <int32_t>n
            words += w and not prev
            n += w or prev
            prev = w
        elif (_LATIN1_ALNUM[c] != 0) if c < 256 else cd_isalnum(c):
            if not prev:
                starts[words] = <int32_t>n
                words += 1
            n += _put_utf8(buf + n, c)
            prev = True
        else:
            if prev:
                buf[n] = 32
                n += 1
            prev = False
    if not prev and n > 0:
        n -= 1  # drop the separator after the last word
    nbytes[0] = n
    return words


def simhash(str text not None):
    """64-bit simhash of ``text`` over 3-word shingles (see the module docstring)."""
    cdef str t = text if PyUnicode_IS_ASCII(text) else text.lower()  # ASCII: the table folds case
    cdef unsigned int kind = PyUnicode_KIND(t)
    cdef Py_ssize_t length = len(t)
    # UTF-8 bytes per code point: 1 for ASCII, <= 2 below U+0100, <= 3 below U+10000, else 4.
    cdef Py_ssize_t per_char = 1 if PyUnicode_IS_ASCII(t) else (kind + 1 if kind < 4 else 4)
    # The stream "w1 w2 w3 ..." is built once; a shingle is the slice from the start of
    # its first word to the end of its third. 16 bytes of slack for the padded block loads.
    cdef const void* data = PyUnicode_DATA(t)
    cdef Py_ssize_t n = 0, words = 0
    cdef uint64_t result
    if length >= (1 << 29):  # byte offsets are int32
        raise ValueError("text longer than 2**29 code points")
    cdef unsigned char* buf = <unsigned char*>malloc(per_char * length + 16)
    cdef int32_t* starts = <int32_t*>malloc((length // 2 + 2) * sizeof(int32_t))
    if buf == NULL or starts == NULL:
        free(buf)
        free(starts)
        raise MemoryError()
    with nogil:
        if per_char == 1:
            words = cd_tokenize_ascii(<const unsigned char*>data, length, _ASCII_WORD, buf, starts, &n)
        elif kind == 1:
            words = _tokenize(<const uint8_t*>data, length, buf, starts, &n)
        elif kind == 2:
            words = _tokenize(<const uint16_t*>data, length, buf, starts, &n)
        else:
            words = _tokenize(<const uint32_t*>data, length, buf, starts, &n)
        result = cd_vote_shingles(buf, n, starts, words, _SPREAD)
    free(buf)
    free(starts)
    return result


def shingle_hash(const unsigned char[::1] data):
    """The 64-bit hash a shingle's UTF-8 bytes vote with."""
    if data.shape[0] == 0:
        return cd_shingle_hash(NULL, 0)
    return cd_shingle_hash(&data[0], data.shape[0])


def hamming(uint64_t a, uint64_t b):
    """Number of differing bits of two 64-bit fingerprints (OverflowError outside [0, 2**64))."""
    return cd_popcount64(a ^ b)
