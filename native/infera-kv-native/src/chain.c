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
#include "kvcommon.h"
#include "index.h"
#include "score.h"

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
    PyList_SetItem(out, i, o);
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
    int is_list = PyList_Check(seq); /* once: each check is a call in the limited API */
    Py_ssize_t nblocks = fast_size(seq) / bs;
    PyObject *out = PyList_New(nblocks);
    if (out == NULL)
        goto done;
    for (Py_ssize_t b = 0; b < nblocks; b++) {
        uint64_t acc = mix(XXPRIME_5, lane_signed(h));
        for (Py_ssize_t i = 0; i < bs; i++) {
            Py_ssize_t at = b * bs + i;
            PyObject *item = is_list ? PyList_GetItem(seq, at) : PyTuple_GetItem(seq, at);
            Py_hash_t lh = PyObject_Hash(item); /* exactly what the tuple hash uses */
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
        int err = 0;
        h = hash_block(&r, bs, h, &err);
        if (err || push(out, b, h) < 0) {
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

static PyMethodDef methods[] = {
    {"chain_hashes", (PyCFunction)(void (*)(void))chain_hashes, METH_FASTCALL, chain_hashes_doc},
    {"chain_hashes_msgpack", (PyCFunction)(void (*)(void))chain_hashes_msgpack, METH_FASTCALL,
     chain_hashes_msgpack_doc},
    {"fold_key", (PyCFunction)(void (*)(void))fold_key, METH_FASTCALL, fold_key_doc},
    {"batch_dp_rank", (PyCFunction)(void (*)(void))batch_dp_rank, METH_FASTCALL, batch_dp_rank_doc},
    {"predicted_ttft", (PyCFunction)(void (*)(void))predicted_ttft, METH_FASTCALL, predicted_ttft_doc},
    {"weighted_sum", (PyCFunction)(void (*)(void))weighted_sum, METH_FASTCALL, weighted_sum_doc},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m) { return index_add_type(m); }

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, (void *)exec_module},
    {0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "infera_kv_native._chain",
    .m_doc = "Native hot loops of the KV index (see infera_core.kv.accel).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__chain(void) { return PyModuleDef_Init(&module); }
