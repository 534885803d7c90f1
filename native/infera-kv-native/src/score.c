/*
 * The predicted-latency scorer's pass over its candidates, fused: what infera_core's
 * scheduling.kernels.py_predicted_ttft (the specification) does in some ten numpy passes, in
 * one loop and, for the scores, a second one. Every element goes through the same IEEE
 * operations in the same order (the build turns floating-point contraction off), so the results
 * are identical to the bit; tests check it on random and edge-case input (NaN, inf, overlaps
 * outside [0, 1]).
 */
#include "score.h"
#include <math.h>
#include <string.h>

const char predicted_ttft_doc[] =
    "predicted_ttft(overlap, rate, wait, qerr, tokens, uncached, ttft, factor, /)\n--\n\n"
    "uncached = (1 - clip(overlap, 0, 1)) * tokens; ttft = uncached / rate (+ wait) (+ qerr where\n"
    "wait > 0), written into the float64 buffers uncached and ttft; wait and qerr may be None.\n"
    "Returns min(ttft) (NaN when any is). When factor is not None, ttft then receives\n"
    "(ttft - min) * factor instead.";

/* A contiguous float64 buffer of n items (n < 0: any length, set); None allowed when optional. */
static int get_f64(PyObject *o, Py_buffer *b, int writable, Py_ssize_t *n, const char *fn, const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, b, flags) < 0)
        return -1;
    if (b->itemsize != 8 || b->format == NULL || strcmp(b->format, "d")) {
        PyErr_Format(PyExc_TypeError, "%s: %s must be a float64 buffer", fn, what);
        PyBuffer_Release(b);
        return -1;
    }
    if (*n < 0) {
        *n = b->len / 8;
    } else if (b->len / 8 != *n) {
        PyErr_Format(PyExc_ValueError, "%s: %s differs in length", fn, what);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static double run(const double *ov, const double *rate, const double *wait, const double *qerr,
                  double tokens, double *unc, double *ttft, Py_ssize_t n)
{
    double m = INFINITY;
    int nan = 0;
    double first_nan = NAN;
    for (Py_ssize_t i = 0; i < n; i++) {
        double o = ov[i];
        double u = (o >= 0.0 || isnan(o)) ? o : 0.0; /* np.maximum(o, 0.0) */
        u = (u <= 1.0 || isnan(u)) ? u : 1.0;        /* np.minimum(u, 1.0) */
        u = 1.0 - u;
        u = u * tokens;
        double t = u / rate[i];
        if (wait != NULL) {
            double w = wait[i];
            t = t + w;
            if (qerr != NULL && w > 0.0)
                t = t + qerr[i];
        }
        unc[i] = u;
        ttft[i] = t;
        if (isnan(t)) {
            if (!nan)
                first_nan = t; /* np.min's: the NaN it met (its sign and payload carry on) */
            nan = 1;
        } else if (t < m) {
            m = t;
        }
    }
    return nan ? first_nan : m;
}

PyObject *predicted_ttft(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "predicted_ttft(overlap, rate, wait, qerr, tokens, uncached, ttft, factor) takes 8 arguments");
        return NULL;
    }
    double tokens = PyFloat_AsDouble(args[4]);
    if (tokens == -1.0 && PyErr_Occurred())
        return NULL;
    int scaled = args[7] != Py_None;
    double factor = 0.0;
    if (scaled) {
        factor = PyFloat_AsDouble(args[7]);
        if (factor == -1.0 && PyErr_Occurred())
            return NULL;
    }
    if (args[3] != Py_None && args[2] == Py_None) {
        PyErr_SetString(PyExc_ValueError, "predicted_ttft: qerr needs wait");
        return NULL;
    }
    Py_buffer b[6];
    int got = 0;
    Py_ssize_t n = -1;
    double m = 0.0;
    static const char *names[6] = {"overlap", "rate", "wait", "qerr", "uncached", "ttft"};
    const int index[6] = {0, 1, 2, 3, 5, 6};
    const double *p[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    for (; got < 6; got++) {
        PyObject *o = args[index[got]];
        if (o == Py_None && (got == 2 || got == 3))
            continue;
        if (get_f64(o, &b[got], got >= 4, &n, "predicted_ttft", names[got]) < 0)
            goto fail;
        p[got] = (const double *)b[got].buf;
    }
    m = run(p[0], p[1], p[2], p[3], tokens, (double *)p[4], (double *)p[5], n);
    if (scaled) {
        double *t = (double *)p[5];
        for (Py_ssize_t i = 0; i < n; i++)
            t[i] = (t[i] - m) * factor;
    }
fail:
    for (int k = 0; k < got; k++)
        if (p[k] != NULL)
            PyBuffer_Release(&b[k]);
    if (got < 6)
        return NULL;
    return PyFloat_FromDouble(m);
}

const char weighted_sum_doc[] =
    "weighted_sum(parts, weights, clipped, out, /)\n--\n\n"
    "out = clip(parts[0]) * weights[0] + clip(parts[1]) * weights[1] + ..., element by element in\n"
    "that order (numpy's, to the bit), where clip(x) is np.clip(x, 0, 1) for the parts whose bit is\n"
    "set in the int clipped and x itself for the others. parts: a tuple of float64 buffers of\n"
    "out's length (at most 64); weights: a tuple of floats.";

/* np.clip(x, 0.0, 1.0) of one float64: NaN stays NaN (and its payload). */
static inline double clip01(double x)
{
    x = x < 0.0 ? 0.0 : x; /* NaN and -0.0 stay as they are, as in numpy */
    return x > 1.0 ? 1.0 : x;
}

/* out[i] = (first ? 0 : out[i]) + clip01?(p[i]) * w: one part's pass (restrict: vectorized). */
static void add_part(double *restrict out, const double *restrict p, double w, int clip, int first,
                     Py_ssize_t n)
{
    if (first) {
        if (clip)
            for (Py_ssize_t i = 0; i < n; i++)
                out[i] = clip01(p[i]) * w;
        else
            for (Py_ssize_t i = 0; i < n; i++)
                out[i] = p[i] * w;
    } else if (clip) {
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = out[i] + clip01(p[i]) * w;
    } else {
        for (Py_ssize_t i = 0; i < n; i++)
            out[i] = out[i] + p[i] * w;
    }
}

PyObject *weighted_sum(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "weighted_sum(parts, weights, clipped, out) takes 4 arguments");
        return NULL;
    }
    PyObject *parts = args[0], *weights = args[1];
    if (!PyTuple_Check(parts) || !PyTuple_Check(weights)) {
        PyErr_SetString(PyExc_TypeError, "weighted_sum: parts and weights must be tuples");
        return NULL;
    }
    Py_ssize_t k = PyTuple_Size(parts);
    if (k < 1 || k > 64 || PyTuple_Size(weights) != k) {
        PyErr_SetString(PyExc_ValueError, "weighted_sum: 1 to 64 parts, one weight each");
        return NULL;
    }
    unsigned long long clipped = PyLong_AsUnsignedLongLong(args[2]);
    if (clipped == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    double w[64];
    for (Py_ssize_t j = 0; j < k; j++) {
        w[j] = PyFloat_AsDouble(PyTuple_GetItem(weights, j));
        if (w[j] == -1.0 && PyErr_Occurred())
            return NULL;
    }
    Py_buffer ob;
    Py_ssize_t n = -1;
    if (get_f64(args[3], &ob, 1, &n, "weighted_sum", "out") < 0)
        return NULL;
    Py_buffer b[64];
    Py_ssize_t got = 0;
    double *out = (double *)ob.buf;
    for (; got < k; got++)
        if (get_f64(PyTuple_GetItem(parts, got), &b[got], 0, &n, "weighted_sum", "a part") < 0)
            break;
    if (got == k) {
        int aliased = 0; /* out must not be one of the parts (restrict) */
        for (Py_ssize_t j = 0; j < k; j++)
            aliased |= b[j].buf == ob.buf;
        if (aliased)
            PyErr_SetString(PyExc_ValueError, "weighted_sum: out must not be one of the parts");
        else
            for (Py_ssize_t j = 0; j < k; j++)
                add_part(out, (const double *)b[j].buf, w[j], (int)((clipped >> j) & 1ULL), j == 0, n);
    }
    for (Py_ssize_t j = 0; j < got; j++)
        PyBuffer_Release(&b[j]);
    PyBuffer_Release(&ob);
    if (got < k || PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}
