/*
 * The native KV index's tables and their core operations, shared by index.c (the Index type,
 * per-event methods, match) and batch.c (the msgpack batch parser).
 *
 * Per worker slot and storage tier (0 GPU, 1 CPU, 2 disk): an insertion-ordered map engine
 * block hash -> router hash (emap), duplicate counts for router hashes held under several
 * engine hashes, and a block count. Per tier: router hash -> bitset of the slots holding
 * it, one u64 table per 64 slots. The pure-Python store in infera_core.kv.store is the
 * specification; tests check both give identical results.
 *
 * Engine hashes are keyed as 64-bit ints: ints in [-2^63, 2^64) by their two's-complement
 * bits, bytes digests by a 64-bit fold (fold_bytes), other ints by a fold of hash().
 * Router hashes are CPython hash() values (signed 64-bit), stored as their bits.
 */
#ifndef INFERA_STORE_H
#define INFERA_STORE_H
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

static inline uint64_t fold_bytes(const unsigned char *p, size_t n)
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
    vmap holders; /* GPU tier: router hash -> XOR of slot_key() of the slots holding it */
} IndexObject;

/* A random-looking non-zero 64-bit key per slot (splitmix64): the XOR of a set of slots' keys
 * identifies the set (up to 2^-64, as the 64-bit router hashes themselves). */
static inline uint64_t slot_key(Py_ssize_t slot)
{
    uint64_t z = (uint64_t)slot + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z ? z : 1;
}

/* Slot ``slot`` starts or stops holding ``rh`` on the GPU tier: update its holders' XOR. */
static inline int toggle_holder(IndexObject *x, Py_ssize_t slot, uint64_t rh)
{
    int fresh;
    kv64 *e = vm_slot(&x->holders, rh, &fresh);
    if (e == NULL)
        return -1;
    e->val ^= slot_key(slot);
    if (!e->val) /* nobody (w.h.p.): the slot stays free */
        vm_delete(&x->holders, e);
    return 0;
}

static inline view_t *view_at(IndexObject *x, Py_ssize_t slot)
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

static inline vmap *chunk_at(IndexObject *x, int tier, Py_ssize_t c)
{
    if (c < x->nchunks[tier])
        return &x->masks[tier][c];
    vmap *m = realloc(x->masks[tier], (size_t)(c + 1) * sizeof(vmap));
    if (m == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memset(m + x->nchunks[tier], 0, (size_t)(c + 1 - x->nchunks[tier]) * sizeof(vmap));
    for (Py_ssize_t i = x->nchunks[tier]; i <= c; i++)
        m[i].salt = (uint64_t)i * 0xD6E8FEB86659FD93ULL;
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
    if (tier == 0 && toggle_holder(x, slot, rh) < 0)
        return -1;
    return 1;
}

static inline void unmask(IndexObject *x, int tier, Py_ssize_t slot, uint64_t rh, int *found)
{
    Py_ssize_t c = slot >> 6;
    kv64 *e = c < x->nchunks[tier] ? vm_find(&x->masks[tier][c], rh) : NULL;
    *found = e != NULL;
    if (e != NULL) {
        uint64_t bit = 1ULL << (slot & 63);
        int held = (e->val & bit) != 0;
        e->val &= ~bit;
        if (!e->val)
            vm_delete(&x->masks[tier][c], e);
        if (held && tier == 0 && toggle_holder(x, slot, rh) < 0)
            PyErr_Clear(); /* cannot fail: the entry exists, removing never allocates */
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

static inline void clear_view(IndexObject *x, view_t *v, Py_ssize_t slot)
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

static inline int arg_slot(PyObject *o, Py_ssize_t *slot)
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

static inline int arg_tier(PyObject *o, int *tier)
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

static inline int nargs_is(Py_ssize_t nargs, Py_ssize_t want, const char *sig)
{
    if (nargs == want)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", sig, want, nargs);
    return -1;
}

/* Read-only access: NULL (no error) when the slot never held anything. */
static inline view_t *peek_view(IndexObject *x, Py_ssize_t slot) { return slot < x->nviews ? &x->views[slot] : NULL; }

PyObject *Index_apply_payload(IndexObject *x, PyObject *const *args, Py_ssize_t nargs);
extern const char apply_payload_doc[];

#endif
