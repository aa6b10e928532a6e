/* 64-bit word helpers shared by the simhash and block-table kernels (included by both .pyx). */
#ifndef CRAWLERD_BITS_H
#define CRAWLERD_BITS_H

#include <stdint.h>

static inline uint64_t cd_rotl64(uint64_t x, int r) {
    return r == 0 ? x : (x << r) | (x >> (64 - r));
}

static inline int cd_popcount64(uint64_t x) {
    x = x - ((x >> 1) & 0x5555555555555555ULL);
    x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
    x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
    return (int)((x * 0x0101010101010101ULL) >> 56);
}

#endif
