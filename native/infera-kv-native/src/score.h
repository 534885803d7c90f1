/* The predicted-latency scorer's per-candidate pass (score.c), exported by the module in chain.c. */
#ifndef INFERA_SCORE_H
#define INFERA_SCORE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

PyObject *predicted_ttft(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
extern const char predicted_ttft_doc[];
PyObject *weighted_sum(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
extern const char weighted_sum_doc[];

#endif
