/*
 * A generic, bounds-checked msgpack item reader for the native batch parser (index.c).
 * Nothing here raises: a malformed or unexpected payload makes the parser hand the batch
 * back to the Python decoder, which reports it.
 */
#ifndef INFERA_MSGPACK_H
#define INFERA_MSGPACK_H
#include "kvcommon.h"

enum { MP_NIL, MP_BOOL, MP_INT, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP, MP_EXT };

typedef struct {
    int type;
    int neg;                  /* MP_INT: negative (u holds the two's complement bits) */
    uint64_t u;               /* MP_INT value, MP_ARRAY/MP_MAP count */
    const unsigned char *ptr; /* MP_STR/MP_BIN/MP_EXT payload */
    size_t len;
} mpitem;

/* Whether p[0..n) is valid UTF-8 (RFC 3629: no overlongs, surrogates or code points past
 * U+10FFFF), as msgpack str items must be for Python to decode them. */
static inline int utf8_ok(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned char lo = 0x80, hi = 0xbf; /* bounds of the second byte */
        if (c >= 0xc2 && c <= 0xdf)
            len = 2;
        else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            if (c == 0xe0)
                lo = 0xa0;
            else if (c == 0xed)
                hi = 0x9f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            if (c == 0xf0)
                lo = 0x90;
            else if (c == 0xf4)
                hi = 0x8f;
        } else
            return 0;
        if (n - i < len || p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (size_t k = 2; k < len; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xbf)
                return 0;
        i += len;
    }
    return 1;
}

/* Read one item header (and step over a str/bin/ext payload); -1 when malformed. */
static inline int mp_read(reader *r, mpitem *it)
{
    if (r->p >= r->end)
        return -1;
    unsigned char t = *r->p++;
    size_t n = 0, skip = 0; /* bytes of length / value that follow, extra ext type byte */
    it->neg = 0;
    if (t <= 0x7f) {
        it->type = MP_INT;
        it->u = t;
        return 0;
    }
    if (t >= 0xe0) {
        it->type = MP_INT;
        it->neg = 1;
        it->u = (uint64_t)(int64_t)(int8_t)t;
        return 0;
    }
    if (t <= 0x8f || (t >= 0x90 && t <= 0x9f)) {
        it->type = t <= 0x8f ? MP_MAP : MP_ARRAY;
        it->u = t & 0x0f;
        return 0;
    }
    if (t >= 0xa0 && t <= 0xbf) {
        it->type = MP_STR;
        it->len = t & 0x1f;
        goto payload;
    }
    switch (t) {
    case 0xc0: it->type = MP_NIL; return 0;
    case 0xc2: case 0xc3: it->type = MP_BOOL; it->u = t & 1; return 0;
    case 0xc4: case 0xc5: case 0xc6: it->type = MP_BIN; n = (size_t)1 << (t - 0xc4); goto sized;
    case 0xc7: case 0xc8: case 0xc9: it->type = MP_EXT; n = (size_t)1 << (t - 0xc7); skip = 1; goto sized;
    case 0xca: it->type = MP_FLOAT; n = 4; goto fixed;
    case 0xcb: it->type = MP_FLOAT; n = 8; goto fixed;
    case 0xcc: case 0xcd: case 0xce: case 0xcf: it->type = MP_INT; n = (size_t)1 << (t - 0xcc); goto fixed;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: it->type = MP_INT; n = (size_t)1 << (t - 0xd0); goto fixed;
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        it->type = MP_EXT;
        it->len = ((size_t)1 << (t - 0xd4)) + 1;
        goto payload;
    case 0xd9: case 0xda: case 0xdb: it->type = MP_STR; n = (size_t)1 << (t - 0xd9); goto sized;
    case 0xdc: case 0xdd: it->type = MP_ARRAY; n = (size_t)2 << (t - 0xdc); goto count;
    case 0xde: case 0xdf: it->type = MP_MAP; n = (size_t)2 << (t - 0xde); goto count;
    default: return -1; /* 0xc1 is never used */
    }
fixed:
    if ((size_t)(r->end - r->p) < n)
        return -1;
    it->u = be(r->p, (int)n);
    if (t >= 0xd0 && t <= 0xd3) { /* sign-extend */
        int shift = 64 - 8 * (int)n;
        it->u = (uint64_t)((int64_t)(it->u << shift) >> shift);
        it->neg = (int64_t)it->u < 0;
    }
    r->p += n;
    return 0;
count:
    if ((size_t)(r->end - r->p) < n)
        return -1;
    it->u = be(r->p, (int)n);
    r->p += n;
    return it->u > (uint64_t)(r->end - r->p) ? -1 : 0; /* every item takes a byte at least */
sized:
    if ((size_t)(r->end - r->p) < n)
        return -1;
    it->len = (size_t)be(r->p, (int)n) + skip;
    r->p += n;
payload:
    if ((size_t)(r->end - r->p) < it->len)
        return -1;
    it->ptr = r->p;
    r->p += it->len;
    return it->type == MP_STR && !utf8_ok(it->ptr, it->len) ? -1 : 0;
}

/* Step over one whole item; -1 when malformed or nested deeper than 32. */
static inline int mp_skip(reader *r, int depth)
{
    mpitem it;
    if (depth > 32 || mp_read(r, &it) < 0)
        return -1;
    if (it.type == MP_ARRAY || it.type == MP_MAP) {
        uint64_t n = it.type == MP_MAP ? it.u * 2 : it.u;
        for (uint64_t i = 0; i < n; i++)
            if (mp_skip(r, depth + 1) < 0)
                return -1;
    }
    return 0;
}

static inline int mp_str_is(const mpitem *it, const char *s)
{
    size_t n = strlen(s);
    return it->type == MP_STR && it->len == n && memcmp(it->ptr, s, n) == 0;
}

#endif
