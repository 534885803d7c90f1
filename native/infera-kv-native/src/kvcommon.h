/*
 * Shared by chain.c and index.c: CPython's tuple-hash arithmetic (64-bit builds) and a
 * bounds-checked msgpack reader for arrays of ints.
 */
#ifndef INFERA_KVCOMMON_H
#define INFERA_KVCOMMON_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The extension is built for the limited API (one abi3 wheel for CPython >= 3.11), which has
   no unchecked accessor macros: these are the borrowed-reference function forms for what
   PySequence_Fast returns (a list or a tuple). */
static inline Py_ssize_t fast_size(PyObject *seq)
{
    return PyList_Check(seq) ? PyList_Size(seq) : PyTuple_Size(seq);
}

static inline PyObject *fast_item(PyObject *seq, Py_ssize_t i)
{
    return PyList_Check(seq) ? PyList_GetItem(seq, i) : PyTuple_GetItem(seq, i);
}

#if SIZEOF_VOID_P < 8
#error "infera-kv-native needs a 64-bit CPython"
#endif

#define XXPRIME_1 11400714785074694791ULL
#define XXPRIME_2 14029467366897019727ULL
#define XXPRIME_5 2870177450012600261ULL
#define ROTL31(x) (((x) << 31) | ((x) >> 33))
#define MODULUS ((1ULL << 61) - 1) /* CPython's _PyHASH_MODULUS on 64-bit builds */

/* hash() of a non-negative Python int with value v */
static inline uint64_t lane_unsigned(uint64_t v) { return v < MODULUS ? v : v % MODULUS; }

/* hash() of a Python int with signed value v */
static inline uint64_t lane_signed(int64_t v)
{
    if (v >= 0)
        return lane_unsigned((uint64_t)v);
    uint64_t mag = ((uint64_t)(-(v + 1)) + 1) % MODULUS; /* |v| without overflow at INT64_MIN */
    int64_t h = -(int64_t)mag;
    if (h == -1)
        h = -2;
    return (uint64_t)h;
}

static inline uint64_t mix(uint64_t acc, uint64_t lane)
{
    acc += lane * XXPRIME_2;
    acc = ROTL31(acc);
    return acc * XXPRIME_1;
}

static inline Py_hash_t finish(uint64_t acc, Py_ssize_t len)
{
    acc += (uint64_t)len ^ (XXPRIME_5 ^ 3527539UL);
    if (acc == (uint64_t)-1)
        return 1546275796;
    return (Py_hash_t)acc;
}

/* -- msgpack reading -------------------------------------------------------------- */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} reader;

static inline uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The hash lane of the next int; -1 on a non-int or truncated item (ValueError set). */
static inline int read_lane(reader *r, uint64_t *lane)
{
    if (r->p >= r->end)
        goto truncated;
    unsigned char t = *r->p++;
    int n;
    if (t <= 0x7f) {
        *lane = t;
        return 0;
    }
    if (t >= 0xe0) { /* negative fixint */
        *lane = lane_signed((int64_t)(int8_t)t);
        return 0;
    }
    switch (t) {
    case 0xcc: /* uint8, uint16: the common token ids */
        if (r->p >= r->end)
            goto truncated;
        *lane = *r->p++;
        return 0;
    case 0xcd:
        if (r->end - r->p < 2)
            goto truncated;
        *lane = ((uint64_t)r->p[0] << 8) | r->p[1];
        r->p += 2;
        return 0;
    case 0xce: n = 4; break;
    case 0xcf: n = 8; break;
    case 0xd0: n = -1; break;
    case 0xd1: n = -2; break;
    case 0xd2: n = -4; break;
    case 0xd3: n = -8; break;
    default:
        PyErr_Format(PyExc_ValueError, "token_ids item is not an int (msgpack type 0x%02x)", t);
        return -1;
    }
    int len = n < 0 ? -n : n;
    if (r->end - r->p < len)
        goto truncated;
    uint64_t v = be(r->p, len);
    r->p += len;
    if (n > 0) {
        *lane = lane_unsigned(v);
    } else {
        int shift = 64 - 8 * len; /* sign-extend */
        *lane = lane_signed((int64_t)(v << shift) >> shift);
    }
    return 0;
truncated:
    PyErr_SetString(PyExc_ValueError, "token_ids: truncated msgpack");
    return -1;
}

static inline int read_array_len(reader *r, Py_ssize_t *len)
{
    if (r->p >= r->end)
        goto truncated;
    unsigned char t = *r->p++;
    if ((t & 0xf0) == 0x90) {
        *len = t & 0x0f;
        return 0;
    }
    int n = t == 0xdc ? 2 : t == 0xdd ? 4 : 0;
    if (!n) {
        PyErr_Format(PyExc_ValueError, "token_ids is not a msgpack array (type 0x%02x)", t);
        return -1;
    }
    if (r->end - r->p < n)
        goto truncated;
    *len = (Py_ssize_t)be(r->p, n);
    r->p += n;
    return 0;
truncated:
    PyErr_SetString(PyExc_ValueError, "token_ids: truncated msgpack");
    return -1;
}


/* The chained hash of one block of bs lanes read from r, continuing from parent h. */
static inline int64_t hash_block(reader *r, Py_ssize_t bs, int64_t h, int *err)
{
    uint64_t acc = mix(XXPRIME_5, lane_signed(h));
    for (Py_ssize_t i = 0; i < bs; i++) {
        uint64_t lane;
        if (read_lane(r, &lane) < 0) {
            *err = 1;
            return 0;
        }
        acc = mix(acc, lane);
    }
    return (int64_t)finish(acc, bs + 1);
}

#endif
