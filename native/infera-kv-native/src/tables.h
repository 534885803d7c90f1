/*
 * Hash tables keyed by 64-bit ints, keys stored inline (no Python objects), for the native
 * KV index. Fibonacci hashing, linear probing, backward-shift deletion (no tombstones).
 *
 * vmap:  u64 -> non-zero u64 (0 marks an empty slot): bitsets of worker slots, duplicate counts.
 * emap:  u64 -> u64 in insertion order: key and value inline in the slot, plus an append-only
 *        array of keys; the j-th key is live iff its slot says j, so deletions need no flag
 *        and iteration visits the oldest entries first.
 */
#ifndef INFERA_TABLES_H
#define INFERA_TABLES_H
#include "kvcommon.h"
#include <stdlib.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define EMPTY 0xFFFFFFFFu

static inline uint32_t home(uint64_t k, uint32_t bits) { return (uint32_t)((k * GOLDEN) >> (64 - bits)); }

/* Can the item at j, whose home is h, move back into the hole at i (h not cyclically in (i, j])? */
static inline int movable(uint32_t i, uint32_t j, uint32_t h) { return j > i ? (h <= i || h > j) : (h <= i && h > j); }

/* Memory for a table; big ones are 2 MiB aligned and asked for huge pages (fewer TLB
 * misses on random probes). Released with free(). */
static void *table_alloc(size_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge)
        return malloc(bytes);
    void *p = NULL;
    if (posix_memalign(&p, huge, bytes) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

/* -- vmap ---------------------------------------------------------------------------- */

typedef struct {
    uint64_t key, val;
} kv64;

typedef struct {
    kv64 *s;
    uint32_t bits; /* capacity 1 << bits once s is allocated */
    uint32_t n;
    uint64_t salt; /* added to keys before hashing: tables probed together for one key
                    * (the chunk tables) then look at different offsets, not all at the
                    * same one, which would map every probe to the same cache set */
} vmap;

static inline uint32_t vm_home(const vmap *m, uint64_t k, uint32_t bits) { return home(k + m->salt, bits); }

static inline kv64 *vm_find(const vmap *m, uint64_t k)
{
    if (!m->n)
        return NULL;
    uint32_t mask = (1u << m->bits) - 1, i = vm_home(m, k, m->bits);
    for (;;) {
        kv64 *e = &m->s[i];
        if (!e->val)
            return NULL;
        if (e->key == k)
            return e;
        i = (i + 1) & mask;
    }
}

static inline uint64_t vm_get(const vmap *m, uint64_t k)
{
    kv64 *e = vm_find(m, k);
    return e ? e->val : 0;
}

static inline void vm_prefetch(const vmap *m, uint64_t k)
{
    if (m->s != NULL)
        __builtin_prefetch(&m->s[vm_home(m, k, m->bits)]);
}

static int vm_resize(vmap *m, uint32_t bits)
{
    kv64 *s = table_alloc(((size_t)1 << bits) * sizeof(kv64));
    if (s == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(s, 0, ((size_t)1 << bits) * sizeof(kv64));
    uint32_t mask = (1u << bits) - 1;
    if (m->s != NULL) {
        for (size_t j = 0; j < ((size_t)1 << m->bits); j++) {
            if (!m->s[j].val)
                continue;
            uint32_t i = vm_home(m, m->s[j].key, bits);
            while (s[i].val)
                i = (i + 1) & mask;
            s[i] = m->s[j];
        }
        free(m->s);
    }
    m->s = s;
    m->bits = bits;
    return 0;
}

/* The slot of k, added with val 0 (*fresh = 1) when absent: the caller must then make val
 * non-zero. NULL on MemoryError. */
static inline kv64 *vm_slot(vmap *m, uint64_t k, int *fresh)
{
    if (m->s == NULL || (size_t)(m->n + 1) * 2 > ((size_t)1 << m->bits)) {
        if (vm_resize(m, m->s == NULL ? 4 : m->bits + 1) < 0)
            return NULL;
    }
    uint32_t mask = (1u << m->bits) - 1, i = vm_home(m, k, m->bits);
    for (;;) {
        kv64 *e = &m->s[i];
        if (!e->val) {
            e->key = k;
            m->n++;
            *fresh = 1;
            return e;
        }
        if (e->key == k) {
            *fresh = 0;
            return e;
        }
        i = (i + 1) & mask;
    }
}

static inline void vm_free(vmap *m)
{
    free(m->s);
    m->s = NULL;
    m->bits = m->n = 0;
}

/* Delete the item in slot e (its val may already be 0); the table may shrink, so slot
 * pointers into it are stale afterwards. */
static inline void vm_delete(vmap *m, kv64 *e)
{
    uint32_t mask = (1u << m->bits) - 1, i = (uint32_t)(e - m->s), j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->s[j].val)
            break;
        if (movable(i, j, vm_home(m, m->s[j].key, m->bits))) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].val = 0;
    if (--m->n == 0) {
        vm_free(m);
    } else if (m->bits > 6 && ((size_t)m->n << 3) < ((size_t)1 << m->bits)) {
        if (vm_resize(m, m->bits - 2) < 0) /* shrinking is optional */
            PyErr_Clear();
    }
}

static inline size_t vm_bytes(const vmap *m) { return m->s ? ((size_t)1 << m->bits) * sizeof(kv64) : 0; }

/* -- emap ---------------------------------------------------------------------------- */

typedef struct {
    uint64_t key, val;
    uint32_t ent; /* index into keys; EMPTY marks a free slot */
    uint32_t pad;
} eslot;

typedef struct {
    eslot *s;       /* 1 << bits slots, key and value inline: one cache line per lookup */
    uint64_t *keys; /* insertion order, dead ones included */
    uint32_t bits, nents, cap, live;
} emap;

/* The slot holding k, or the free slot where it would go (s must exist). */
static inline eslot *em_probe(const emap *m, uint64_t k)
{
    uint32_t mask = (1u << m->bits) - 1, i = home(k, m->bits);
    for (;;) {
        eslot *e = &m->s[i];
        if (e->ent == EMPTY || e->key == k)
            return e;
        i = (i + 1) & mask;
    }
}

static inline void em_prefetch(const emap *m, uint64_t k)
{
    if (m->s != NULL)
        __builtin_prefetch(&m->s[home(k, m->bits)]);
}

/* The slot of the j-th key in insertion order when that entry is live, else NULL. */
static inline eslot *em_entry(const emap *m, uint32_t j)
{
    eslot *e = em_probe(m, m->keys[j]);
    return e->ent == j ? e : NULL;
}

static inline int em_get(const emap *m, uint64_t k, uint64_t *v)
{
    if (!m->live)
        return 0;
    eslot *e = em_probe(m, k);
    if (e->ent == EMPTY)
        return 0;
    *v = e->val;
    return 1;
}

/* Move the live entries, in order, into fresh arrays with room for cap. */
static int em_rebuild(emap *m, uint32_t cap)
{
    uint32_t bits = 4;
    while (((size_t)1 << bits) < (size_t)cap * 2)
        bits++;
    uint64_t *keys = table_alloc((size_t)cap * sizeof(uint64_t));
    eslot *s = table_alloc(((size_t)1 << bits) * sizeof(eslot));
    if (keys == NULL || s == NULL) {
        free(keys);
        free(s);
        PyErr_NoMemory();
        return -1;
    }
    memset(s, 0xff, ((size_t)1 << bits) * sizeof(eslot));
    uint32_t n = 0, mask = (1u << bits) - 1;
    for (uint32_t j = 0; j < m->nents; j++) {
        eslot *old = em_entry(m, j);
        if (old == NULL)
            continue;
        uint32_t i = home(old->key, bits);
        while (s[i].ent != EMPTY)
            i = (i + 1) & mask;
        s[i] = *old;
        s[i].ent = n;
        keys[n++] = old->key;
    }
    free(m->keys);
    free(m->s);
    m->keys = keys;
    m->s = s;
    m->bits = bits;
    m->cap = cap;
    m->nents = m->live = n;
    return 0;
}

/* Add k -> v unless k is present: 1 added, 0 present, -1 MemoryError. */
static inline int em_add(emap *m, uint64_t k, uint64_t v)
{
    eslot *e;
    if (m->s != NULL) {
        e = em_probe(m, k);
        if (e->ent != EMPTY)
            return 0;
        if (m->nents < m->cap)
            goto put;
    }
    uint32_t cap = 8; /* room for twice the live entries: grows, or compacts (and shrinks) */
    while (cap < 2 * (m->live + 1))
        cap *= 2;
    if (em_rebuild(m, cap) < 0)
        return -1;
    e = em_probe(m, k);
put:
    e->key = k;
    e->val = v;
    e->ent = m->nents;
    m->keys[m->nents++] = k;
    m->live++;
    return 1;
}

/* Remove k, setting *v to its value: 1 removed, 0 absent. */
static inline int em_pop(emap *m, uint64_t k, uint64_t *v)
{
    if (!m->live)
        return 0;
    eslot *e = em_probe(m, k);
    if (e->ent == EMPTY)
        return 0;
    *v = e->val;
    uint32_t mask = (1u << m->bits) - 1, i = (uint32_t)(e - m->s), j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->s[j].ent == EMPTY)
            break;
        if (movable(i, j, home(m->s[j].key, m->bits))) {
            m->s[i] = m->s[j];
            i = j;
        }
    }
    m->s[i].ent = EMPTY;
    if (!--m->live)
        m->nents = 0; /* every slot is free again: start the order over */
    return 1;
}

static inline void em_free(emap *m)
{
    free(m->s);
    free(m->keys);
    memset(m, 0, sizeof(*m));
}

static inline size_t em_bytes(const emap *m)
{
    return m->s ? ((size_t)1 << m->bits) * sizeof(eslot) + (size_t)m->cap * sizeof(uint64_t) : 0;
}

#endif
