/*
 * The native KV index: the block-keeping of infera_core.kv.index.KvIndex in C tables.
 *
 * Per worker slot and storage tier (0 GPU, 1 CPU, 2 disk): an insertion-ordered map engine
 * block hash -> router hash (emap), duplicate counts for router hashes held under several
 * engine hashes, and a block count. Per tier: router hash -> bitset of the slots holding
 * it, one u64 table per 64 slots. The pure-Python store in infera_core.kv.store is the
 * specification; tests check both give identical results.
 *
 * apply_payload() parses a vLLM-style msgpack batch (map layout) and applies it without
 * creating Python objects per event. It validates the whole batch first and returns None,
 * having changed nothing, for anything it does not handle (array layout, unknown event
 * tags, non-int token ids, odd types): the caller then decodes it in Python.
 *
 * Engine hashes are keyed as 64-bit ints: ints in [-2^63, 2^64) by their two's-complement
 * bits, bytes digests by a 64-bit fold (fold_bytes), other ints by a fold of hash().
 * Router hashes are CPython hash() values (signed 64-bit), stored as their bits.
 */
#include "index.h"
#include "msgpack.h"
#include "tables.h"

#define NTIERS 3
#define MAX_SLOT (1 << 20)
#define ROUTER_HASH_SEED 0x1FE8A5EEDULL
#define LORA_TAG 0x10AA

/* -- keys ------------------------------------------------------------------------------ */

static inline uint64_t fmix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t fold_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 0x243F6A8885A308D3ULL ^ ((uint64_t)n * GOLDEN);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x9FB21C651E98DF25ULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0x9FB21C651E98DF25ULL;
    }
    return fmix(h);
}

/* The key of an engine block hash given as a Python object; -1 with an exception set. */
static int key_of(PyObject *o, uint64_t *k)
{
    if (PyLong_Check(o)) {
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow) {
            if (v == -1 && PyErr_Occurred())
                return -1;
            *k = (uint64_t)v;
            return 0;
        }
        if (overflow > 0) {
            unsigned long long u = PyLong_AsUnsignedLongLong(o);
            if (!(u == (unsigned long long)-1 && PyErr_Occurred())) {
                *k = u;
                return 0;
            }
            PyErr_Clear();
        }
        Py_hash_t h = PyObject_Hash(o);
        if (h == -1)
            return -1;
        *k = fmix((uint64_t)h ^ 0x5bd1e9955bd1e995ULL);
        return 0;
    }
    if (PyBytes_Check(o)) {
        *k = fold_bytes((const unsigned char *)PyBytes_AS_STRING(o), (size_t)PyBytes_GET_SIZE(o));
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "block hash must be an int or bytes, not %.100s", Py_TYPE(o)->tp_name);
    return -1;
}

/* The key of a msgpack block hash (int or bin); -1 for any other item. */
static inline int read_key(reader *r, uint64_t *k)
{
    mpitem it;
    if (mp_read(r, &it) < 0)
        return -1;
    if (it.type == MP_INT)
        *k = it.u;
    else if (it.type == MP_BIN)
        *k = fold_bytes(it.ptr, it.len);
    else
        return -1;
    return 0;
}

const char fold_key_doc[] = "fold_key(block_hash, /)\n--\n\n"
                            "The 64-bit key the native index files an engine block hash (int or bytes) under.";

PyObject *fold_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t k;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "fold_key(block_hash)");
        return NULL;
    }
    return key_of(args[0], &k) < 0 ? NULL : PyLong_FromUnsignedLongLong(k);
}

/* hash((ROUTER_HASH_SEED, 0x10AA, lora_id)): infera_core.kv.hashing.root_hash */
static int64_t lora_root(int64_t lora)
{
    uint64_t acc = XXPRIME_5;
    acc = mix(acc, ROUTER_HASH_SEED);
    acc = mix(acc, LORA_TAG);
    acc = mix(acc, lane_signed(lora));
    return (int64_t)finish(acc, 3);
}

/* -- the index --------------------------------------------------------------------------- */

typedef struct {
    emap em[NTIERS];
    vmap dups[NTIERS];
    int64_t nblocks[NTIERS];
} view_t;

typedef struct {
    PyObject_HEAD
    view_t *views;
    Py_ssize_t nviews;
    vmap *masks[NTIERS]; /* one table per 64 slots */
    Py_ssize_t nchunks[NTIERS];
} IndexObject;

static view_t *view_at(IndexObject *x, Py_ssize_t slot)
{
    if (slot < x->nviews)
        return &x->views[slot];
    Py_ssize_t n = x->nviews ? x->nviews : 8;
    while (n <= slot)
        n *= 2;
    view_t *v = realloc(x->views, (size_t)n * sizeof(view_t));
    if (v == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memset(v + x->nviews, 0, (size_t)(n - x->nviews) * sizeof(view_t));
    x->views = v;
    x->nviews = n;
    return &v[slot];
}

static vmap *chunk_at(IndexObject *x, int tier, Py_ssize_t c)
{
    if (c < x->nchunks[tier])
        return &x->masks[tier][c];
    vmap *m = realloc(x->masks[tier], (size_t)(c + 1) * sizeof(vmap));
    if (m == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memset(m + x->nchunks[tier], 0, (size_t)(c + 1 - x->nchunks[tier]) * sizeof(vmap));
    x->masks[tier] = m;
    x->nchunks[tier] = c + 1;
    return &m[c];
}

/* Mirror one stored block: 1 newly held, 0 not, -1 MemoryError. */
static inline int store_one(IndexObject *x, view_t *v, Py_ssize_t slot, int tier, uint64_t ek, uint64_t rh)
{
    int r = em_add(&v->em[tier], ek, rh);
    if (r <= 0)
        return r; /* this engine block is already mirrored */
    vmap *mt = chunk_at(x, tier, slot >> 6);
    if (mt == NULL)
        return -1;
    uint64_t bit = 1ULL << (slot & 63);
    int fresh;
    kv64 *e = vm_slot(mt, rh, &fresh);
    if (e == NULL)
        return -1;
    if (e->val & bit) { /* the same tokens under another engine hash */
        kv64 *d = vm_slot(&v->dups[tier], rh, &fresh);
        if (d == NULL)
            return -1;
        d->val++;
        return 0;
    }
    e->val |= bit;
    v->nblocks[tier]++;
    return 1;
}

static inline void unmask(IndexObject *x, int tier, Py_ssize_t slot, uint64_t rh, int *found)
{
    Py_ssize_t c = slot >> 6;
    kv64 *e = c < x->nchunks[tier] ? vm_find(&x->masks[tier][c], rh) : NULL;
    *found = e != NULL;
    if (e != NULL) {
        e->val &= ~(1ULL << (slot & 63));
        if (!e->val)
            vm_delete(&x->masks[tier][c], e);
    }
}

/* Forget one removed block. */
static inline void remove_one(IndexObject *x, view_t *v, Py_ssize_t slot, int tier, uint64_t ek, Py_ssize_t *removed,
                              Py_ssize_t *unknown)
{
    uint64_t rh;
    if (!em_pop(&v->em[tier], ek, &rh)) {
        (*unknown)++;
        return;
    }
    if (v->dups[tier].n) {
        kv64 *d = vm_find(&v->dups[tier], rh);
        if (d != NULL) { /* another engine hash still holds these tokens */
            if (d->val > 1)
                d->val--;
            else
                vm_delete(&v->dups[tier], d);
            return;
        }
    }
    int found;
    unmask(x, tier, slot, rh, &found);
    if (found) {
        (*removed)++;
        v->nblocks[tier]--;
    }
}

static void clear_view(IndexObject *x, view_t *v, Py_ssize_t slot)
{
    for (int t = 0; t < NTIERS; t++) {
        emap *m = &v->em[t];
        for (uint32_t j = 0; j < m->nents; j++) {
            eslot *e = em_entry(m, j);
            if (e != NULL) {
                int found;
                unmask(x, t, slot, e->val, &found);
            }
        }
        em_free(m);
        vm_free(&v->dups[t]);
        v->nblocks[t] = 0;
    }
}

/* The router hash of engine block ek on any tier, GPU first. */
static inline int lookup(const view_t *v, uint64_t ek, uint64_t *rh)
{
    for (int t = 0; t < NTIERS; t++)
        if (em_get(&v->em[t], ek, rh))
            return 1;
    return 0;
}

/* -- argument helpers ---------------------------------------------------------------- */

static int arg_slot(PyObject *o, Py_ssize_t *slot)
{
    *slot = PyLong_AsSsize_t(o);
    if (*slot == -1 && PyErr_Occurred())
        return -1;
    if (*slot < 0 || *slot >= MAX_SLOT) {
        PyErr_Format(PyExc_ValueError, "slot %zd out of range", *slot);
        return -1;
    }
    return 0;
}

static int arg_tier(PyObject *o, int *tier)
{
    long t = PyLong_AsLong(o);
    if (t == -1 && PyErr_Occurred())
        return -1;
    if (t < 0 || t >= NTIERS) {
        PyErr_Format(PyExc_ValueError, "tier %ld out of range", t);
        return -1;
    }
    *tier = (int)t;
    return 0;
}

static int nargs_is(Py_ssize_t nargs, Py_ssize_t want, const char *sig)
{
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", sig, want, nargs);
    return -1;
}

/* Read-only access: NULL (no error) when the slot never held anything. */
static view_t *peek_view(IndexObject *x, Py_ssize_t slot) { return slot < x->nviews ? &x->views[slot] : NULL; }

/* -- per-event methods (decoded batches from any decoder) ------------------------------ */

static PyObject *Index_lookup(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot;
    uint64_t ek, rh;
    if (nargs_is(nargs, 2, "lookup(slot, block_hash)") < 0 || arg_slot(args[0], &slot) < 0 ||
        key_of(args[1], &ek) < 0)
        return NULL;
    view_t *v = peek_view(x, slot);
    if (v == NULL || !lookup(v, ek, &rh))
        Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)rh);
}

static PyObject *Index_store(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot, added = 0;
    int tier;
    if (nargs_is(nargs, 4, "store(slot, tier, block_hashes, hashes)") < 0 || arg_slot(args[0], &slot) < 0 ||
        arg_tier(args[1], &tier) < 0)
        return NULL;
    if (!PyList_Check(args[2]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "store: block_hashes and hashes must be lists");
        return NULL;
    }
    view_t *v = view_at(x, slot);
    if (v == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[2]);
    if (PyList_GET_SIZE(args[3]) < n)
        n = PyList_GET_SIZE(args[3]);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t ek;
        if (key_of(PyList_GET_ITEM(args[2], i), &ek) < 0)
            return NULL;
        long long rh = PyLong_AsLongLong(PyList_GET_ITEM(args[3], i));
        if (rh == -1 && PyErr_Occurred())
            return NULL;
        int r = store_one(x, v, slot, tier, ek, (uint64_t)rh);
        if (r < 0)
            return NULL;
        added += r;
    }
    return PyLong_FromSsize_t(added);
}

static PyObject *Index_remove(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot, removed = 0, unknown = 0;
    int tier;
    if (nargs_is(nargs, 3, "remove(slot, tier, block_hashes)") < 0 || arg_slot(args[0], &slot) < 0 ||
        arg_tier(args[1], &tier) < 0)
        return NULL;
    if (!PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "remove: block_hashes must be a list");
        return NULL;
    }
    view_t *v = peek_view(x, slot);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[2]); i++) {
        uint64_t ek;
        if (key_of(PyList_GET_ITEM(args[2], i), &ek) < 0)
            return NULL;
        if (v == NULL)
            unknown++;
        else
            remove_one(x, v, slot, tier, ek, &removed, &unknown);
    }
    return Py_BuildValue("(nn)", removed, unknown);
}

static PyObject *Index_clear(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot;
    if (nargs_is(nargs, 1, "clear(slot)") < 0 || arg_slot(args[0], &slot) < 0)
        return NULL;
    view_t *v = peek_view(x, slot);
    if (v != NULL)
        clear_view(x, v, slot);
    Py_RETURN_NONE;
}

static PyObject *Index_evict_oldest(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot, count, removed = 0;
    if (nargs_is(nargs, 2, "evict_oldest(slot, count)") < 0 || arg_slot(args[0], &slot) < 0)
        return NULL;
    count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    view_t *v = peek_view(x, slot);
    for (int t = NTIERS - 1; v != NULL && t >= 0 && removed < count; t--) {
        emap *m = &v->em[t];
        Py_ssize_t victims = count - removed, unknown = 0;
        /* entries are only appended or compacted on insert, so removing while walking is safe */
        for (uint32_t j = 0; j < m->nents && victims > 0; j++) {
            if (em_entry(m, j) != NULL) {
                victims--;
                remove_one(x, v, slot, t, m->keys[j], &removed, &unknown);
            }
        }
    }
    return PyLong_FromSsize_t(removed);
}

static PyObject *Index_nblocks(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot;
    if (nargs_is(nargs, 1, "nblocks(slot)") < 0 || arg_slot(args[0], &slot) < 0)
        return NULL;
    view_t *v = peek_view(x, slot);
    if (v == NULL)
        return Py_BuildValue("(iii)", 0, 0, 0);
    return Py_BuildValue("(LLL)", (long long)v->nblocks[0], (long long)v->nblocks[1], (long long)v->nblocks[2]);
}

static PyObject *Index_held(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot;
    int tier;
    if (nargs_is(nargs, 2, "held(slot, tier)") < 0 || arg_slot(args[0], &slot) < 0 || arg_tier(args[1], &tier) < 0)
        return NULL;
    PyObject *out = PySet_New(NULL);
    view_t *v = peek_view(x, slot);
    if (out == NULL || v == NULL)
        return out;
    emap *m = &v->em[tier];
    for (uint32_t j = 0; j < m->nents; j++) {
        eslot *e = em_entry(m, j);
        if (e == NULL)
            continue;
        PyObject *h = PyLong_FromLongLong((long long)e->val);
        if (h == NULL || PySet_Add(out, h) < 0) {
            Py_XDECREF(h);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(h);
    }
    return out;
}

/* Whether router hash k is a key of tier t's chunk c or any chunk before it. */
static int seen_before(IndexObject *x, int t, Py_ssize_t c, uint64_t k)
{
    for (Py_ssize_t b = 0; b < c; b++)
        if (vm_find(&x->masks[t][b], k) != NULL)
            return 1;
    return 0;
}

static PyObject *Index_unique_hashes(IndexObject *x, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t total = 0;
    for (int t = 0; t < NTIERS; t++) {
        for (Py_ssize_t c = 0; c < x->nchunks[t]; c++) {
            vmap *m = &x->masks[t][c];
            if (c == 0) {
                total += m->n;
                continue;
            }
            for (size_t j = 0; m->s != NULL && j < ((size_t)1 << m->bits); j++)
                if (m->s[j].val && !seen_before(x, t, c, m->s[j].key))
                    total++;
        }
    }
    return PyLong_FromSsize_t(total);
}

static PyObject *Index_memory_bytes(IndexObject *x, PyObject *Py_UNUSED(ignored))
{
    size_t total = (size_t)x->nviews * sizeof(view_t);
    for (Py_ssize_t s = 0; s < x->nviews; s++)
        for (int t = 0; t < NTIERS; t++)
            total += em_bytes(&x->views[s].em[t]) + vm_bytes(&x->views[s].dups[t]);
    for (int t = 0; t < NTIERS; t++)
        for (Py_ssize_t c = 0; c < x->nchunks[t]; c++)
            total += vm_bytes(&x->masks[t][c]) + sizeof(vmap);
    return PyLong_FromSize_t(total);
}

/* dump(slot, tier) -> ([(key, router_hash), ...] oldest first, {router_hash: extra copies}) */
static PyObject *Index_dump(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot;
    int tier;
    if (nargs_is(nargs, 2, "dump(slot, tier)") < 0 || arg_slot(args[0], &slot) < 0 || arg_tier(args[1], &tier) < 0)
        return NULL;
    PyObject *items = PyList_New(0), *dups = PyDict_New();
    if (items == NULL || dups == NULL)
        goto fail;
    view_t *v = peek_view(x, slot);
    if (v != NULL) {
        emap *m = &v->em[tier];
        for (uint32_t j = 0; j < m->nents; j++) {
            eslot *e = em_entry(m, j);
            if (e == NULL)
                continue;
            PyObject *kv = Py_BuildValue("(KL)", (unsigned long long)e->key, (long long)e->val);
            if (kv == NULL || PyList_Append(items, kv) < 0) {
                Py_XDECREF(kv);
                goto fail;
            }
            Py_DECREF(kv);
        }
        vmap *d = &v->dups[tier];
        for (size_t j = 0; d->s != NULL && j < ((size_t)1 << d->bits); j++) {
            if (!d->s[j].val)
                continue;
            PyObject *k = PyLong_FromLongLong((long long)d->s[j].key), *c = PyLong_FromUnsignedLongLong(d->s[j].val);
            int rc = k == NULL || c == NULL ? -1 : PyDict_SetItem(dups, k, c);
            Py_XDECREF(k);
            Py_XDECREF(c);
            if (rc < 0)
                goto fail;
        }
    }
    return Py_BuildValue("(NN)", items, dups);
fail:
    Py_XDECREF(items);
    Py_XDECREF(dups);
    return NULL;
}

/* masks(tier) -> {router_hash: bitset of slots as an int} (tests and debugging) */
static PyObject *Index_masks(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    int tier;
    if (nargs_is(nargs, 1, "masks(tier)") < 0 || arg_tier(args[0], &tier) < 0)
        return NULL;
    PyObject *out = PyDict_New();
    for (Py_ssize_t c = 0; out != NULL && c < x->nchunks[tier]; c++) {
        vmap *m = &x->masks[tier][c];
        for (size_t j = 0; m->s != NULL && j < ((size_t)1 << m->bits); j++) {
            if (!m->s[j].val)
                continue;
            PyObject *k = PyLong_FromLongLong((long long)m->s[j].key);
            PyObject *w = PyLong_FromUnsignedLongLong(m->s[j].val);
            PyObject *sh = PyLong_FromSsize_t(64 * c);
            PyObject *part = w && sh ? PyNumber_Lshift(w, sh) : NULL;
            PyObject *cur = k ? PyDict_GetItemWithError(out, k) : NULL;
            PyObject *both = part && !PyErr_Occurred() ? (cur ? PyNumber_Or(cur, part) : Py_NewRef(part)) : NULL;
            int rc = both == NULL ? -1 : PyDict_SetItem(out, k, both);
            Py_XDECREF(k);
            Py_XDECREF(w);
            Py_XDECREF(sh);
            Py_XDECREF(part);
            Py_XDECREF(both);
            if (rc < 0)
                Py_CLEAR(out);
            if (out == NULL)
                break;
        }
    }
    return out;
}

/* -- match --------------------------------------------------------------------------------- */

static inline uint64_t mask_word(IndexObject *x, int t, Py_ssize_t c, uint64_t h)
{
    return c < x->nchunks[t] ? vm_get(&x->masks[t][c], h) : 0;
}

static int tier_empty(IndexObject *x, int t)
{
    for (Py_ssize_t c = 0; c < x->nchunks[t]; c++)
        if (x->masks[t][c].n)
            return 0;
    return 1;
}

PyDoc_STRVAR(match_doc, "match(hashes, slots, weights, /)\n--\n\n"
                        "Tier-weighted cached-prefix length per slot (-1: none); see KvIndex.match.");

static PyObject *Index_match(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs_is(nargs, 3, "match(hashes, slots, weights)") < 0)
        return NULL;
    PyObject *hashes = args[0], *slots = args[1];
    double w[3];
    if (!PyList_Check(hashes) || !PyList_Check(slots) || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) < 3) {
        PyErr_SetString(PyExc_TypeError, "match(list[int], list[int], tuple[float, float, float])");
        return NULL;
    }
    for (int i = 0; i < 3; i++) {
        w[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(args[2], i));
        if (w[i] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    Py_ssize_t nv = PyList_GET_SIZE(slots), nh = PyList_GET_SIZE(hashes), nch = 0;
    PyObject *out = PyList_New(nv);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nv; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyList_GET_ITEM(slots, i));
        if (s == -1 && PyErr_Occurred())
            goto fail;
        if (s >= MAX_SLOT) {
            PyErr_Format(PyExc_ValueError, "slot %zd out of range", s);
            goto fail;
        }
        if (s >= 0 && s / 64 + 1 > nch)
            nch = s / 64 + 1;
        PyList_SET_ITEM(out, i, PyFloat_FromDouble(0.0));
        if (PyList_GET_ITEM(out, i) == NULL)
            goto fail;
    }
    if (nch == 0 || nh == 0)
        return out;
    size_t nslots = (size_t)nch * 64;
    uint64_t *alive = calloc((size_t)nch, sizeof(uint64_t));
    Py_ssize_t *pos = malloc(nslots * sizeof(Py_ssize_t));
    Py_ssize_t *depth_of = malloc(nslots * sizeof(Py_ssize_t));
    double *credit = calloc(nslots, sizeof(double));
    if (alive == NULL || pos == NULL || depth_of == NULL || credit == NULL) {
        PyErr_NoMemory();
        goto fail_free;
    }
    for (size_t s = 0; s < nslots; s++)
        pos[s] = depth_of[s] = -1;
    for (Py_ssize_t i = 0; i < nv; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyList_GET_ITEM(slots, i));
        if (s >= 0) {
            pos[s] = i; /* a slot listed twice scores at its last position, as in Python */
            alive[s >> 6] |= 1ULL << (s & 63);
        }
    }
    int lower = !tier_empty(x, 1) || !tier_empty(x, 2);
    Py_ssize_t depth = 0;
    for (Py_ssize_t k = 0; k < nh; k++) {
        long long hv = PyLong_AsLongLong(PyList_GET_ITEM(hashes, k));
        if (hv == -1 && PyErr_Occurred())
            goto fail_free;
        uint64_t h = (uint64_t)hv, any = 0;
        for (Py_ssize_t c = 0; c < nch; c++) {
            uint64_t a = alive[c], m;
            if (!a)
                continue;
            uint64_t gm = mask_word(x, 0, c, h);
            if (lower) {
                uint64_t cm = mask_word(x, 1, c, h) & ~gm;
                uint64_t dm = mask_word(x, 2, c, h) & ~gm & ~cm;
                m = (gm | cm | dm) & a;
                for (uint64_t low = (cm | dm) & m; low; low &= low - 1) {
                    int b = __builtin_ctzll(low);
                    credit[c * 64 + b] += w[0] - (((cm >> b) & 1) ? w[1] : w[2]);
                }
            } else {
                m = gm & a;
            }
            if (m != a && depth) /* views dropped at depth 0 keep 0: no per-view work */
                for (uint64_t dropped = a & ~m; dropped; dropped &= dropped - 1)
                    depth_of[c * 64 + __builtin_ctzll(dropped)] = depth;
            alive[c] = m;
            any |= m;
        }
        if (!any)
            break;
        depth++;
    }
    for (Py_ssize_t c = 0; c < nch; c++)
        for (uint64_t a = alive[c]; a; a &= a - 1)
            depth_of[c * 64 + __builtin_ctzll(a)] = depth;
    for (size_t s = 0; s < nslots; s++) {
        if (depth_of[s] < 0 || pos[s] < 0)
            continue;
        PyObject *f = PyFloat_FromDouble((double)depth_of[s] * w[0] - credit[s]);
        if (f == NULL)
            goto fail_free;
        PyObject *old = PyList_GET_ITEM(out, pos[s]);
        PyList_SET_ITEM(out, pos[s], f);
        Py_DECREF(old);
    }
    free(alive);
    free(pos);
    free(depth_of);
    free(credit);
    return out;
fail_free:
    free(alive);
    free(pos);
    free(depth_of);
    free(credit);
fail:
    Py_DECREF(out);
    return NULL;
}

/* -- batch payloads ------------------------------------------------------------------------ */

enum { EV_STORED = 1, EV_REMOVED, EV_CLEARED };

typedef struct {
    int kind;
    int tier;
    int indexed;     /* kv_cache_spec_kind is None, full_attention or mla* */
    int parent_nil;  /* EV_STORED: a chain root */
    int has_group;
    int has_lora;
    uint64_t parent; /* key of the parent engine hash */
    const unsigned char *hashes, *tokens; /* first item of each array */
    const unsigned char *end;             /* end of the payload */
    uint64_t nhashes, ntokens;
    int64_t block_size, group, lora;
} evdesc;

/* A str field as a storage tier, as infera_core.kv.index.medium_tier does; -1 to give up. */
static int tier_of_medium(const mpitem *it)
{
    static const char *names[] = {"GPU", "HBM", "CPU", "CPU_PINNED", "DISK", "EXTERNAL"};
    static const int tiers[] = {0, 0, 1, 1, 2, 2};
    char up[16];
    if (it->type == MP_NIL || it->len == 0) /* None and "" are the GPU */
        return 0;
    for (size_t i = 0; i < it->len; i++)
        if (it->ptr[i] >= 0x80)
            return -1; /* str.upper() of non-ASCII text is Python's business */
    if (it->len >= sizeof up)
        return 2;
    for (size_t i = 0; i < it->len; i++) {
        unsigned char ch = it->ptr[i];
        up[i] = (char)(ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
    }
    for (int i = 0; i < 6; i++)
        if (strlen(names[i]) == it->len && memcmp(up, names[i], it->len) == 0)
            return tiers[i];
    return 2;
}

static int indexed_kind(const mpitem *it)
{
    if (it->type == MP_NIL || mp_str_is(it, "full_attention"))
        return 1;
    return it->len >= 3 && memcmp(it->ptr, "mla", 3) == 0;
}

/* An int field that fits int64 (or nil when allow_nil); 0 ok, 1 nil, -1 unsupported. */
static int int_field(const unsigned char *at, const unsigned char *end, int allow_nil, int64_t *out)
{
    reader r = {at, end};
    mpitem it;
    if (mp_read(&r, &it) < 0)
        return -1;
    if (it.type == MP_NIL)
        return allow_nil ? 1 : -1;
    if (it.type != MP_INT || (!it.neg && it.u > (uint64_t)INT64_MAX))
        return -1;
    *out = (int64_t)it.u;
    return 0;
}

enum { F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BS, F_LORA, F_MEDIUM, F_KIND, F_GROUP, NFIELDS, F_OTHER = NFIELDS };

/* Which field a map key names (switching on its length first: the keys of every event). */
static int field_of(const mpitem *key)
{
#define IS(name) (memcmp(key->ptr, name, sizeof(name) - 1) == 0)
    switch (key->len) {
    case 4: return IS("type") ? F_TYPE : F_OTHER;
    case 12: return IS("block_hashes") ? F_HASHES : F_OTHER;
    case 17: return IS("parent_block_hash") ? F_PARENT : F_OTHER;
    case 9: return IS("token_ids") ? F_TOKENS : IS("group_idx") ? F_GROUP : F_OTHER;
    case 10: return IS("block_size") ? F_BS : F_OTHER;
    case 7: return IS("lora_id") ? F_LORA : F_OTHER;
    case 6: return IS("medium") ? F_MEDIUM : F_OTHER;
    case 18: return IS("kv_cache_spec_kind") ? F_KIND : F_OTHER;
    default: return F_OTHER;
    }
#undef IS
}

/* An array of block hashes (ints, bins) at r, stepped over; -1 when it is anything else. */
static int scan_hashes(reader *r, const unsigned char **first, uint64_t *n)
{
    mpitem it;
    if (mp_read(r, &it) < 0 || it.type != MP_ARRAY)
        return -1;
    *first = r->p;
    *n = it.u;
    for (uint64_t i = 0; i < it.u; i++) {
        uint64_t k;
        if (read_key(r, &k) < 0)
            return -1;
    }
    return 0;
}

/* An array of int token ids at r, stepped over; -1 when it is anything else (EAGLE bigram
 * pairs…: the Python decoder's business). */
static int scan_tokens(reader *r, const unsigned char **first, uint64_t *n)
{
    Py_ssize_t len;
    if (read_array_len(r, &len) < 0)
        goto bad;
    *first = r->p;
    *n = (uint64_t)len;
    for (Py_ssize_t i = 0; i < len; i++) {
        uint64_t lane;
        if (read_lane(r, &lane) < 0)
            goto bad;
    }
    return 0;
bad:
    PyErr_Clear();
    return -1;
}

/* One map-layout event; 0 ok, -1 unsupported. */
static int parse_event(reader *r, evdesc *ev)
{
    const unsigned char *at[NFIELDS] = {0};
    mpitem it;
    if (mp_read(r, &it) < 0 || it.type != MP_MAP)
        return -1;
    memset(ev, 0, sizeof *ev);
    for (uint64_t i = 0; i < it.u; i++) {
        mpitem key;
        if (mp_read(r, &key) < 0 || key.type != MP_STR)
            return -1;
        int f = field_of(&key);
        if (f != F_OTHER) {
            if (at[f] != NULL)
                return -1; /* a repeated field */
            at[f] = r->p;
        }
        int rc = f == F_HASHES   ? scan_hashes(r, &ev->hashes, &ev->nhashes)
                 : f == F_TOKENS ? scan_tokens(r, &ev->tokens, &ev->ntokens)
                                 : mp_skip(r, 0);
        if (rc < 0)
            return -1;
    }
    const unsigned char *end = r->p;
    ev->end = end;
    if (at[F_TYPE] == NULL)
        return -1;
    reader fr = {at[F_TYPE], end};
    mpitem v;
    mp_read(&fr, &v);
    if (mp_str_is(&v, "AllBlocksCleared")) {
        ev->kind = EV_CLEARED;
        return 0;
    }
    if (mp_str_is(&v, "BlockStored"))
        ev->kind = EV_STORED;
    else if (mp_str_is(&v, "BlockRemoved"))
        ev->kind = EV_REMOVED;
    else
        return -1;
    if (at[F_HASHES] == NULL)
        return -1;
    if (at[F_MEDIUM] != NULL) {
        fr.p = at[F_MEDIUM];
        mp_read(&fr, &v);
        if (v.type != MP_NIL && v.type != MP_STR)
            return -1;
        if ((ev->tier = tier_of_medium(&v)) < 0)
            return -1;
    }
    if (at[F_GROUP] != NULL) {
        int rc = int_field(at[F_GROUP], end, 1, &ev->group);
        if (rc < 0)
            return -1;
        ev->has_group = rc == 0;
    }
    if (ev->kind == EV_REMOVED)
        return 0;
    if (at[F_PARENT] == NULL || at[F_TOKENS] == NULL || at[F_BS] == NULL)
        return -1;
    fr.p = at[F_PARENT];
    if (mp_read(&fr, &v) < 0)
        return -1;
    if (v.type == MP_NIL) {
        ev->parent_nil = 1;
    } else {
        fr.p = at[F_PARENT];
        if (read_key(&fr, &ev->parent) < 0)
            return -1;
    }
    if (int_field(at[F_BS], end, 0, &ev->block_size) < 0)
        return -1;
    if (at[F_LORA] != NULL) {
        int rc = int_field(at[F_LORA], end, 1, &ev->lora);
        if (rc < 0)
            return -1;
        ev->has_lora = rc == 0;
    }
    ev->indexed = 1;
    if (at[F_KIND] != NULL) {
        fr.p = at[F_KIND];
        mp_read(&fr, &v);
        if (v.type != MP_NIL && v.type != MP_STR)
            return -1;
        ev->indexed = indexed_kind(&v);
    }
    return 0;
}

typedef struct {
    evdesc *evs;
    uint64_t n;
    int has_rank;
    int64_t rank;
} batch_t;

/* [ts, events, dp_rank?] -> batch (evs malloc'ed unless n is 0); 0 ok, -1 unsupported. */
static int parse_batch(const unsigned char *buf, size_t len, batch_t *b)
{
    reader r = {buf, buf + len};
    mpitem it, ts, evs;
    memset(b, 0, sizeof *b);
    if (mp_read(&r, &it) < 0 || it.type != MP_ARRAY || it.u < 2 || it.u > 3)
        return -1;
    uint64_t top = it.u;
    if (mp_read(&r, &ts) < 0 || (ts.type != MP_FLOAT && ts.type != MP_INT))
        return -1;
    if (mp_read(&r, &evs) < 0 || evs.type != MP_ARRAY)
        return -1;
    b->n = evs.u;
    if (b->n) {
        b->evs = malloc((size_t)b->n * sizeof(evdesc));
        if (b->evs == NULL)
            return -1;
    }
    for (uint64_t i = 0; i < b->n; i++)
        if (parse_event(&r, &b->evs[i]) < 0)
            goto bad;
    if (top == 3) {
        int rc = int_field(r.p, r.end, 1, &b->rank);
        if (rc < 0 || mp_skip(&r, 0) < 0)
            goto bad;
        b->has_rank = rc == 0;
    }
    if (r.p != r.end)
        goto bad; /* trailing bytes */
    return 0;
bad:
    free(b->evs);
    b->evs = NULL;
    return -1;
}

const char batch_dp_rank_doc[] = "batch_dp_rank(payload, /)\n--\n\n"
                                 "The dp_rank of a [ts, events, dp_rank] msgpack batch (None when absent);\n"
                                 "ValueError when the payload is not such a batch.";

PyObject *batch_dp_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer buf;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "batch_dp_rank(payload)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    reader r = {(const unsigned char *)buf.buf, (const unsigned char *)buf.buf + buf.len};
    mpitem it;
    int64_t rank = 0;
    int rc = -1;
    if (mp_read(&r, &it) == 0 && it.type == MP_ARRAY && it.u >= 2 && it.u <= 3 && mp_skip(&r, 0) == 0 &&
        mp_skip(&r, 0) == 0)
        rc = it.u == 2 ? 1 : int_field(r.p, r.end, 1, &rank);
    PyBuffer_Release(&buf);
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "not a [ts, events, dp_rank] msgpack batch");
        return NULL;
    }
    if (rc == 1)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(rank);
}

typedef struct {
    Py_ssize_t applied, unknown_parent, unknown_removed, bad_block_size;
    int64_t bad_block_size_value;
} outcome;

/* Whether a removal's group is one the view skips (non-full-attention); -1 on error. */
static int group_skipped(PyObject *skipped, const evdesc *ev)
{
    if (!ev->has_group || PySet_GET_SIZE(skipped) == 0)
        return 0;
    PyObject *g = PyLong_FromLongLong(ev->group);
    if (g == NULL)
        return -1;
    int rc = PySet_Contains(skipped, g);
    Py_DECREF(g);
    return rc;
}

static int apply_stored(IndexObject *x, view_t *v, Py_ssize_t slot, int64_t view_bs, PyObject *skipped,
                        const evdesc *ev, outcome *o)
{
    if (!ev->indexed) {
        if (ev->has_group) {
            PyObject *g = PyLong_FromLongLong(ev->group);
            int rc = g == NULL ? -1 : PySet_Add(skipped, g);
            Py_XDECREF(g);
            return rc;
        }
        return 0;
    }
    if (ev->block_size != view_bs) { /* prompts are hashed at the record's block size */
        if (!o->bad_block_size)
            o->bad_block_size_value = ev->block_size;
        o->bad_block_size++;
        return 0;
    }
    uint64_t ph;
    if (ev->parent_nil)
        ph = ev->has_lora ? (uint64_t)lora_root(ev->lora) : ROUTER_HASH_SEED;
    else if (!lookup(v, ev->parent, &ph)) {
        o->unknown_parent++;
        return 0;
    }
    uint64_t n = ev->ntokens / (uint64_t)view_bs;
    if (ev->nhashes < n)
        n = ev->nhashes;
    reader hr = {ev->hashes, ev->end}, tr = {ev->tokens, ev->end};
    int64_t h = (int64_t)ph;
    vmap *mt = chunk_at(x, ev->tier, slot >> 6);
    if (mt == NULL)
        return -1;
    /* hash a run of blocks first and prefetch their slots, so the cache misses overlap */
    enum { RUN = 32 };
    uint64_t eks[RUN], rhs[RUN];
    for (uint64_t done = 0; done < n; done += RUN) {
        uint64_t run = n - done < RUN ? n - done : RUN;
        for (uint64_t i = 0; i < run; i++) {
            int err = 0;
            h = hash_block(&tr, view_bs, h, &err);
            read_key(&hr, &eks[i]); /* both validated by parse_event */
            rhs[i] = (uint64_t)h;
            em_prefetch(&v->em[ev->tier], eks[i]);
            vm_prefetch(mt, rhs[i]);
        }
        for (uint64_t i = 0; i < run; i++)
            if (store_one(x, v, slot, ev->tier, eks[i], rhs[i]) < 0)
                return -1;
    }
    return 0;
}

/* Prefetch the table slots a batch's removals will touch: the engine-hash slots first, then,
 * once those arrive, the bitset slots of their router hashes. */
static void prefetch_removals(IndexObject *x, view_t *v, Py_ssize_t slot, const batch_t *b)
{
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t i = 0; i < b->n; i++) {
            const evdesc *ev = &b->evs[i];
            if (ev->kind != EV_REMOVED)
                continue;
            emap *m = &v->em[ev->tier];
            vmap *mt = (slot >> 6) < x->nchunks[ev->tier] ? &x->masks[ev->tier][slot >> 6] : NULL;
            reader hr = {ev->hashes, ev->end};
            for (uint64_t j = 0; j < ev->nhashes; j++) {
                uint64_t ek = 0, rh;
                read_key(&hr, &ek);
                if (pass == 0)
                    em_prefetch(m, ek);
                else if (mt != NULL && em_get(m, ek, &rh))
                    vm_prefetch(mt, rh);
            }
        }
    }
}

PyDoc_STRVAR(apply_payload_doc,
             "apply_payload(slot, payload, block_size, skipped_groups, /)\n--\n\n"
             "Parse and apply one vLLM-style msgpack batch (map layout) to a slot. Returns\n"
             "(events, applied, unknown_parent, unknown_removed, bad_block_size, bad_block_size_value),\n"
             "or None, having changed nothing, when the batch needs the Python decoder.");

static PyObject *Index_apply_payload(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot;
    if (nargs_is(nargs, 4, "apply_payload(slot, payload, block_size, skipped_groups)") < 0 ||
        arg_slot(args[0], &slot) < 0)
        return NULL;
    long long view_bs = PyLong_AsLongLong(args[2]);
    if (view_bs == -1 && PyErr_Occurred())
        return NULL;
    PyObject *skipped = args[3];
    if (view_bs < 1 || !PySet_Check(skipped)) {
        PyErr_SetString(PyExc_ValueError, "apply_payload needs block_size >= 1 and a set of skipped groups");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(args[1], &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    batch_t b;
    PyObject *result = NULL;
    if (parse_batch((const unsigned char *)buf.buf, (size_t)buf.len, &b) < 0) {
        PyBuffer_Release(&buf);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    outcome o = {0};
    view_t *v = view_at(x, slot);
    if (v == NULL)
        goto done;
    prefetch_removals(x, v, slot, &b);
    for (uint64_t i = 0; i < b.n; i++) {
        const evdesc *ev = &b.evs[i];
        if (ev->kind == EV_REMOVED) {
            int skip = group_skipped(skipped, ev);
            if (skip < 0)
                goto done;
            if (skip)
                continue;
            reader hr = {ev->hashes, ev->end};
            Py_ssize_t removed = 0;
            for (uint64_t j = 0; j < ev->nhashes; j++) {
                uint64_t ek = 0;
                read_key(&hr, &ek);
                remove_one(x, v, slot, ev->tier, ek, &removed, &o.unknown_removed);
            }
        } else if (ev->kind == EV_STORED) {
            if (apply_stored(x, v, slot, view_bs, skipped, ev, &o) < 0)
                goto done;
        } else {
            clear_view(x, v, slot);
        }
        o.applied++;
    }
    result = Py_BuildValue("(KnnnnL)", (unsigned long long)b.n, o.applied, o.unknown_parent, o.unknown_removed,
                           o.bad_block_size, (long long)o.bad_block_size_value);
done:
    free(b.evs);
    PyBuffer_Release(&buf);
    return result;
}

/* -- the type ---------------------------------------------------------------------------- */

static void Index_dealloc(IndexObject *x)
{
    for (Py_ssize_t s = 0; s < x->nviews; s++) {
        for (int t = 0; t < NTIERS; t++) {
            em_free(&x->views[s].em[t]);
            vm_free(&x->views[s].dups[t]);
        }
    }
    free(x->views);
    for (int t = 0; t < NTIERS; t++) {
        for (Py_ssize_t c = 0; c < x->nchunks[t]; c++)
            vm_free(&x->masks[t][c]);
        free(x->masks[t]);
    }
    Py_TYPE(x)->tp_free((PyObject *)x);
}

#define FASTCALL(name, doc) {#name, (PyCFunction)(void (*)(void))Index_##name, METH_FASTCALL, doc}

static PyMethodDef Index_methods[] = {
    FASTCALL(lookup, "lookup(slot, block_hash) -> router hash of an engine block on any tier, or None"),
    FASTCALL(store, "store(slot, tier, block_hashes, hashes) -> blocks newly held"),
    FASTCALL(remove, "remove(slot, tier, block_hashes) -> (router hashes no longer held, unknown engine hashes)"),
    FASTCALL(clear, "clear(slot): forget everything a slot holds"),
    FASTCALL(evict_oldest, "evict_oldest(slot, count) -> blocks removed, oldest first, disk then CPU then GPU"),
    FASTCALL(nblocks, "nblocks(slot) -> blocks held per tier"),
    FASTCALL(held, "held(slot, tier) -> set of router hashes"),
    FASTCALL(dump, "dump(slot, tier) -> ([(key, router hash)] oldest first, {router hash: extra copies})"),
    FASTCALL(masks, "masks(tier) -> {router hash: bitset of slots}"),
    FASTCALL(match, match_doc),
    FASTCALL(apply_payload, apply_payload_doc),
    {"unique_hashes", (PyCFunction)Index_unique_hashes, METH_NOARGS, "distinct router hashes, summed over tiers"},
    {"memory_bytes", (PyCFunction)Index_memory_bytes, METH_NOARGS, "bytes allocated by the tables"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "infera_kv_native._chain.Index",
    .tp_basicsize = sizeof(IndexObject),
    .tp_dealloc = (destructor)Index_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The KV index's block tables in C (see infera_core.kv.store).",
    .tp_methods = Index_methods,
    .tp_new = PyType_GenericNew,
};

int index_add_type(PyObject *module)
{
    if (PyType_Ready(&IndexType) < 0)
        return -1;
    Py_INCREF(&IndexType);
    if (PyModule_AddObject(module, "Index", (PyObject *)&IndexType) < 0) {
        Py_DECREF(&IndexType);
        return -1;
    }
    return 0;
}
