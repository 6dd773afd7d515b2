/* The event-free run of one instance under Triton's dynamic batcher (its common case), or a
 * static batcher, in C: simulate.py's _run_queue_rule with the queue rule of
 * policies/dynamic.py (which NoBatching's is at size 1) or policies/basic.py's StaticBatching,
 * CostModel.sample_s,
 * CostModel.wake_ns (a constant or a WakeCurve) and power.GpuClock restated, the same
 * arithmetic in the same order (no FMA contraction: setup.py builds with -ffp-contract=off),
 * so the batch log is the Python loop's bit for bit (tests/unit/core/test_compiled_queue.py).
 *
 * run() is resumable: it returns a code when it needs something only Python has (more uniform
 * draws, a batch size's cost entry, a larger log) before changing any state, and the caller
 * supplies it and calls again (schedsim/core/compiled_queue.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>

#define NEVER INT64_MAX

/* LOG_FULL guards the log's bounds; the caller sizes it for one batch a row, so it is not reached. */
enum { DONE = 0, NEED_UNIFORMS = 1, NEED_WAKE_DRAWS = 2, NEED_SIZE = 3, LOG_FULL = 4 };

/* istate: the loop's integers, read and written back. */
enum { I_HEAD, I_TAIL, I_NOW, I_NEXT_ARRIVAL, I_FREED, I_CLOCK_AT, I_CLOCK_BUSY_UNTIL, I_LOG_LEN, I_UPOS,
       I_WPOS, I_NEED_SIZE, I_COUNT };
/* fstate: the clock's factor and the pull of the running batches. */
enum { F_FACTOR, F_BUSY_TARGET, F_COUNT };
/* params: fixed for the run. */
/* P_DELAY: max_queue_delay_ns, or static's max_wait_ns; P_MOST: max_batch_size, or batch_size. */
enum { P_DELAY, P_MOST, P_MAX_PREFERRED, P_HAS_CLOCK, P_WAKE_MODE, P_WAKE_CONST_NS, P_RULE, P_COUNT };
enum { RULE_DYNAMIC = 0, RULE_STATIC = 1 };
enum { WAKE_CONST = 0, WAKE_CURVE = 1, WAKE_CURVE_RANDOM = 2 };
/* fparams */
enum { FP_KM1, FP_RISE, FP_FALL, FP_IDLE, FP_COUNT };

typedef struct {
    const int64_t *arrival;
    Py_ssize_t n;
    const int64_t *preferred;
    Py_ssize_t n_preferred;
    /* per batch size b = 0..most */
    const uint8_t *prepared, *constant, *has_q1;
    const double *value, *q0, *q1, *weight, *dispatch, *steady, *table_factor;
    Py_ssize_t k;
    const double *uniforms;
    Py_ssize_t n_uniforms;
    const double *wake_draws;
    Py_ssize_t n_wake_draws;
    /* wake curve */
    const double *log_idle, *extra_us, *probs, *extra_q_us;
    Py_ssize_t n_points, n_probs;
} inputs;

static Py_ssize_t bisect_right_i64(const int64_t *a, Py_ssize_t lo, Py_ssize_t hi, int64_t x) {
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (x < a[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* bisect.bisect_right (right) or bisect_left over a[0:hi]. */
static Py_ssize_t bisect_f64(const double *a, Py_ssize_t hi, double x, int right) {
    Py_ssize_t lo = 0;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (right ? x < a[mid] : !(a[mid] < x))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The quantile bracket of u, as WakeCurve finds it: j, and u's place g between probs j-1 and j. */
static Py_ssize_t prob_bracket(const inputs *in, double u, double *g) {
    const double *p = in->probs;
    Py_ssize_t j = bisect_f64(p, in->n_probs, u, 1);
    if (j < 1)
        j = 1;
    if (j > in->n_probs - 1)
        j = in->n_probs - 1;
    *g = (u - p[j - 1]) / (p[j] - p[j - 1]);
    return j;
}

/* WakeCurve._at */
static double wake_at(const inputs *in, Py_ssize_t point, double u) {
    if (in->n_probs == 0)
        return in->extra_us[point];
    const double *q = in->extra_q_us + point * in->n_probs;
    double g;
    Py_ssize_t j = prob_bracket(in, u, &g);
    return q[j - 1] + g * (q[j] - q[j - 1]);
}

/* WakeCurve.extra_ns */
static int64_t wake_extra_ns(const inputs *in, int64_t idle_ns, double u) {
    double x = log((double)(idle_ns > 1 ? idle_ns : 1) * 1e-3);
    const double *lx = in->log_idle;
    Py_ssize_t i = bisect_f64(lx, in->n_points, x, 0);
    if (i == 0 || i == in->n_points)
        return (int64_t)nearbyint(wake_at(in, i - (i > 0), u) * 1e3);
    double f = (x - lx[i - 1]) / (lx[i] - lx[i - 1]);
    double a, b;
    if (in->n_probs == 0) {
        a = in->extra_us[i - 1];
        b = in->extra_us[i];
    } else {
        const double *q0 = in->extra_q_us + (i - 1) * in->n_probs, *q1 = in->extra_q_us + i * in->n_probs;
        double g;
        Py_ssize_t j = prob_bracket(in, u, &g);
        a = q0[j - 1] + g * (q0[j] - q0[j - 1]);
        b = q1[j - 1] + g * (q1[j] - q1[j - 1]);
    }
    return (int64_t)nearbyint(((1.0 - f) * a + f * b) * 1e3);
}

/* GpuClock.launch */
static double clock_launch(int64_t *is, double *fs, const double *fp, const inputs *in, int64_t now, Py_ssize_t b) {
    int64_t t = is[I_CLOCK_AT];
    if (now > t) {
        double f = fs[F_FACTOR];
        int64_t busy_end = is[I_CLOCK_BUSY_UNTIL];
        if (busy_end > t) {
            if (busy_end > now)
                busy_end = now;
            double target = fs[F_BUSY_TARGET];
            f = target + (f - target) * exp((double)(t - busy_end) / (target > f ? fp[FP_RISE] : fp[FP_FALL]));
            t = busy_end;
        }
        if (now > t) {
            double idle = fp[FP_IDLE];
            f = idle + (f - idle) * exp((double)(t - now) / (idle > f ? fp[FP_RISE] : fp[FP_FALL]));
        }
        fs[F_FACTOR] = f;
        is[I_CLOCK_AT] = now;
    }
    double steady = in->steady[b];
    if (is[I_CLOCK_BUSY_UNTIL] <= now || steady > fs[F_BUSY_TARGET])
        fs[F_BUSY_TARGET] = steady;
    return fs[F_FACTOR] / in->table_factor[b];
}

static int run_loop(const inputs *in, const int64_t *pm, const double *fp, int64_t *is, double *fs,
                    int64_t *log, Py_ssize_t log_cap) {
    const int64_t *arrival = in->arrival;
    const Py_ssize_t n = in->n;
    const int64_t delay = pm[P_DELAY], most = pm[P_MOST], max_preferred = pm[P_MAX_PREFERRED];
    int64_t head = is[I_HEAD], tail = is[I_TAIL], now = is[I_NOW], next_arrival = is[I_NEXT_ARRIVAL];
    int64_t freed = is[I_FREED], log_len = is[I_LOG_LEN], upos = is[I_UPOS], wpos = is[I_WPOS];
    int code = DONE;
    for (;;) {
        if (next_arrival <= now) {
            tail = bisect_right_i64(arrival, tail, n, now);
            next_arrival = tail < n ? arrival[tail] : NEVER;
        }
        int64_t take = 0, wake = NEVER, need = 1;
        int64_t queued = tail - head;
        if (pm[P_RULE] == RULE_STATIC) {
            /* policies/basic.py, StaticBatching.queue_rule */
            if (queued > 0) {
                if (queued >= most || tail == n || (delay && now - arrival[head] >= delay)) {
                    take = queued < most ? queued : most;
                } else {
                    if (delay) {
                        int64_t at = arrival[head] + delay;
                        wake = at > now ? at : NEVER;
                    }
                    need = most - queued > 1 ? most - queued : 1;
                }
            } else {
                need = delay ? 1 : most;
            }
        } else if (queued > 0) {
            /* policies/dynamic.py, DynamicBatcher.queue_rule */
            int send_now = queued > most;
            int64_t walked = send_now ? most : queued;
            Py_ssize_t i = 0;
            while (i < in->n_preferred && in->preferred[i] <= walked)
                i++;
            int64_t oldest = arrival[head];
            int expired = delay > 0 && now - oldest >= delay;
            if (i && !expired)
                take = in->preferred[i - 1];
            else if (send_now || walked >= max_preferred || expired || delay == 0)
                take = walked;
            else {
                wake = oldest + delay;
                need = in->preferred[i] - walked;
            }
        }
        if (take) {
            Py_ssize_t b = (Py_ssize_t)take; /* one sample per request */
            if (!in->prepared[b]) {
                is[I_NEED_SIZE] = b;
                code = NEED_SIZE;
                break;
            }
            if (upos >= in->n_uniforms) {
                code = NEED_UNIFORMS;
                break;
            }
            if (freed != now && pm[P_WAKE_MODE] == WAKE_CURVE_RANDOM && wpos >= in->n_wake_draws) {
                code = NEED_WAKE_DRAWS;
                break;
            }
            if (log_len + 6 > log_cap) {
                code = LOG_FULL;
                break;
            }
            int64_t first = head;
            head += take;
            /* CostModel.sample_s */
            double u = in->uniforms[upos++];
            double service_s;
            if (in->constant[b]) {
                service_s = in->value[b];
            } else {
                double x = u * fp[FP_KM1];
                Py_ssize_t j = (Py_ssize_t)x;
                double f = x - (double)j;
                double g = 1.0 - f;
                const double *q0 = in->q0 + b * in->k;
                double v = g * q0[j] + f * q0[j + 1];
                if (in->has_q1[b]) {
                    const double *q1 = in->q1 + b * in->k;
                    double w = in->weight[b];
                    v = (1.0 - w) * v + w * (g * q1[j] + f * q1[j + 1]);
                }
                service_s = v;
            }
            if (pm[P_HAS_CLOCK]) {
                double factor = clock_launch(is, fs, fp, in, now, b);
                if (factor != 1.0) {
                    double dispatch_s = in->dispatch[b];
                    service_s = dispatch_s + (service_s - dispatch_s) * factor;
                }
            }
            int64_t service_ns = (int64_t)nearbyint(service_s * 1e9);
            if (freed != now) {
                int64_t idle_ns = now - freed;
                if (pm[P_WAKE_MODE] == WAKE_CONST)
                    service_ns += pm[P_WAKE_CONST_NS];
                else
                    service_ns += wake_extra_ns(in, idle_ns, pm[P_WAKE_MODE] == WAKE_CURVE_RANDOM ?
                                                in->wake_draws[wpos++] : 0.5);
            }
            int64_t end = now + service_ns;
            if (pm[P_HAS_CLOCK] && end > is[I_CLOCK_BUSY_UNTIL])
                is[I_CLOCK_BUSY_UNTIL] = end;
            int64_t *row = log + log_len;
            row[0] = now;
            row[1] = end;
            row[2] = 0;
            row[3] = take;
            row[4] = take;
            row[5] = first;
            log_len += 6;
            freed = now = end;
            continue;
        }
        if (tail < n) {
            int64_t ahead = need > 1 ? need : 1;
            int64_t at_row = tail + ahead - 1;
            int64_t at = arrival[at_row < n - 1 ? at_row : n - 1];
            if (at < wake)
                wake = at;
        }
        if (wake == NEVER)
            break;
        now = wake;
    }
    is[I_HEAD] = head;
    is[I_TAIL] = tail;
    is[I_NOW] = now;
    is[I_NEXT_ARRIVAL] = next_arrival;
    is[I_FREED] = freed;
    is[I_LOG_LEN] = log_len;
    is[I_UPOS] = upos;
    is[I_WPOS] = wpos;
    return code;
}

#define N_BUFFERS 23

static PyObject *run(PyObject *self, PyObject *args) {
    /* arrival, preferred, prepared, constant, has_q1, value, q0, q1, weight, dispatch, steady,
     * table_factor, uniforms, wake_draws, log_idle, extra_us, probs, extra_q_us,
     * params, fparams (read); istate, fstate, log (written) */
    Py_buffer b[N_BUFFERS] = {{0}};
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*y*w*w*w*n", &b[0], &b[1], &b[2], &b[3],
                          &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14],
                          &b[15], &b[16], &b[17], &b[18], &b[19], &b[20], &b[21], &b[22], &k))
        return NULL;
    inputs in = {
        .arrival = b[0].buf, .n = b[0].len / 8,
        .preferred = b[1].buf, .n_preferred = b[1].len / 8,
        .prepared = b[2].buf, .constant = b[3].buf, .has_q1 = b[4].buf,
        .value = b[5].buf, .q0 = b[6].buf, .q1 = b[7].buf, .weight = b[8].buf, .dispatch = b[9].buf,
        .steady = b[10].buf, .table_factor = b[11].buf, .k = k,
        .uniforms = b[12].buf, .n_uniforms = b[12].len / 8,
        .wake_draws = b[13].buf, .n_wake_draws = b[13].len / 8,
        .log_idle = b[14].buf, .n_points = b[14].len / 8, .extra_us = b[15].buf,
        .probs = b[16].buf, .n_probs = b[17].len ? b[16].len / 8 : 0, .extra_q_us = b[17].buf,
    };
    const int64_t *pm = b[18].buf;
    const double *fp = b[19].buf;
    int64_t *is = b[20].buf;
    double *fs = b[21].buf;
    int64_t *log = b[22].buf;
    Py_ssize_t log_cap = b[22].len / 8;
    PyObject *out = NULL;
    if (b[18].len < P_COUNT * 8 || b[19].len < FP_COUNT * 8 || b[20].len < I_COUNT * 8 || b[21].len < F_COUNT * 8
            || b[2].len < (pm[P_MOST] + 1) || b[6].len < (pm[P_MOST] + 1) * k * 8) {
        PyErr_SetString(PyExc_ValueError, "_queue_run.run: buffers too short");
    } else {
        int code;
        Py_BEGIN_ALLOW_THREADS
        code = run_loop(&in, pm, fp, is, fs, log, log_cap);
        Py_END_ALLOW_THREADS
        out = PyLong_FromLong(code);
    }
    for (int j = 0; j < N_BUFFERS; j++)
        PyBuffer_Release(&b[j]);
    return out;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "Run the loop until done or until it needs something; see compiled_queue.py."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_queue_run", NULL, -1, methods};

PyMODINIT_FUNC PyInit__queue_run(void) { return PyModule_Create(&module); }
