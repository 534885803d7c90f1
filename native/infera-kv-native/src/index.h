/* The native KV index (index.c), registered by the module in chain.c. */
#ifndef INFERA_INDEX_H
#define INFERA_INDEX_H
#include "kvcommon.h"

int index_add_type(PyObject *module);
PyObject *fold_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *batch_dp_rank(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
extern const char fold_key_doc[];
extern const char batch_dp_rank_doc[];

#endif
