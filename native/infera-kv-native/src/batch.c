/*
 * apply_payload(): parse a vLLM-style msgpack batch (map or array layout) and apply it
 * without creating Python objects per event. The whole batch is validated first; anything
 * it does not handle (unknown event tags, non-int token ids, odd types, invalid UTF-8…)
 * returns None, having changed nothing, and the caller decodes it in Python.
 */
#include "store.h"

/* hash((ROUTER_HASH_SEED, 0x10AA, lora_id)): infera_core.kv.hashing.root_hash */
static int64_t lora_root(int64_t lora)
{
    uint64_t acc = XXPRIME_5;
    acc = mix(acc, ROUTER_HASH_SEED);
    acc = mix(acc, LORA_TAG);
    acc = mix(acc, lane_signed(lora));
    return (int64_t)finish(acc, 3);
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

/* A str field as a storage tier, as infera_core.kv.tiers.medium_tier does; -1 to give up. */
static int tier_of_medium(const mpitem *it)
{
    /* infera_core.kv.tiers._MEDIUM_TIER: vLLM, SGLang (HiCache), ATOM and LMCache names */
    static const char *names[] = {"GPU",  "HBM",     "CPU",      "CPU_PINNED", "CPU_TIER1", "DISK",
                                  "STORAGE", "EXTERNAL", "CPU_TIER2", "REMOTE"};
    static const int tiers[] = {0, 0, 1, 1, 1, 2, 2, 2, 2, 2};
    enum { NAMES = sizeof tiers / sizeof tiers[0] };
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
    for (int i = 0; i < NAMES; i++)
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

enum { F_TYPE, F_HASHES, F_PARENT, F_TOKENS, F_BS, F_LORA, F_MEDIUM, F_KIND, F_GROUP, NFIELDS, F_OTHER = NFIELDS,
       F_KEYED_STR, F_KEYED_LIST, F_KEYED_MAP };

/* A field that changes what a block hash means, at r, stepped over: -1 when it says something
 * (infera_core.kv.index._store_keyed's business), 0 when the Python decoder ignores it too —
 * F_KEYED_STR (lora_name, cache_salt) says something as a str, F_KEYED_MAP (SGLang's metadata)
 * as a map, F_KEYED_LIST (extra_keys) as an array with an item that is not nil. */
static int plain_keys(reader *r, int kind)
{
    const unsigned char *at = r->p;
    mpitem it;
    if (mp_read(r, &it) < 0)
        return -1;
    if ((kind == F_KEYED_STR && it.type == MP_STR) || (kind == F_KEYED_MAP && it.type == MP_MAP))
        return -1;
    if (kind == F_KEYED_LIST && it.type == MP_ARRAY) {
        for (uint64_t i = 0; i < it.u; i++) {
            mpitem x;
            if (mp_read(r, &x) < 0 || x.type != MP_NIL)
                return -1;
        }
        return 0;
    }
    r->p = at;
    return mp_skip(r, 0);
}

/* Which field a map key names (switching on its length first: the keys of every event). */
static int field_of(const mpitem *key)
{
#define IS(name) (memcmp(key->ptr, name, sizeof(name) - 1) == 0)
    switch (key->len) {
    case 4: return IS("type") ? F_TYPE : F_OTHER;
    case 12: return IS("block_hashes") ? F_HASHES : F_OTHER;
    case 17: return IS("parent_block_hash") ? F_PARENT : F_OTHER;
    case 9: return IS("token_ids") ? F_TOKENS : IS("group_idx") ? F_GROUP : IS("lora_name") ? F_KEYED_STR : F_OTHER;
    case 10: return IS("block_size") ? F_BS : IS("extra_keys") ? F_KEYED_LIST : IS("cache_salt") ? F_KEYED_STR
                                                                                                   : F_OTHER;
    case 8: return IS("metadata") ? F_KEYED_MAP : F_OTHER;
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

/* A medium field (nil or str) as a tier into ev; -1 unsupported. */
static int medium_field(reader *r, evdesc *ev)
{
    mpitem v;
    if (mp_read(r, &v) < 0 || (v.type != MP_NIL && v.type != MP_STR))
        return -1;
    return (ev->tier = tier_of_medium(&v)) < 0 ? -1 : 0;
}

/* The rest of an array-layout event (older vLLM and SGLang), its n items after the tag:
 * ["BlockStored", hashes, parent, token_ids, block_size, lora_id?, medium?, ...],
 * ["BlockRemoved", hashes, medium?, ...], ["AllBlocksCleared", ...]. 0 ok, -1 unsupported. */
static int parse_array_event(reader *r, uint64_t n, evdesc *ev)
{
    mpitem tag;
    if (n == 0 || mp_read(r, &tag) < 0)
        return -1;
    uint64_t i = 1;
    if (mp_str_is(&tag, "AllBlocksCleared")) {
        ev->kind = EV_CLEARED;
    } else if (mp_str_is(&tag, "BlockRemoved")) {
        ev->kind = EV_REMOVED;
        if (n < 2 || scan_hashes(r, &ev->hashes, &ev->nhashes) < 0 || (n > 2 && medium_field(r, ev) < 0))
            return -1;
        i = n > 2 ? 3 : 2;
    } else if (mp_str_is(&tag, "BlockStored")) {
        ev->kind = EV_STORED;
        ev->indexed = 1; /* the array layout has no kv_cache_spec_kind */
        if (n < 5 || scan_hashes(r, &ev->hashes, &ev->nhashes) < 0)
            return -1;
        const unsigned char *parent = r->p;
        mpitem v;
        if (mp_read(r, &v) < 0)
            return -1;
        if (v.type == MP_NIL) {
            ev->parent_nil = 1;
        } else {
            reader pr = {parent, r->end};
            if (read_key(&pr, &ev->parent) < 0)
                return -1;
            r->p = pr.p;
        }
        if (scan_tokens(r, &ev->tokens, &ev->ntokens) < 0 || int_field(r->p, r->end, 0, &ev->block_size) < 0 ||
            mp_skip(r, 0) < 0)
            return -1;
        i = 5;
        if (n > 5) {
            int rc = int_field(r->p, r->end, 1, &ev->lora);
            if (rc < 0 || mp_skip(r, 0) < 0)
                return -1;
            ev->has_lora = rc == 0;
            i = 6;
        }
        if (n > 6) {
            if (medium_field(r, ev) < 0)
                return -1;
            i = 7;
        }
    } else {
        return -1; /* an unknown tag: the Python decoder counts it */
    }
    for (; i < n; i++) {
        const unsigned char *item = r->p;
        /* vLLM's positional tail: 7 lora_name, 8 extra_keys (ATOM, SGLang); SGLang's metadata
         * map is the 8th item before that tail and the 15th after it */
        int rc;
        if (ev->kind != EV_STORED || (i > 8 && i < 14))
            rc = mp_skip(r, 0);
        else if (i == 7) { /* lora_name (a str), or SGLang's metadata before the tail (a map) */
            rc = plain_keys(r, F_KEYED_STR);
            if (rc == 0) {
                r->p = item;
                rc = plain_keys(r, F_KEYED_MAP);
            }
        } else
            rc = plain_keys(r, i == 8 ? F_KEYED_LIST : F_KEYED_MAP);
        if (rc < 0)
            return -1;
    }
    ev->end = r->p;
    return 0;
}

/* One event, map layout (tagged by "type") or array layout; 0 ok, -1 unsupported. */
static int parse_event(reader *r, evdesc *ev)
{
    const unsigned char *at[NFIELDS] = {0};
    mpitem it;
    memset(ev, 0, sizeof *ev);
    if (mp_read(r, &it) < 0)
        return -1;
    if (it.type == MP_ARRAY)
        return parse_array_event(r, it.u, ev);
    if (it.type != MP_MAP)
        return -1;
    for (uint64_t i = 0; i < it.u; i++) {
        mpitem key;
        if (mp_read(r, &key) < 0 || key.type != MP_STR)
            return -1;
        int f = field_of(&key);
        if (f > F_OTHER) {
            if (plain_keys(r, f) < 0)
                return -1;
            continue;
        }
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

/* The smallest msgpack event the parser accepts: ["BlockRemoved", []] is 15 bytes, a
 * fixarray with "AllBlocksCleared" 18; 8 leaves room and still bounds the allocation. */
#define MIN_EVENT_BYTES 8

/* [ts, events, dp_rank?] -> batch (evs PyMem-allocated unless n is 0); 0 ok, -1 unsupported. */
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
    /* A count is the sender's claim: every event takes at least MIN_EVENT_BYTES of the
     * payload, so a count the rest of the payload cannot hold is refused before anything
     * is allocated (the descriptors stay under sizeof(evdesc) / MIN_EVENT_BYTES x its size). */
    if (b->n > (uint64_t)(r.end - r.p) / MIN_EVENT_BYTES)
        return -1;
    if (b->n) {
        b->evs = PyMem_Malloc((size_t)b->n * sizeof(evdesc));
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
    PyMem_Free(b->evs);
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
    if (!ev->has_group || PySet_Size(skipped) == 0)
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

const char apply_payload_doc[] =
             "apply_payload(slot, payload, block_size, skipped_groups, /)\n--\n\n"
             "Parse and apply one vLLM-style msgpack batch (map or array layout) to a slot. Returns\n"
             "(events, applied, unknown_parent, unknown_removed, bad_block_size, bad_block_size_value),\n"
             "or None, having changed nothing, when the batch needs the Python decoder.";

PyObject *Index_apply_payload(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
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
    PyMem_Free(b.evs);
    PyBuffer_Release(&buf);
    return result;
}
