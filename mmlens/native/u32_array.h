/* A msgpack array's ints read as native u32s: the token ids of a KV event, read by both
 * compiled modules that take them out of msgpack bytes (mmlens/layout/_chain.c,
 * mmlens/ingest/_kvbatch.c). */
#ifndef MMLENS_U32_ARRAY_H
#define MMLENS_U32_ARRAY_H

#include <stddef.h>
#include <stdint.h>

/* n msgpack ints from *pp (ending before end), each in [0, 2^32), into dst; *pp then points
 * past them. -1, *pp unchanged, at any other value or when the bytes end first. */
static inline int read_u32s(const uint8_t **pp, const uint8_t *end, size_t n, uint32_t *dst) {
    const uint8_t *p = *pp;
    for (size_t i = 0; i < n; i++) {
        if (p >= end)
            return -1;
        uint8_t c = *p;
        if (c < 0x80) {
            dst[i] = c;
            p += 1;
            continue;
        }
        int width;
        switch (c) {
        case 0xcc: case 0xd0: width = 1; break;
        case 0xcd: case 0xd1: width = 2; break;
        case 0xce: case 0xd2: width = 4; break;
        case 0xcf: case 0xd3: width = 8; break;
        default: return -1;
        }
        if (end - p < 1 + width || (c >= 0xd0 && (p[1] & 0x80))) /* short, or negative */
            return -1;
        uint64_t v = 0;
        for (int k = 1; k <= width; k++)
            v = (v << 8) | p[k];
        if (v > 0xFFFFFFFFull)
            return -1;
        dst[i] = (uint32_t)v;
        p += 1 + width;
    }
    *pp = p;
    return 0;
}

#endif
