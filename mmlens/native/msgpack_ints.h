/* msgpack ints as the compiled modules that read KV events' msgpack bytes read them
 * (mmlens/layout/_chain.c, mmlens/ingest/_kvbatch.c): a fixed-width int's payload width, its
 * big-endian bytes, and a whole array of them as native u32s (a KV event's token ids). */
#ifndef MMLENS_MSGPACK_INTS_H
#define MMLENS_MSGPACK_INTS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t be(const uint8_t *p, int width) {
    uint64_t v = 0;
    for (int k = 0; k < width; k++)
        v = (v << 8) | p[k];
    return v;
}

/* The payload bytes after type byte c of a uint 8-64 (0xcc-0xcf) or int 8-64 (0xd0-0xd3);
 * 0 for any other type byte. */
static inline int int_width(uint8_t c) {
    switch (c) {
    case 0xcc: case 0xd0: return 1;
    case 0xcd: case 0xd1: return 2;
    case 0xce: case 0xd2: return 4;
    case 0xcf: case 0xd3: return 8;
    default: return 0;
    }
}

/* n msgpack ints from *pp (ending before end), each in [0, 2^32), into dst; *pp then points
 * past them. -1, *pp unchanged, at any other value or when the bytes end first. */
static inline int read_u32s(const uint8_t **pp, const uint8_t *end, size_t n, uint32_t *dst) {
    const uint8_t *p = *pp;
    size_t i = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* Where 9 bytes are left, without a branch on the type byte: token ids of a vocabulary
     * mix 3- and 5-byte ints at random, so a branch per width mispredicts about every other
     * id. Each id's payload is one 8-byte load shifted down to its width. */
    uint64_t bad = 0;
    for (; i < n && end - p >= 9; i++) {
        uint8_t c = *p;
        unsigned k = (uint8_t)(c - 0xcc); /* 0-3: uint 8-64, 4-7: int 8-64 */
        unsigned fix = c < 0x80, w = 1u << (k & 3);
        uint64_t raw;
        memcpy(&raw, p + 1, 8);
        uint64_t v = __builtin_bswap64(raw) >> (64 - 8 * w);
        bad |= (uint64_t)(!fix & (k >= 8)) | ((uint64_t)(!fix & (k >= 4)) & (p[1] >> 7))
               | (fix ? 0 : v >> 32);
        dst[i] = fix ? c : (uint32_t)v;
        p += fix ? 1 : 1 + w;
    }
    if (bad)
        return -1;
#endif
    for (; i < n; i++) {
        if (p >= end)
            return -1;
        uint8_t c = *p;
        if (c < 0x80) {
            dst[i] = c;
            p += 1;
            continue;
        }
        int width = int_width(c);
        if (!width || end - p < 1 + width || (c >= 0xd0 && (p[1] & 0x80))) /* short, negative */
            return -1;
        uint64_t v = be(p + 1, width);
        if (v > 0xFFFFFFFFull)
            return -1;
        dst[i] = (uint32_t)v;
        p += 1 + width;
    }
    *pp = p;
    return 0;
}

#endif
