/* The per-request table's CSV rows in C: the bytes schedsim.run.report.request_rows makes
 * with numpy (and pyarrow's CSV writer makes), at a fraction of the CPU and without the GIL,
 * so that the formatting thread runs beside the thread writing the file.
 *
 * Each row begins with the newline that ends the row before it (see csv_text.Rows). The rules
 * are csv_text's: a decimal k / 10**d is written exactly, its fraction's trailing zeros (and a
 * point with nothing after it) left out; a null is an empty field; a value csv_text does not
 * make (negative, an integer part of 10**6 or more, a positive time under 1e-6, an integer of
 * 10**15 or more) makes the whole chunk None, for pyarrow to write.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_INT_PART 1000000LL        /* decimals: integer parts below this are exact */
#define MAX_INTEGER 1000000000000000LL /* integers: below 10**15 */
#define MAX_LABEL 32
#define FIELD_COPY 16   /* the longest decimal: 6 digits, a point, 9 digits */
/* The longest row: 15-digit id, three 16-byte seconds, two 13-byte milliseconds, two 15-digit
 * integers, a label, nine separators. Fields copied at a fixed size may write past their end
 * into what follows: the buffer has MAX_LABEL bytes to spare after the last row. */
#define MAX_ROW (16 + 3 * 17 + 2 * 14 + 2 * 16 + MAX_LABEL + 8)

static char digit_pairs[200];
static char digit_quads[40000]; /* "0000".."9999": a fraction in independent groups of four */

/* Digits of v (0 <= v < 10**15): how many. */
static int digit_count(int64_t v) {
    int n = 1;
    while (v >= 10000) {
        v /= 10000;
        n += 4;
    }
    return n + (v >= 10) + (v >= 100) + (v >= 1000);
}

/* The last `width` digits of v, zero-padded, written ending at `end` (two at a time). */
static void put_digits_before(char *end, int64_t v, int width) {
    while (width >= 2) {
        int64_t q = v / 100;
        memcpy(end - 2, digit_pairs + 2 * (v - q * 100), 2);
        end -= 2;
        v = q;
        width -= 2;
    }
    if (width)
        end[-1] = (char)('0' + v % 10);
}

/* Digits of v (0 <= v < 10**15) at p; returns the end. */
static char *put_uint(char *p, int64_t v) {
    int n = digit_count(v);
    put_digits_before(p + n, v, n);
    return p + n;
}

/* k / 10**digits as pyarrow writes the float (digits 6 or 9); NULL when csv_text does not make it. */
static char *put_decimal(char *p, int64_t k, int digits, int64_t scale) {
    if (k < 0)
        return NULL;
    int64_t whole = k / scale, frac = k - whole * scale;
    if (whole >= MAX_INT_PART)
        return NULL;
    if (k > 0 && k < scale / 1000000)
        return NULL; /* under 1e-6: pyarrow writes an exponent */
    p = put_uint(p, whole);
    if (frac) {
        *p++ = '.';
        /* digits 9: d | dddd | dddd; digits 6: dd | dddd (the groups computed independently) */
        int64_t low = frac % 10000;
        if (digits == 9) {
            *p++ = (char)('0' + frac / 100000000);
            memcpy(p, digit_quads + 4 * (frac / 10000 % 10000), 4);
            p += 4;
        } else {
            memcpy(p, digit_pairs + 2 * (frac / 10000), 2);
            p += 2;
        }
        memcpy(p, digit_quads + 4 * low, 4);
        p += 4;
        while (p[-1] == '0') /* the fraction's trailing zeros off */
            p--;
    }
    return p;
}

/* A field that repeats from row to row (a batch's start and end, shared by its requests):
 * the text of the last value written, copied while the value stays the same. */
typedef struct {
    int64_t value;
    int len;
    char text[FIELD_COPY];
} repeat_cache;

static char *put_repeated_decimal(char *p, int64_t k, repeat_cache *cache) {
    if (cache->len >= 0 && k == cache->value) {
        memcpy(p, cache->text, FIELD_COPY); /* a fixed size: two moves, no call */
        return p + cache->len;
    }
    char *end = put_decimal(p, k, 9, 1000000000LL);
    if (end) {
        cache->value = k;
        cache->len = (int)(end - p);
        memcpy(cache->text, p, FIELD_COPY);
    }
    return end;
}

typedef struct {
    Py_buffer view;
    const int64_t *v;
} column;

static int get_column(PyObject *obj, column *c, Py_ssize_t n, const char *name) {
    if (PyObject_GetBuffer(obj, &c->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (c->view.itemsize != 8 || c->view.format == NULL || (strcmp(c->view.format, "l") != 0 &&
            strcmp(c->view.format, "q") != 0 && strcmp(c->view.format, "<q") != 0 &&
            strcmp(c->view.format, "<l") != 0 && strcmp(c->view.format, "=q") != 0)
            || c->view.len != n * 8) {
        PyErr_Format(PyExc_TypeError, "%s: expected %zd contiguous int64 values", name, n);
        PyBuffer_Release(&c->view);
        return -1;
    }
    c->v = (const int64_t *)c->view.buf;
    return 0;
}

static PyObject *request_rows(PyObject *self, PyObject *args) {
    static const char *names[] = {"request_id", "arrival_ns", "start_ns", "end_ns", "batch_size",
                                  "instance", "status"};
    PyObject *objs[7], *labels;
    if (!PyArg_ParseTuple(args, "OOOOOOOO!", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6], &PyTuple_Type, &labels))
        return NULL;
    Py_ssize_t n_labels = PyTuple_GET_SIZE(labels);
    char label_text[16][MAX_LABEL] = {{0}}; /* padded: copied at a fixed size */
    Py_ssize_t label_len[16];
    if (n_labels > 16) {
        PyErr_SetString(PyExc_ValueError, "labels: at most 16");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n_labels; i++) {
        PyObject *b = PyTuple_GET_ITEM(labels, i);
        if (!PyBytes_Check(b) || PyBytes_GET_SIZE(b) > MAX_LABEL) {
            PyErr_SetString(PyExc_TypeError, "labels: a tuple of short bytes");
            return NULL;
        }
        memcpy(label_text[i], PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
        label_len[i] = PyBytes_GET_SIZE(b);
    }
    Py_buffer first;
    if (PyObject_GetBuffer(objs[0], &first, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t n = first.len / 8;
    PyBuffer_Release(&first);
    column c[7];
    int got = 0;
    for (; got < 7; got++)
        if (get_column(objs[got], &c[got], n, names[got]) < 0)
            break;
    PyObject *out = NULL;
    if (got == 7)
        out = PyBytes_FromStringAndSize(NULL, n * MAX_ROW + MAX_LABEL);
    if (out != NULL) {
        char *buf = PyBytes_AS_STRING(out), *p = buf;
        const int64_t *id = c[0].v, *arrival = c[1].v, *start = c[2].v, *end = c[3].v;
        const int64_t *size = c[4].v, *instance = c[5].v, *status = c[6].v;
        int ok = 1;
        repeat_cache start_text = {0, -1, {0}}, end_text = {0, -1, {0}};
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && ok; i++) {
            int started = start[i] >= 0, ended = end[i] >= 0;
            *p++ = '\n';
            if (id[i] < 0 || id[i] >= MAX_INTEGER) { ok = 0; break; }
            p = put_uint(p, id[i]);
            *p++ = ',';
            if (!(p = put_decimal(p, arrival[i], 9, 1000000000LL))) { ok = 0; break; }
            *p++ = ',';
            if (started && !(p = put_repeated_decimal(p, start[i], &start_text))) { ok = 0; break; }
            *p++ = ',';
            if (ended && !(p = put_repeated_decimal(p, end[i], &end_text))) { ok = 0; break; }
            *p++ = ',';
            if (started && ended && !(p = put_decimal(p, end[i] - arrival[i], 6, 1000000LL))) { ok = 0; break; }
            *p++ = ',';
            if (started && !(p = put_decimal(p, start[i] - arrival[i], 6, 1000000LL))) { ok = 0; break; }
            *p++ = ',';
            if (started) {
                if (size[i] < 0 || size[i] >= MAX_INTEGER || instance[i] < 0 || instance[i] >= MAX_INTEGER) {
                    ok = 0;
                    break;
                }
                p = put_uint(p, size[i]);
                *p++ = ',';
                p = put_uint(p, instance[i]);
            } else {
                *p++ = ',';
            }
            *p++ = ',';
            if (status[i] < 0 || status[i] >= n_labels) { ok = 0; break; }
            memcpy(p, label_text[status[i]], MAX_LABEL);
            p += label_len[status[i]];
        }
        Py_END_ALLOW_THREADS
        if (!ok) {
            Py_DECREF(out);
            out = Py_NewRef(Py_None);
        } else if (_PyBytes_Resize(&out, p - buf) < 0) {
            out = NULL;
        }
    }
    for (int j = 0; j < got; j++)
        PyBuffer_Release(&c[j].view);
    return out;
}

static PyMethodDef methods[] = {
    {"request_rows", request_rows, METH_VARARGS,
     "request_rows(request_id, arrival_ns, start_ns, end_ns, batch_size, instance, status, labels)"
     " -> bytes | None\n\nThe rows of the per-request table as report.request_rows makes them, from"
     " equal-length contiguous int64 columns and the quoted status labels; None when a value is"
     " one csv_text does not write."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csv_rows", NULL, -1, methods};

PyMODINIT_FUNC PyInit__csv_rows(void) {
    for (int i = 0; i < 100; i++) {
        digit_pairs[2 * i] = (char)('0' + i / 10);
        digit_pairs[2 * i + 1] = (char)('0' + i % 10);
    }
    for (int i = 0; i < 10000; i++) {
        digit_quads[4 * i] = (char)('0' + i / 1000);
        digit_quads[4 * i + 1] = (char)('0' + i / 100 % 10);
        digit_quads[4 * i + 2] = (char)('0' + i / 10 % 10);
        digit_quads[4 * i + 3] = (char)('0' + i % 10);
    }
    return PyModule_Create(&module);
}
