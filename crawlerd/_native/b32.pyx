# cython: language_level=3, boundscheck=False, wraparound=False
"""Base32 (RFC 4648 §6) of a 20-byte SHA-1 digest, in C.

Every WARC record carries a ``sha1:`` digest (block digest, and a payload digest for responses)
and each CDXJ line and event repeats one: four or more per page in the worker. 160 bits are
exactly 32 characters (no padding); each group of 5 bytes gives 8 characters. The reference
(``b32_ref.py``) and ``base64.b32encode`` give the same text (``tests/store/test_warc.py``).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

cdef const char *_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def sha1_base32(bytes digest):
    """Base32 of a 20-byte digest: 32 characters, no padding."""
    if PyBytes_GET_SIZE(digest) != 20:
        raise ValueError(f"a SHA-1 digest is 20 bytes, got {len(digest)}")
    cdef const unsigned char *d = <const unsigned char *> PyBytes_AS_STRING(digest)
    cdef char out[32]
    cdef unsigned long long acc
    cdef int g, k
    for g in range(4):
        acc = ((<unsigned long long> d[5 * g] << 32) | (<unsigned long long> d[5 * g + 1] << 24)
               | (<unsigned long long> d[5 * g + 2] << 16) | (<unsigned long long> d[5 * g + 3] << 8)
               | <unsigned long long> d[5 * g + 4])
        for k in range(8):
            out[8 * g + k] = _ALPHABET[(acc >> (35 - 5 * k)) & 31]
    return out[:32].decode("ascii")
