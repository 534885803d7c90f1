/*
 * Router-side chained block hashes, computed without materializing token ints.
 *
 * The hash is specified by infera_core.kv.hashing: h_i = hash((h_{i-1}, t_0, ..., t_{bs-1}))
 * with CPython's (3.8+, 64-bit) tuple and int hashes. This module computes exactly that value,
 * either from a list of ints or straight from a msgpack-encoded array of ints (the raw
 * ``token_ids`` field of a KV event, as msgspec.Raw), so ingesting a block costs a few
 * multiplications per token instead of one Python int allocation per token.
 *
 * Tests cross-check every path against ``hash(tuple)`` on random and edge-case input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
static int read_lane(reader *r, uint64_t *lane)
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

static int read_array_len(reader *r, Py_ssize_t *len)
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

/* -- the module ------------------------------------------------------------------- */

static int check_block_size(Py_ssize_t bs)
{
    if (bs < 1) {
        PyErr_SetString(PyExc_ValueError, "block_size must be >= 1");
        return -1;
    }
    return 0;
}

/* Append hash h to out; -1 on error. */
static inline int push(PyObject *out, Py_ssize_t i, Py_hash_t h)
{
    PyObject *o = PyLong_FromSsize_t(h);
    if (o == NULL)
        return -1;
    PyList_SET_ITEM(out, i, o);
    return 0;
}

/* The parent (a previous hash, or a chain root) as a signed 64-bit value. */
static int parse_parent(PyObject *o, int64_t *h)
{
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *h = (int64_t)v;
    return 0;
}

PyDoc_STRVAR(chain_hashes_doc,
             "chain_hashes(token_ids, block_size, parent, /)\n--\n\n"
             "Chained hashes of the full blocks of a sequence of ints: for each full block,\n"
             "``h = hash((h, *token_ids[i:i+block_size]))`` starting from ``h = parent``.");

/* Chained hashes of the full blocks of any sequence of objects (their hash() is the lane). */
static PyObject *chain_seq(PyObject *tokens, Py_ssize_t bs, int64_t h)
{
    PyObject *seq = PySequence_Fast(tokens, "token_ids must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t nblocks = PySequence_Fast_GET_SIZE(seq) / bs;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(nblocks);
    if (out == NULL)
        goto done;
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        uint64_t acc = mix(XXPRIME_5, lane_signed(h));
        PyObject **blk = items + b * bs;
        for (Py_ssize_t i = 0; i < bs; i++) {
            Py_hash_t lh = PyObject_Hash(blk[i]); /* exactly what the tuple hash uses */
            if (lh == -1) {
                Py_CLEAR(out);
                goto done;
            }
            acc = mix(acc, (uint64_t)lh);
        }
        h = finish(acc, bs + 1);
        if (push(out, b, h) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    Py_DECREF(seq);
    return out;
}

/* Chained hashes from a msgpack array of ints in any bytes-like object; ValueError if not one. */
static PyObject *chain_packed(PyObject *packed, Py_ssize_t bs, int64_t h)
{
    Py_buffer view;
    if (PyObject_GetBuffer(packed, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    reader r = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    PyObject *out = NULL;
    Py_ssize_t n;
    if (read_array_len(&r, &n) < 0)
        goto done;
    if (n > r.end - r.p) { /* every item is at least one byte */
        PyErr_SetString(PyExc_ValueError, "token_ids: truncated msgpack");
        goto done;
    }
    Py_ssize_t nblocks = n / bs;
    out = PyList_New(nblocks);
    if (out == NULL)
        goto done;
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        uint64_t acc = mix(XXPRIME_5, lane_signed(h));
        for (Py_ssize_t i = 0; i < bs; i++) {
            uint64_t lane;
            if (read_lane(&r, &lane) < 0) {
                Py_CLEAR(out);
                goto done;
            }
            acc = mix(acc, lane);
        }
        h = finish(acc, bs + 1);
        if (push(out, b, h) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
    /* the partial last block is not hashed, but its items must still be ints */
    for (Py_ssize_t i = nblocks * bs; i < n; i++) {
        uint64_t lane;
        if (read_lane(&r, &lane) < 0) {
            Py_CLEAR(out);
            goto done;
        }
    }
done:
    PyBuffer_Release(&view);
    return out;
}

/* Parse (token_ids, block_size, parent) arguments. */
static int chain_args(const char *sig, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t *bs, int64_t *h)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, sig);
        return -1;
    }
    *bs = PyLong_AsSsize_t(args[1]);
    if (*bs == -1 && PyErr_Occurred())
        return -1;
    return check_block_size(*bs) < 0 || parse_parent(args[2], h) < 0 ? -1 : 0;
}

static PyObject *chain_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t bs;
    int64_t h;
    if (chain_args("chain_hashes(token_ids, block_size, parent)", args, nargs, &bs, &h) < 0)
        return NULL;
    return chain_seq(args[0], bs, h);
}

PyDoc_STRVAR(chain_hashes_msgpack_doc,
             "chain_hashes_msgpack(packed, block_size, parent, /)\n--\n\n"
             "Like chain_hashes, for a msgpack-encoded array of ints (any bytes-like object,\n"
             "e.g. msgspec.Raw). Raises ValueError when it is not an array of ints.");

static PyObject *chain_hashes_msgpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t bs;
    int64_t h;
    if (chain_args("chain_hashes_msgpack(packed, block_size, parent)", args, nargs, &bs, &h) < 0)
        return NULL;
    return chain_packed(args[0], bs, h);
}

/* -- index maintenance: the per-block dict work of KvIndex._store / _remove ----------- */

PyDoc_STRVAR(store_blocks_doc,
             "store_blocks(emap, masks, dups, block_hashes, hashes, bit, /)\n--\n\n"
             "Mirror stored blocks: the native twin of infera_core.kv.accel.py_store_blocks.\n"
             "Returns how many router hashes became newly held.");

/* The loop of store_blocks; -1 with an exception set on error. */
static int do_store(PyObject *em, PyObject *masks, PyObject *dups, PyObject *ehs, PyObject *hs, PyObject *bit,
                    Py_ssize_t *added_out)
{
    Py_ssize_t n = PyList_GET_SIZE(ehs);
    if (PyList_GET_SIZE(hs) < n)
        n = PyList_GET_SIZE(hs);
    Py_ssize_t added = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *eh = PyList_GET_ITEM(ehs, i), *h = PyList_GET_ITEM(hs, i);
        PyObject *cur = PyDict_SetDefault(em, eh, h); /* borrowed */
        if (cur == NULL)
            return -1;
        if (cur != h)
            continue; /* this engine block is already mirrored */
        Py_ssize_t before = PyDict_GET_SIZE(masks);
        PyObject *m = PyDict_SetDefault(masks, h, bit); /* one lookup when h is new */
        if (m == NULL)
            return -1;
        if (PyDict_GET_SIZE(masks) != before) {
            added++;
            continue;
        }
        PyObject *both = PyNumber_And(m, bit);
        if (both == NULL)
            return -1;
        int held = PyObject_IsTrue(both);
        Py_DECREF(both);
        if (held < 0)
            return -1;
        if (held) { /* same tokens under another engine hash */
            PyObject *c = PyDict_GetItemWithError(dups, h);
            if (c == NULL && PyErr_Occurred())
                return -1;
            long cv = c == NULL ? 0 : PyLong_AsLong(c);
            if (cv == -1 && PyErr_Occurred())
                return -1;
            PyObject *c1 = PyLong_FromLong(cv + 1);
            if (c1 == NULL)
                return -1;
            int rc = PyDict_SetItem(dups, h, c1);
            Py_DECREF(c1);
            if (rc < 0)
                return -1;
        } else {
            PyObject *m1 = PyNumber_Or(m, bit);
            if (m1 == NULL)
                return -1;
            int rc = PyDict_SetItem(masks, h, m1);
            Py_DECREF(m1);
            if (rc < 0)
                return -1;
            added++;
        }
    }
    *added_out = added;
    return 0;
}

static PyObject *store_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyList_Check(args[3]) || !PyList_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "store_blocks(dict, dict, dict, list, list, int)");
        return NULL;
    }
    Py_ssize_t added;
    if (do_store(args[0], args[1], args[2], args[3], args[4], args[5], &added) < 0)
        return NULL;
    return PyLong_FromSsize_t(added);
}

/* Remove key from d and return its value (new reference); NULL without an error if absent. */
static PyObject *dict_pop(PyObject *d, PyObject *key)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *v = NULL;
    return PyDict_Pop(d, key, &v) < 0 ? NULL : v;
#else
    PyObject *v = _PyDict_Pop(d, key, Py_None);
    if (v == Py_None) {
        Py_DECREF(v);
        return NULL;
    }
    return v;
#endif
}

PyDoc_STRVAR(remove_blocks_doc,
             "remove_blocks(emap, masks, dups, block_hashes, nbit, /)\n--\n\n"
             "Forget removed blocks: the native twin of infera_core.kv.accel.py_remove_blocks.\n"
             "Returns (router hashes no longer held, engine hashes not mirrored).");

/* The loop of remove_blocks; -1 with an exception set on error. */
static int do_remove(PyObject *em, PyObject *masks, PyObject *dups, PyObject *ehs, PyObject *nbit,
                     Py_ssize_t *removed_out, Py_ssize_t *unknown_out)
{
    Py_ssize_t removed = 0, unknown = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ehs); i++) {
        PyObject *eh = PyList_GET_ITEM(ehs, i);
        PyObject *rh = dict_pop(em, eh); /* new reference */
        if (rh == NULL) {
            if (PyErr_Occurred())
                return -1;
            unknown++;
            continue;
        }
        int rc = 0;
        if (rc == 0 && PyDict_GET_SIZE(dups)) {
            PyObject *c = PyDict_GetItemWithError(dups, rh);
            if (c == NULL && PyErr_Occurred()) {
                rc = -1;
            } else if (c != NULL) { /* another engine hash still holds these tokens */
                long cv = PyLong_AsLong(c);
                if (cv == -1 && PyErr_Occurred()) {
                    rc = -1;
                } else if (cv > 1) {
                    PyObject *c1 = PyLong_FromLong(cv - 1);
                    rc = c1 == NULL ? -1 : PyDict_SetItem(dups, rh, c1);
                    Py_XDECREF(c1);
                } else {
                    rc = PyDict_DelItem(dups, rh);
                }
                Py_DECREF(rh);
                if (rc < 0)
                    return -1;
                continue;
            }
        }
        PyObject *m = rc < 0 ? NULL : PyDict_GetItemWithError(masks, rh);
        if (m != NULL) {
            PyObject *m1 = PyNumber_And(m, nbit);
            int keep = m1 == NULL ? -1 : PyObject_IsTrue(m1);
            if (keep > 0)
                rc = PyDict_SetItem(masks, rh, m1);
            else if (keep == 0)
                rc = PyDict_DelItem(masks, rh);
            else
                rc = -1;
            Py_XDECREF(m1);
            if (rc == 0)
                removed++;
        } else if (PyErr_Occurred()) {
            rc = -1;
        }
        Py_DECREF(rh);
        if (rc < 0)
            return -1;
    }
    *removed_out = removed;
    *unknown_out = unknown;
    return 0;
}

static PyObject *remove_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyDict_Check(args[0]) || !PyDict_Check(args[1]) || !PyDict_Check(args[2]) ||
        !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "remove_blocks(dict, dict, dict, list, int)");
        return NULL;
    }
    Py_ssize_t removed, unknown;
    if (do_remove(args[0], args[1], args[2], args[3], args[4], &removed, &unknown) < 0)
        return NULL;
    return Py_BuildValue("(nn)", removed, unknown);
}

static PyMethodDef methods[] = {
    {"chain_hashes", (PyCFunction)(void (*)(void))chain_hashes, METH_FASTCALL, chain_hashes_doc},
    {"chain_hashes_msgpack", (PyCFunction)(void (*)(void))chain_hashes_msgpack, METH_FASTCALL,
     chain_hashes_msgpack_doc},
    {"store_blocks", (PyCFunction)(void (*)(void))store_blocks, METH_FASTCALL, store_blocks_doc},
    {"remove_blocks", (PyCFunction)(void (*)(void))remove_blocks, METH_FASTCALL, remove_blocks_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "infera_kv_native._chain",
    .m_doc = "Native hot loops of the KV index (see infera_core.kv.accel).",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__chain(void) { return PyModuleDef_Init(&module); }
