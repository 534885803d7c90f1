/*
 * The native KV index type: per-event methods (for batches decoded by any decoder), the
 * prefix match, and diagnostics. Tables and core operations: store.h; the msgpack batch
 * parser: batch.c.
 */
#include "store.h"

/* -- keys ------------------------------------------------------------------------------ */

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
        *k = fold_bytes((const unsigned char *)PyBytes_AsString(o), (size_t)PyBytes_Size(o));
        return 0;
    }
    PyObject *tname = PyType_GetName(Py_TYPE(o));
    if (tname != NULL) {
        PyErr_Format(PyExc_TypeError, "block hash must be an int or bytes, not %U", tname);
        Py_DECREF(tname);
    }
    return -1;
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
    view_t *v = view_at(x, slot);
    if (v == NULL)
        return NULL;
    PyObject *ehs = PySequence_Fast(args[2], "store: block_hashes must be a sequence");
    PyObject *hs = ehs == NULL ? NULL : PySequence_Fast(args[3], "store: hashes must be a sequence");
    PyObject *out = NULL;
    if (hs == NULL)
        goto done;
    Py_ssize_t n = fast_size(ehs);
    if (fast_size(hs) < n)
        n = fast_size(hs);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t ek;
        if (key_of(fast_item(ehs, i), &ek) < 0)
            goto done;
        long long rh = PyLong_AsLongLong(fast_item(hs, i));
        if (rh == -1 && PyErr_Occurred())
            goto done;
        int r = store_one(x, v, slot, tier, ek, (uint64_t)rh);
        if (r < 0)
            goto done;
        added += r;
    }
    out = PyLong_FromSsize_t(added);
done:
    Py_XDECREF(ehs);
    Py_XDECREF(hs);
    return out;
}

static PyObject *Index_remove(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slot, removed = 0, unknown = 0;
    int tier;
    if (nargs_is(nargs, 3, "remove(slot, tier, block_hashes)") < 0 || arg_slot(args[0], &slot) < 0 ||
        arg_tier(args[1], &tier) < 0)
        return NULL;
    PyObject *ehs = PySequence_Fast(args[2], "remove: block_hashes must be a sequence");
    if (ehs == NULL)
        return NULL;
    view_t *v = peek_view(x, slot);
    for (Py_ssize_t i = 0; i < fast_size(ehs); i++) {
        uint64_t ek;
        if (key_of(fast_item(ehs, i), &ek) < 0) {
            Py_DECREF(ehs);
            return NULL;
        }
        if (v == NULL)
            unknown++;
        else
            remove_one(x, v, slot, tier, ek, &removed, &unknown);
    }
    Py_DECREF(ehs);
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
    total += vm_bytes(&x->holders);
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

/* The matching core: out[i] (zeroed by the caller) gets the tier-weighted cached-prefix
 * length of slots[i] (-1: none; a slot listed twice scores at its last position). */
static int match_core(IndexObject *x, PyObject *hashes, const int64_t *slots, Py_ssize_t nv, const double *w,
                      double *out)
{
    Py_ssize_t nh = PyList_Size(hashes), nch = 0;
    for (Py_ssize_t i = 0; i < nv; i++) {
        if (slots[i] >= MAX_SLOT) {
            PyErr_Format(PyExc_ValueError, "slot %lld out of range", (long long)slots[i]);
            return -1;
        }
        if (slots[i] >= 0 && slots[i] / 64 + 1 > nch)
            nch = (Py_ssize_t)(slots[i] / 64 + 1);
    }
    if (nch == 0 || nh == 0)
        return 0;
    size_t nslots = (size_t)nch * 64;
    uint64_t *alive = calloc((size_t)nch, sizeof(uint64_t));
    Py_ssize_t *pos = malloc(nslots * sizeof(Py_ssize_t));
    Py_ssize_t *depth_of = malloc(nslots * sizeof(Py_ssize_t));
    double *credit = calloc(nslots, sizeof(double));
    uint64_t *hv = NULL;
    int rc = -1;
    if (alive == NULL || pos == NULL || depth_of == NULL || credit == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t s = 0; s < nslots; s++)
        pos[s] = depth_of[s] = -1;
    uint64_t alive_key = 0; /* XOR of slot_key() over the alive slots */
    for (Py_ssize_t i = 0; i < nv; i++) {
        int64_t s = slots[i];
        if (s >= 0) {
            pos[s] = i;
            if (!(alive[s >> 6] & (1ULL << (s & 63))))
                alive_key ^= slot_key(s);
            alive[s >> 6] |= 1ULL << (s & 63);
        }
    }
    int lower = !tier_empty(x, 1) || !tier_empty(x, 2);
    hv = malloc((size_t)nh * sizeof(uint64_t));
    if (hv == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < nh; k++) {
        long long v = PyLong_AsLongLong(PyList_GetItem(hashes, k));
        if (v == -1 && PyErr_Occurred())
            goto done;
        hv[k] = (uint64_t)v;
    }
    Py_ssize_t depth = 0;
    for (Py_ssize_t k = 0; k < nh; k++) {
        uint64_t h = hv[k], any = 0;
        /* exactly the alive slots hold this block on the GPU (a system prompt every worker
         * caches): all stay alive at full credit, one probe instead of one per chunk */
        if (alive_key && vm_get(&x->holders, h) == alive_key) {
            depth++;
            continue;
        }
        /* the walk is one random probe per (block, live chunk): ask for the next block's
         * slots while this one is probed, so their cache misses overlap */
        uint64_t hn = k + 1 < nh ? hv[k + 1] : 0;
        int ahead = k + 1 < nh;
        for (Py_ssize_t c = 0; c < nch; c++) {
            uint64_t a = alive[c], m;
            if (!a)
                continue;
            if (ahead) {
                if (c < x->nchunks[0])
                    vm_prefetch(&x->masks[0][c], hn);
                if (lower) {
                    if (c < x->nchunks[1])
                        vm_prefetch(&x->masks[1][c], hn);
                    if (c < x->nchunks[2])
                        vm_prefetch(&x->masks[2][c], hn);
                }
            }
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
            for (uint64_t dropped = a & ~m; dropped; dropped &= dropped - 1) {
                int b = __builtin_ctzll(dropped);
                alive_key ^= slot_key(c * 64 + b);
                if (depth) /* views dropped at depth 0 keep 0 */
                    depth_of[c * 64 + b] = depth;
            }
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
    for (size_t s = 0; s < nslots; s++)
        if (depth_of[s] >= 0 && pos[s] >= 0)
            out[pos[s]] = (double)depth_of[s] * w[0] - credit[s];
    rc = 0;
done:
    free(alive);
    free(pos);
    free(depth_of);
    free(credit);
    free(hv);
    return rc;
}

static int parse_weights(PyObject *t, double *w)
{
    if (!PyTuple_Check(t) || PyTuple_Size(t) < 3) {
        PyErr_SetString(PyExc_TypeError, "weights must be a tuple[float, float, float]");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        w[i] = PyFloat_AsDouble(PyTuple_GetItem(t, i));
        if (w[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(match_doc,
             "match(hashes, slots, weights, /)\n--\n\n"
             "Tier-weighted cached-prefix length per slot (-1: none); see KvIndex.match.");

static PyObject *Index_match(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs_is(nargs, 3, "match(hashes, slots, weights)") < 0)
        return NULL;
    PyObject *hashes = args[0], *slots = args[1];
    double w[3];
    if (!PyList_Check(hashes) || !PyList_Check(slots)) {
        PyErr_SetString(PyExc_TypeError, "match(list[int], list[int], tuple[float, float, float])");
        return NULL;
    }
    if (parse_weights(args[2], w) < 0)
        return NULL;
    Py_ssize_t nv = PyList_Size(slots);
    int64_t *sl = malloc((size_t)(nv ? nv : 1) * sizeof(int64_t));
    double *res = calloc((size_t)(nv ? nv : 1), sizeof(double));
    PyObject *out = NULL;
    if (sl == NULL || res == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nv; i++) {
        Py_ssize_t s = PyLong_AsSsize_t(PyList_GetItem(slots, i));
        if (s == -1 && PyErr_Occurred())
            goto done;
        sl[i] = s;
    }
    if (match_core(x, hashes, sl, nv, w, res) < 0)
        goto done;
    out = PyList_New(nv);
    for (Py_ssize_t i = 0; out != NULL && i < nv; i++) {
        PyObject *f = PyFloat_FromDouble(res[i]);
        if (f == NULL)
            Py_CLEAR(out);
        else
            PyList_SetItem(out, i, f);
    }
done:
    free(sl);
    free(res);
    return out;
}

PyDoc_STRVAR(match_into_doc,
             "match_into(hashes, slots, weights, out, /)\n--\n\n"
             "match() over buffers: slots a contiguous int64 buffer (-1: none), out a writable float64\n"
             "buffer of the same length, zeroed by the caller, receiving each slot's score.");

static PyObject *Index_match_into(IndexObject *x, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs_is(nargs, 4, "match_into(hashes, slots, weights, out)") < 0)
        return NULL;
    double w[3];
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "match_into: hashes must be a list[int]");
        return NULL;
    }
    if (parse_weights(args[2], w) < 0)
        return NULL;
    Py_buffer sb, ob;
    if (PyObject_GetBuffer(args[1], &sb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[3], &ob, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&sb);
        return NULL;
    }
    int rc = -1;
    if (sb.itemsize != 8 || sb.format == NULL || (strcmp(sb.format, "l") && strcmp(sb.format, "q"))) {
        PyErr_SetString(PyExc_TypeError, "match_into: slots must be an int64 buffer");
    } else if (ob.itemsize != 8 || ob.format == NULL || strcmp(ob.format, "d")) {
        PyErr_SetString(PyExc_TypeError, "match_into: out must be a float64 buffer");
    } else if (ob.len != sb.len) {
        PyErr_SetString(PyExc_ValueError, "match_into: slots and out differ in length");
    } else {
        rc = match_core(x, args[0], (const int64_t *)sb.buf, sb.len / 8, w, (double *)ob.buf);
    }
    PyBuffer_Release(&sb);
    PyBuffer_Release(&ob);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
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
    vm_free(&x->holders);
    PyTypeObject *type = Py_TYPE((PyObject *)x);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    tp_free((PyObject *)x);
    Py_DECREF(type); /* instances of heap types own a reference to their type */
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
    FASTCALL(match_into, match_into_doc),
    FASTCALL(apply_payload, apply_payload_doc),
    {"unique_hashes", (PyCFunction)Index_unique_hashes, METH_NOARGS, "distinct router hashes, summed over tiers"},
    {"memory_bytes", (PyCFunction)Index_memory_bytes, METH_NOARGS, "bytes allocated by the tables"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Index_slots[] = {
    {Py_tp_dealloc, (void *)Index_dealloc},
    {Py_tp_doc, (void *)"The KV index's block tables in C (see infera_core.kv.store)."},
    {Py_tp_methods, Index_methods},
    {Py_tp_new, (void *)PyType_GenericNew},
    {0, NULL},
};

/* A heap type (the limited API has no static PyTypeObject), one per module object. */
static PyType_Spec Index_spec = {
    .name = "infera_kv_native._chain.Index",
    .basicsize = sizeof(IndexObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Index_slots,
};

int index_add_type(PyObject *module)
{
    PyObject *type = PyType_FromModuleAndSpec(module, &Index_spec, NULL);
    if (type == NULL)
        return -1;
    if (PyModule_AddObject(module, "Index", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}
