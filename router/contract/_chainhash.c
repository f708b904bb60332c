/* The block-hash chain of router/contract/protocol.py in C: one call per prompt, not
 * one Python step per block.
 *
 *     chain(data, block_size, prev) -> list[int]
 *     u32le(ids) -> bytes
 *
 * `data` is token ids as little-endian uint32 bytes; block i's hash is xxh3-64 (seed 0)
 * of the 8 little-endian bytes of the hash before it (`prev` for block 0) followed by
 * the block's 4 * block_size bytes, exactly as `block_hashes_of_bytes` computes it. A
 * partial tail is not hashed. `u32le` packs a list or tuple of ints as those bytes, with
 * array('I')'s errors: TypeError for a non-int, OverflowError outside 0..2**32-1.
 *
 * xxh3 is not reimplemented here: the xxhash wheel's extension exports XXH3_64bits, and
 * this module looks it up in that already-loaded library (dlopen RTLD_NOLOAD, dlsym).
 * Where that fails, or no C compiler built this file (setup.py marks it optional), the
 * import fails and protocol.py keeps its pure-Python loop; it also checks this module
 * against that loop once at import.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef uint64_t (*xxh3_64_fn)(const void *input, size_t length);

static xxh3_64_fn xxh3_64 = NULL;

static void put_u64le(unsigned char *out, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        out[i] = (unsigned char)(v >> (8 * i));
    }
}

static PyObject *chain(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t block_size;
    PyObject *prev_obj;
    if (!PyArg_ParseTuple(args, "y*nO!:chain", &view, &block_size, &PyLong_Type, &prev_obj)) {
        return NULL;
    }
    uint64_t prev = PyLong_AsUnsignedLongLong(prev_obj);
    if (prev == (uint64_t)-1 && PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (block_size < 1 || block_size > PY_SSIZE_T_MAX / 4 - 8) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "block_size out of range: %zd", block_size);
        return NULL;
    }
    Py_ssize_t step = block_size * 4;
    Py_ssize_t n = view.len / step;
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char small[8 + 64 * 4];
    unsigned char *buf = small;
    if ((size_t)(step + 8) > sizeof(small)) {
        buf = PyMem_Malloc((size_t)(step + 8));
        if (buf == NULL) {
            Py_DECREF(out);
            PyBuffer_Release(&view);
            return PyErr_NoMemory();
        }
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        put_u64le(buf, prev);
        memcpy(buf + 8, data + i * step, (size_t)step);
        prev = xxh3_64(buf, (size_t)(step + 8));
        PyObject *h = PyLong_FromUnsignedLongLong(prev);
        if (h == NULL) {
            Py_DECREF(out);
            out = NULL;
            break;
        }
        PyList_SET_ITEM(out, i, h);
    }
    if (buf != small) {
        PyMem_Free(buf);
    }
    PyBuffer_Release(&view);
    return out;
}

static PyObject *u32le(PyObject *self, PyObject *arg) {
    if (!PyList_Check(arg) && !PyTuple_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "u32le takes a list or tuple of ints");
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(arg);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 4);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    PyObject **items = PySequence_Fast_ITEMS(arg);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (!PyLong_Check(item)) {
            Py_DECREF(out);
            PyErr_Format(PyExc_TypeError, "token ids must be ints, not %.100s", Py_TYPE(item)->tp_name);
            return NULL;
        }
        unsigned long v = PyLong_AsUnsignedLong(item);  /* OverflowError when negative or too large */
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            Py_DECREF(out);
            return NULL;
        }
        if (v > 0xFFFFFFFFUL) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_OverflowError, "token id is greater than 2**32 - 1");
            return NULL;
        }
        p[4 * i] = (unsigned char)v;
        p[4 * i + 1] = (unsigned char)(v >> 8);
        p[4 * i + 2] = (unsigned char)(v >> 16);
        p[4 * i + 3] = (unsigned char)(v >> 24);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"chain", chain, METH_VARARGS,
     "chain(data, block_size, prev) -> list[int]: chained xxh3-64 hashes of data's full blocks"},
    {"u32le", u32le, METH_O, "u32le(ids) -> bytes: a list or tuple of ints as little-endian uint32"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_chainhash", "The block-hash chain in C (router/contract/protocol.py).", -1, methods,
};

static int find_xxh3(void) {
    PyObject *mod = PyImport_ImportModule("xxhash._xxhash");
    if (mod == NULL) {
        return -1;
    }
    PyObject *path = PyObject_GetAttrString(mod, "__file__");
    Py_DECREF(mod);
    if (path == NULL) {
        return -1;
    }
    const char *cpath = PyUnicode_AsUTF8(path);
    if (cpath == NULL) {
        Py_DECREF(path);
        return -1;
    }
    void *lib = dlopen(cpath, RTLD_NOW | RTLD_NOLOAD);
    Py_DECREF(path);
    if (lib != NULL) {
        xxh3_64 = (xxh3_64_fn)dlsym(lib, "XXH3_64bits");
    }
    if (xxh3_64 == NULL) {
        PyErr_SetString(PyExc_ImportError, "the xxhash extension does not export XXH3_64bits");
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__chainhash(void) {
    if (find_xxh3() < 0) {
        return NULL;
    }
    return PyModule_Create(&module);
}
