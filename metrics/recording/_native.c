/* The JAX hooks' usual calls in C: metrics.recording._native.
 *
 * Callables stand in for the Python closures of
 * metrics.engines.jax_calls.counting (a counted jitted call),
 * metrics.engines.jax_to_device._shard_handler (the numpy shard handler
 * that counts jax.device_put, with ExplicitScope around jax.device_put)
 * and metrics.engines.jax_transfers._value_property (device->host reads)
 * on their usual calls, timed (the sampled
 * ones, metrics.recording.sampling) or not: they run no Python frame and
 * pass the caller's arguments through with vectorcall (no tuple is built).
 * Every call off the usual path (numpy arguments, a compile, a function
 * with several graphs, anything the handler shards that is not an explicit
 * put) goes to the Python function the engine hands in, the same code the
 * pure-Python hooks run. Built when a C compiler is there; without it the
 * Python closures are the hooks (the same records).
 *
 * Records are written exactly as the Python hooks write them (the fields
 * of metrics.engines.jax_state.CALL_FIELDS / TRANSFER_FIELDS appended to
 * the journal's list), and a failure while recording is handed to the
 * engine's on_error and swallowed: a hook never raises into the program.
 * tests/metrics/test_native_hooks.py compares both on one program.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* Python's time.monotonic_ns(), which the Python hooks read. */
static int64_t
monotonic_ns(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t = 0;
    (void)PyTime_MonotonicRaw(&t);
    return (int64_t)t;
#else
    return (int64_t)_PyTime_GetMonotonicClock();
#endif
}

static void hold_or_clear(void);

/* The offset of an object slot (``__slots__`` member) named ``name`` on
   ``obj``'s type, or -1: read in place, without an attribute lookup. */
static Py_ssize_t
slot_offset(PyObject *obj, const char *name)
{
    PyObject *d = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), name);
    Py_ssize_t off = -1;
    if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if ((m->type == T_OBJECT_EX || m->type == T_OBJECT) && !(m->flags & READONLY))
            off = m->offset;
    }
    Py_XDECREF(d);
    PyErr_Clear();
    return off;
}

/* A new reference to obj's slot at off (or its attribute name), NULL with
   no exception set when unset or failing. */
static PyObject *
read_slot(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + off);
        Py_XINCREF(v);
        return v;
    }
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        hold_or_clear();
    return v;
}

static int
slot_true(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    PyObject *v = read_slot(obj, off, name);
    if (v == NULL)
        return 0;
    int t = v == Py_True ? 1 : v == Py_False || v == Py_None ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t < 0) {
        hold_or_clear();
        return 0;
    }
    return t;
}

/* compiles < 2 (1 when unknown: the keyed path then runs, which is exact). */
static int
one_graph(PyObject *obj, Py_ssize_t off, PyObject *name)
{
    PyObject *v = read_slot(obj, off, name);
    if (v == NULL)
        return 0;
    long c = PyLong_Check(v) ? PyLong_AsLong(v) : 2;
    Py_DECREF(v);
    if (c == -1 && PyErr_Occurred()) {
        hold_or_clear();
        return 0;
    }
    return c < 2;
}

static PyObject *str_active, *str_calls_queue, *str_calls, *str_flush, *str_numpy_args,
    *str_nested_numpy, *str_compiles, *str_explicit_device_put, *str_nbytes, *str_npy_value;

/* A KeyboardInterrupt, SystemExit or other exception that is not an
   Exception, raised inside the hook's Python helper, held until the hooked
   call returns and raised from it there (raise_held), as the Python hooks,
   which catch Exception only, let it through. A SIGTERM handler's SystemExit
   lands in a helper whenever the signal arrived while the engine ran (the
   helper is the next Python code the thread runs): swallowed, the program
   went on training without its exporter. Per thread: a helper runs on the
   thread of the call it serves. */
static _Thread_local PyObject *held_type = NULL, *held_value = NULL, *held_tb = NULL;

/* Clears the pending exception, or holds it for raise_held when it is not
   an Exception, or is ``own`` (an exception on_error raised again: the
   program's), and none is held yet (the first one wins, as in Python). */
static void
hold_or_clear_unless(PyObject *own)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type != NULL && held_type == NULL) {
        PyErr_NormalizeException(&type, &value, &tb);
        if (value == own || !PyErr_GivenExceptionMatches(type, PyExc_Exception)) {
            held_type = type;
            held_value = value;
            held_tb = tb;
            return;
        }
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

static void
hold_or_clear(void)
{
    hold_or_clear_unless(NULL);
}

/* Calls on_error(exception) with the pending exception and clears it; one
   that is not an Exception is held for raise_held instead (so is one raised
   inside on_error itself: a signal handler can run there too), and so is
   the exception itself when on_error raises it again (a signal handler's). */
static void
hand_over_error(PyObject *on_error)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL)
        return;
    PyErr_NormalizeException(&type, &value, &tb);
    if (!PyErr_GivenExceptionMatches(type, PyExc_Exception) || on_error == NULL ||
        value == NULL) {
        PyErr_Restore(type, value, tb);
        hold_or_clear();
        return;
    }
    PyObject *r = PyObject_CallOneArg(on_error, value);
    if (r == NULL) /* raising the very error it was given: a signal handler's */
        hold_or_clear_unless(value);
    Py_XDECREF(r);
    Py_DECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* What a hooked call returns: ``out``, or NULL with the held exception
   raised (``out`` dropped) when a helper raised one during the call. */
static PyObject *
raise_held(PyObject *out)
{
    if (held_type == NULL)
        return out;
    Py_XDECREF(out);
    PyErr_Restore(held_type, held_value, held_tb);
    held_type = held_value = held_tb = NULL;
    return NULL;
}

static PyObject *
args_tuple(PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *t = PyTuple_New(nargs);
    if (t == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(t, i, args[i]);
    }
    return t;
}

/* Appends n fields to a journal list; -1 on failure. */
static int
append_fields(PyObject *queue, PyObject **fields, int n)
{
    for (int i = 0; i < n; i++)
        if (PyList_Append(queue, fields[i]) < 0)
            return -1;
    return 0;
}

/* Counting ---------------------------------------------------------------- */

/* The owner of the counted call running on this thread (borrowed: its
   Counting holds it), for a numpy shard handler under it: with no Python
   frame of the wrapper there, this is how the frame walk knows a numpy
   argument is the call's (metrics.engines.jax_transfers). */
static _Thread_local PyObject *calling_owner = NULL;

static PyObject *
calling(PyObject *module, PyObject *unused)
{
    return Py_NewRef(calling_owner != NULL ? calling_owner : Py_None);
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn;       /* the jitted function */
    PyObject *owner;    /* its jax_calls.Owner */
    PyObject *state;    /* jax_state's module dict ("active" is read per call) */
    PyObject *seqs;     /* jax_state.compile_seq: a one-item list */
    PyObject *timed;    /* Python: a timed call with numpy arguments, with fn's arguments */
    PyObject *report;   /* Python: report(eng, owner, args) of numpy arguments */
    PyObject *keyed;    /* Python: keyed(eng, owner, args, seq, start, end) off one graph */
    PyObject *on_error; /* Python: on_error(exception) */
    PyObject *ndarray;  /* numpy.ndarray (a type nothing is when there is no numpy) */
    PyObject *eng;      /* the engine whose calls_queue and calls.flush are cached */
    PyObject *queue;
    PyObject *flush;
    PyObject *dict;
    PyObject *weaklist;
    Py_ssize_t untimed; /* calls left to count untimed before the next timed one */
    Py_ssize_t first;   /* timed calls left before sampling starts */
    Py_ssize_t every;
    Py_ssize_t fold_at; /* fields waiting before a timed call flushes the journal */
    Py_ssize_t off_numpy, off_nested, off_compiles; /* the owner's slots, or -1 */
} Counting;

/* The engine's calls journal (list and flush), cached per engine; -1 on failure. */
static int
counting_journal(Counting *self, PyObject *eng)
{
    if (eng == self->eng)
        return 0;
    PyObject *q = PyObject_GetAttr(eng, str_calls_queue);
    PyObject *calls = q != NULL ? PyObject_GetAttr(eng, str_calls) : NULL;
    PyObject *flush = calls != NULL ? PyObject_GetAttr(calls, str_flush) : NULL;
    Py_XDECREF(calls);
    if (flush == NULL || !PyList_CheckExact(q)) {
        Py_XDECREF(q);
        Py_XDECREF(flush);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the engine's calls_queue is not a list");
        return -1;
    }
    Py_INCREF(eng);
    Py_XSETREF(self->eng, eng);
    Py_XSETREF(self->queue, q);
    Py_XSETREF(self->flush, flush);
    return 0;
}

/* Whether this call goes to Python's timed call: the function takes numpy
   (JitArguments reports them; a numpy shard handler under it finds its
   frame), or a top-level argument is numpy now. */
static int
counting_numpy(Counting *self, PyObject *const *args, Py_ssize_t nargs, int timed)
{
    if (slot_true(self->owner, self->off_numpy, str_numpy_args))
        return 1;
    if (timed && slot_true(self->owner, self->off_nested, str_nested_numpy))
        return 1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        if ((PyObject *)Py_TYPE(args[i]) == self->ndarray)
            return 1;
    return 0;
}

/* One call's record: (owner, None, start, end, None) in the journal when it
   ran the function's one graph, else the keyed record (Python). */
static void
counting_record(Counting *self, PyObject *eng, PyObject *const *args, Py_ssize_t nargs,
                PyObject *seq, int64_t start, int64_t end)
{
    PyObject *now = PyList_GET_ITEM(self->seqs, 0);
    int same = now == seq || PyObject_RichCompareBool(now, seq, Py_EQ) == 1;
    if (PyErr_Occurred())
        hold_or_clear();
    if (same && one_graph(self->owner, self->off_compiles, str_compiles)) {
        /* The usual call: nothing compiled, one graph: no key. */
        if (counting_journal(self, eng) < 0) {
            hand_over_error(self->on_error);
            return;
        }
        PyObject *s = PyLong_FromLongLong(start), *e = PyLong_FromLongLong(end);
        PyObject *fields[5] = {self->owner, Py_None, s, e, Py_None}; /* jax_state.CALL_FIELDS */
        if (s == NULL || e == NULL || append_fields(self->queue, fields, 5) < 0)
            hand_over_error(self->on_error);
        Py_XDECREF(s);
        Py_XDECREF(e);
        if (end && PyList_GET_SIZE(self->queue) >= self->fold_at) {
            /* checked on timed calls: at most every - 1 over */
            PyObject *r = PyObject_CallNoArgs(self->flush);
            if (r == NULL)
                hand_over_error(self->on_error);
            Py_XDECREF(r);
        }
        return;
    }
    PyObject *t = args_tuple(args, nargs);
    PyObject *s = PyLong_FromLongLong(start), *e = PyLong_FromLongLong(end);
    PyObject *r = t && s && e ? PyObject_CallFunctionObjArgs(self->keyed, eng, self->owner, t,
                                                             seq, s, e, NULL)
                              : NULL;
    if (r == NULL)
        hand_over_error(self->on_error);
    Py_XDECREF(r);
    Py_XDECREF(t);
    Py_XDECREF(s);
    Py_XDECREF(e);
}

static PyObject *
counting_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Counting *self = (Counting *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *eng = PyDict_GetItemWithError(self->state, str_active); /* borrowed */
    if (eng == NULL || eng == Py_None) {
        if (PyErr_Occurred())
            hold_or_clear();
        return raise_held(PyObject_Vectorcall(self->fn, args, nargsf, kwnames));
    }
    int timed = self->untimed <= 0;
    if (timed) {
        if (self->first > 0)
            self->first--;
        else
            self->untimed = self->every - 1;
        if (counting_numpy(self, args, nargs, 1))
            return raise_held(PyObject_Vectorcall(self->timed, args, nargsf, kwnames));
    }
    else {
        if (!slot_true(self->owner, self->off_numpy, str_numpy_args)) {
            /* A first numpy argument: the timed call learns of it. */
            for (Py_ssize_t i = 0; i < nargs; i++)
                if ((PyObject *)Py_TYPE(args[i]) == self->ndarray)
                    return raise_held(PyObject_Vectorcall(self->timed, args, nargsf, kwnames));
        }
        else { /* it takes numpy (JitArguments): each call's counted */
            PyObject *t = args_tuple(args, nargs);
            PyObject *r = t ? PyObject_CallFunctionObjArgs(self->report, eng, self->owner, t,
                                                           NULL)
                            : NULL;
            Py_XDECREF(t);
            if (r == NULL)
                hand_over_error(self->on_error);
            Py_XDECREF(r);
            if (held_type != NULL) /* raised before the call, as in Python */
                return raise_held(NULL);
        }
        /* Counted, not timed. (A race between threads on this countdown
           only moves which call is timed.) */
        self->untimed--;
    }
    Py_INCREF(eng);
    PyObject *seq = PyList_GET_ITEM(self->seqs, 0);
    Py_INCREF(seq);
    PyObject *outer = calling_owner;
    calling_owner = self->owner;
    int64_t start = timed ? monotonic_ns() : 0;
    PyObject *out = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    int64_t end = timed ? monotonic_ns() : 0; /* end 0: untimed */
    calling_owner = outer;
    if (out != NULL)
        counting_record(self, eng, args, nargs, seq, start, end);
    Py_DECREF(seq);
    Py_DECREF(eng);
    return raise_held(out);
}

static PyObject *
counting_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fn", "owner", "state", "timed", "report", "keyed", "on_error",
                             "every", "first", "ndarray", "fold_at", NULL};
    PyObject *fn, *owner, *state, *timed, *report, *keyed, *on_error, *ndarray;
    Py_ssize_t every, first, fold_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OOOOnnOn", kwlist, &fn, &owner,
                                     &PyDict_Type, &state, &timed, &report, &keyed, &on_error,
                                     &every, &first, &ndarray, &fold_at))
        return NULL;
    PyObject *seqs = PyDict_GetItemString(state, "compile_seq");
    if (seqs == NULL || !PyList_CheckExact(seqs) || PyList_GET_SIZE(seqs) < 1) {
        PyErr_SetString(PyExc_TypeError, "state['compile_seq'] must be a one-item list");
        return NULL;
    }
    Counting *self = (Counting *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = counting_vectorcall;
    self->fn = Py_NewRef(fn);
    self->owner = Py_NewRef(owner);
    self->state = Py_NewRef(state);
    self->seqs = Py_NewRef(seqs);
    self->timed = Py_NewRef(timed);
    self->report = Py_NewRef(report);
    self->keyed = Py_NewRef(keyed);
    self->on_error = Py_NewRef(on_error);
    self->ndarray = Py_NewRef(ndarray);
    self->every = every > 0 ? every : 1;
    self->first = first;
    self->fold_at = fold_at;
    self->untimed = 0;
    self->off_numpy = slot_offset(owner, "numpy_args");
    self->off_nested = slot_offset(owner, "nested_numpy");
    self->off_compiles = slot_offset(owner, "compiles");
    return (PyObject *)self;
}

/* Every object field of a Counting, for the collector (traverse, clear). */
#define COUNTING_FIELDS(X) \
    X(fn) X(owner) X(state) X(seqs) X(timed) X(report) X(keyed) X(on_error) X(ndarray) \
    X(eng) X(queue) X(flush) X(dict)
#define VISIT_FIELD(f) Py_VISIT(self->f);
#define CLEAR_FIELD(f) Py_CLEAR(self->f);
/* A type's tp_traverse and tp_clear (prefix_traverse, prefix_clear) from
   the X-macro list of its object fields. */
#define GC_METHODS(prefix, Type, FIELDS)                                       \
    static int prefix##_traverse(Type *self, visitproc visit, void *arg)       \
    {                                                                          \
        FIELDS(VISIT_FIELD)                                                    \
        return 0;                                                              \
    }                                                                          \
    static int prefix##_clear(Type *self)                                      \
    {                                                                          \
        FIELDS(CLEAR_FIELD)                                                    \
        return 0;                                                              \
    }

GC_METHODS(counting, Counting, COUNTING_FIELDS)

static void
counting_dealloc(Counting *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weaklist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    counting_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A counted jitted function kept as a class attribute binds like a function. */
static PyObject *
counting_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyMemberDef counting_members[] = {
    {"untimed", T_PYSSIZET, offsetof(Counting, untimed), 0,
     "calls left to count untimed before the next timed one"},
    {"first", T_PYSSIZET, offsetof(Counting, first), 0,
     "timed calls left before sampling starts"},
    {"every", T_PYSSIZET, offsetof(Counting, every), READONLY, "one call in this many is timed"},
    {"_owner", T_OBJECT, offsetof(Counting, owner), READONLY, "the jax_calls.Owner"},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(Counting, weaklist), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(Counting, dict), READONLY},
    {NULL}};

/* The __dict__ of every type here that keeps one (functools.wraps,
   __wrapped__, what a jitted function carries). */
static PyGetSetDef dict_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}};

static PyTypeObject CountingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metrics.recording._native.Counting",
    .tp_doc = PyDoc_STR("Counting(fn, owner, state, timed, report, keyed, on_error, every, "
                        "first, ndarray, fold_at): a jitted function whose calls are counted "
                        "here; calls with numpy arguments in timed, the rest in report/keyed."),
    .tp_basicsize = sizeof(Counting),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = counting_new,
    .tp_traverse = (traverseproc)counting_traverse,
    .tp_clear = (inquiry)counting_clear,
    .tp_dealloc = (destructor)counting_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Counting, vectorcall),
    .tp_descr_get = counting_descr_get,
    .tp_members = counting_members,
    .tp_getset = dict_getset,
    .tp_dictoffset = offsetof(Counting, dict),
    .tp_weaklistoffset = offsetof(Counting, weaklist),
};

/* ExplicitScope ------------------------------------------------------------ */

/* How many ExplicitScope calls run on this thread now: JAX's own
   explicit_device_put state is set for as long as they run. */
static _Thread_local long explicit_depth = 0;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fn; /* jax.device_put */
    PyObject *dict;
    PyObject *weaklist;
} ExplicitScope;

static PyObject *
scope_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    explicit_depth++;
    PyObject *out = PyObject_Vectorcall(((ExplicitScope *)op)->fn, args, nargsf, kwnames);
    explicit_depth--;
    return out;
}

static PyObject *
scope_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fn", NULL};
    PyObject *fn;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &fn))
        return NULL;
    ExplicitScope *self = (ExplicitScope *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = scope_vectorcall;
    self->fn = Py_NewRef(fn);
    return (PyObject *)self;
}

#define SCOPE_FIELDS(X) X(fn) X(dict)
GC_METHODS(scope, ExplicitScope, SCOPE_FIELDS)

static void
scope_dealloc(ExplicitScope *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weaklist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    scope_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef scope_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ExplicitScope, weaklist), READONLY},
    {"__dictoffset__", T_PYSSIZET, offsetof(ExplicitScope, dict), READONLY},
    {NULL}};

static PyTypeObject ExplicitScopeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metrics.recording._native.ExplicitScope",
    .tp_doc = PyDoc_STR("ExplicitScope(fn): fn (jax.device_put) called with this thread "
                        "marked as inside an explicit put, which ShardPut reads instead "
                        "of JAX's transfer state."),
    .tp_basicsize = sizeof(ExplicitScope),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = scope_new,
    .tp_traverse = (traverseproc)scope_traverse,
    .tp_clear = (inquiry)scope_clear,
    .tp_dealloc = (destructor)scope_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ExplicitScope, vectorcall),
    .tp_members = scope_members,
    .tp_getset = dict_getset,
    .tp_dictoffset = offsetof(ExplicitScope, dict),
    .tp_weaklistoffset = offsetof(ExplicitScope, weaklist),
};

/* ShardPut ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *original; /* JAX's numpy shard handler (xs, shardings, layouts, copy_semantics) */
    PyObject *state_fn; /* JAX's guard_lib.thread_local_state */
    PyObject *queue;    /* the explicit transfers' journal list */
    PyObject *flush;    /* its flush */
    PyObject *timed;    /* Python: the handler, for a call off the usual shape or path */
    PyObject *other;    /* Python: other(xs, start, end), a timed call that is no explicit put */
    PyObject *bytes_of; /* Python: bytes of xs other than one array */
    PyObject *ndarray;  /* numpy.ndarray when its layout checked out (array_nbytes), or None */
    PyObject *descr;    /* the dtype last seen, and its itemsize */
    Py_ssize_t itemsize;
    PyObject *last_nbytes; /* the last array's byte count (an int), and its value */
    Py_ssize_t last_n;
    PyObject *on_error;
    PyObject *dict;
    Py_ssize_t untimed; /* explicit puts left to count untimed before the next timed one */
    Py_ssize_t first;   /* timed puts left before sampling starts */
    Py_ssize_t every;
    Py_ssize_t fold_at;
} ShardPut;

/* Whether JAX's transfer state says a jax.device_put is sharding now: 1,
   0, or -1 with an exception set. Inside the ExplicitScope of
   jax.device_put that is known without asking JAX (two calls into jaxlib,
   the costliest part of a put's count); a put through a reference to JAX's
   own device_put (taken before install) is asked. */
static int
explicit_put(ShardPut *self)
{
    if (explicit_depth > 0)
        return 1;
    PyObject *st = PyObject_CallNoArgs(self->state_fn);
    if (st == NULL)
        return -1;
    PyObject *e = PyObject_GetAttr(st, str_explicit_device_put); /* set before device_put shards */
    Py_DECREF(st);
    if (e == NULL)
        return -1;
    int explicit = e == Py_True;
    Py_DECREF(e);
    return explicit;
}

/* The head of numpy's PyArrayObject_fields, the same since NumPy 1.7 (2.x
   too): what array_nbytes reads instead of looking up ``nbytes``. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions; /* npy_intp */
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
} ArrayHead;

/* x.nbytes read from the array's head when x is an ``ndarray`` or of a
   subclass of it (a subclass keeps the head: JAX's own TypedNdArray, what
   every numpy batch becomes before its shard handler sees it), itemsize from
   ``*descr``, cached while the dtype stays; else -1 (no exception set): then
   it is looked up. */
static Py_ssize_t
head_nbytes(PyObject *x, PyObject *ndarray, PyObject **descr, Py_ssize_t *itemsize)
{
    if (ndarray == NULL || ndarray == Py_None)
        return -1;
    if ((PyObject *)Py_TYPE(x) != ndarray &&
        !PyType_IsSubtype(Py_TYPE(x), (PyTypeObject *)ndarray))
        return -1;
    ArrayHead *a = (ArrayHead *)x;
    if (a->descr != *descr) {
        PyObject *v = PyObject_GetAttrString(a->descr, "itemsize");
        Py_ssize_t n = v != NULL ? PyLong_AsSsize_t(v) : -1;
        Py_XDECREF(v);
        if (n < 0) {
            PyErr_Clear();
            return -1;
        }
        Py_INCREF(a->descr); /* held, so its address means this dtype */
        Py_XSETREF(*descr, a->descr);
        *itemsize = n;
    }
    Py_ssize_t n = *itemsize;
    for (int i = 0; i < a->nd; i++)
        n *= a->dimensions[i];
    return n;
}

/* x.nbytes: from the array's head (head_nbytes), else looked up. */
static PyObject *
nbytes_of(PyObject *x, PyObject *ndarray, PyObject **descr, Py_ssize_t *itemsize)
{
    Py_ssize_t n = head_nbytes(x, ndarray, descr, itemsize);
    return n >= 0 ? PyLong_FromSsize_t(n) : PyObject_GetAttr(x, str_nbytes);
}

/* array_nbytes(x, ndarray): nbytes_of for Python, where the layout is checked
   against numpy's own nbytes before ShardPut is given ``ndarray``. */
static PyObject *
array_nbytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "array_nbytes(x, ndarray)");
        return NULL;
    }
    PyObject *descr = NULL;
    Py_ssize_t itemsize = 0;
    PyObject *n = nbytes_of(args[0], args[1], &descr, &itemsize);
    Py_XDECREF(descr);
    return n;
}

/* One explicit put's record (to_device, start, end, bytes); end 0: untimed. */
static void
shardput_record(ShardPut *self, PyObject *xs, int64_t start, int64_t end)
{
    PyObject *nbytes;
    if (PyList_CheckExact(xs) && PyList_GET_SIZE(xs) == 1) {
        PyObject *x = PyList_GET_ITEM(xs, 0);
        Py_ssize_t n = head_nbytes(x, self->ndarray, &self->descr, &self->itemsize);
        if (n < 0)
            nbytes = PyObject_GetAttr(x, str_nbytes);
        else if (n == self->last_n && self->last_nbytes != NULL)
            /* A batch the size of the last one: its int again (no allocation) */
            nbytes = Py_NewRef(self->last_nbytes);
        else if ((nbytes = PyLong_FromSsize_t(n)) != NULL) {
            Py_XSETREF(self->last_nbytes, Py_NewRef(nbytes));
            self->last_n = n;
        }
    }
    else
        nbytes = PyObject_CallOneArg(self->bytes_of, xs);
    PyObject *s = nbytes ? PyLong_FromLongLong(start) : NULL;
    PyObject *e = s ? PyLong_FromLongLong(end) : NULL;
    PyObject *fields[4] = {Py_True, s, e, nbytes}; /* jax_state.TRANSFER_FIELDS */
    if (e == NULL || append_fields(self->queue, fields, 4) < 0)
        hand_over_error(self->on_error);
    Py_XDECREF(nbytes);
    Py_XDECREF(s);
    Py_XDECREF(e);
    if (end && PyList_GET_SIZE(self->queue) >= self->fold_at) {
        /* checked on timed puts: at most every - 1 over */
        PyObject *r = PyObject_CallNoArgs(self->flush);
        if (r == NULL)
            hand_over_error(self->on_error);
        Py_XDECREF(r);
    }
}

static PyObject *
shardput_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    ShardPut *self = (ShardPut *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || kwnames != NULL) /* not JAX's call: the Python handler */
        return raise_held(PyObject_Vectorcall(self->timed, args, nargsf, kwnames));
    if (self->untimed > 0) {
        int explicit = explicit_put(self);
        if (explicit != 1) {
            hold_or_clear(); /* the timed path counts a failure */
            return raise_held(PyObject_Vectorcall(self->timed, args, nargsf, kwnames));
        }
        /* Counted with its bytes, not timed (metrics.recording.sampling). */
        self->untimed--;
        PyObject *out = PyObject_Vectorcall(self->original, args, nargs, NULL);
        if (out != NULL)
            shardput_record(self, args[0], 0, 0);
        return raise_held(out);
    }
    int64_t start = monotonic_ns();
    PyObject *out = PyObject_Vectorcall(self->original, args, nargs, NULL);
    int64_t end = monotonic_ns();
    if (out == NULL)
        return NULL;
    int explicit = explicit_put(self);
    if (explicit < 0) {
        hand_over_error(self->on_error);
    }
    else if (explicit) {
        if (self->first > 0)
            self->first--;
        else
            self->untimed = self->every - 1;
        shardput_record(self, args[0], start, end);
    }
    else { /* anything else the handler shards: an implicit transfer (Python) */
        PyObject *s = PyLong_FromLongLong(start), *e = PyLong_FromLongLong(end);
        PyObject *r = s && e ? PyObject_CallFunctionObjArgs(self->other, args[0], s, e, NULL)
                             : NULL;
        if (r == NULL)
            hand_over_error(self->on_error);
        Py_XDECREF(r);
        Py_XDECREF(s);
        Py_XDECREF(e);
    }
    return raise_held(out);
}

static PyObject *
shardput_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"original", "state_fn", "queue", "flush", "timed", "other",
                             "bytes_of", "on_error", "fold_at", "first", "every", "ndarray",
                             NULL};
    PyObject *original, *state_fn, *queue, *flush, *timed, *other, *bytes_of, *on_error;
    PyObject *ndarray = Py_None;
    Py_ssize_t fold_at, first, every;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OOOOOnnn|O", kwlist, &original,
                                     &state_fn, &PyList_Type, &queue, &flush, &timed, &other,
                                     &bytes_of, &on_error, &fold_at, &first, &every, &ndarray))
        return NULL;
    ShardPut *self = (ShardPut *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = shardput_vectorcall;
    self->original = Py_NewRef(original);
    self->state_fn = Py_NewRef(state_fn);
    self->queue = Py_NewRef(queue);
    self->flush = Py_NewRef(flush);
    self->timed = Py_NewRef(timed);
    self->other = Py_NewRef(other);
    self->ndarray = Py_NewRef(ndarray);
    self->bytes_of = Py_NewRef(bytes_of);
    self->on_error = Py_NewRef(on_error);
    self->fold_at = fold_at;
    self->first = first;
    self->every = every > 0 ? every : 1;
    self->untimed = 0;
    return (PyObject *)self;
}

/* Every object field of a ShardPut, for the collector (traverse, clear). */
#define SHARDPUT_FIELDS(X) \
    X(original) X(state_fn) X(queue) X(flush) X(timed) X(other) X(ndarray) X(descr) \
    X(last_nbytes) \
    X(bytes_of) X(on_error) X(dict)

GC_METHODS(shardput, ShardPut, SHARDPUT_FIELDS)

static void
shardput_dealloc(ShardPut *self)
{
    PyObject_GC_UnTrack(self);
    shardput_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef shardput_members[] = {
    {"untimed", T_PYSSIZET, offsetof(ShardPut, untimed), 0,
     "explicit puts left to count untimed before the next timed one"},
    {"first", T_PYSSIZET, offsetof(ShardPut, first), 0,
     "timed puts left before sampling starts"},
    {"__dictoffset__", T_PYSSIZET, offsetof(ShardPut, dict), READONLY},
    {NULL}};

static PyTypeObject ShardPutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metrics.recording._native.ShardPut",
    .tp_doc = PyDoc_STR("ShardPut(original, state_fn, queue, flush, timed, other, bytes_of, "
                        "on_error, fold_at, first, every, ndarray=None): JAX's numpy shard handler, its "
                        "explicit device_puts counted here, the rest in timed/other."),
    .tp_basicsize = sizeof(ShardPut),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = shardput_new,
    .tp_traverse = (traverseproc)shardput_traverse,
    .tp_clear = (inquiry)shardput_clear,
    .tp_dealloc = (destructor)shardput_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(ShardPut, vectorcall),
    .tp_members = shardput_members,
    .tp_getset = dict_getset,
    .tp_dictoffset = offsetof(ShardPut, dict),
};

/* SyncValue --------------------------------------------------------------- */

/* The getter of jax.Array's ``_value`` (a device->host sync: float(x),
   print(x), np.asarray(x), ...) counted, as the Python getter of
   metrics.engines.jax_transfers._value_property does: a read with the host
   copy cached moves nothing; the usual read (a library function that names
   the path, called from a line of the user's) is recorded here with two
   code lookups; anything else goes to the Python ``record`` (the frame
   walk). */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *fget;     /* JAX's own getter */
    PyObject *codes;    /* id(code) -> class, or the str a library function names */
    PyObject *queue;    /* the transfers journal's list (jax_transfers.FIELDS a record) */
    PyObject *flush;
    PyObject *record;   /* Python: record(kind, frame, start, end, nbytes) */
    PyObject *user;     /* the class of the user's code (jax_transfers._USER) */
    PyObject *kind;     /* the record's kind (jax_sites.SYNC) */
    PyObject *ndarray;  /* numpy.ndarray when its layout checked out, or None */
    PyObject *descr;    /* the dtype last seen, and its itemsize (head_nbytes) */
    Py_ssize_t itemsize;
    PyObject *on_error;
    PyObject *dict;
    Py_ssize_t fold_at;
} SyncValue;

/* codes[id(code)] (borrowed), or NULL with no exception set. */
static PyObject *
code_class(PyObject *codes, PyObject *code)
{
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *c = PyDict_GetItemWithError(codes, key);
    Py_DECREF(key);
    if (c == NULL)
        PyErr_Clear();
    return c;
}

/* The usual read's record, appended: 1; 0 when it is not the usual read
   (the walk decides); -1 with an exception set. */
static int
syncvalue_usual(SyncValue *self, PyFrameObject *f, PyObject *out, int64_t start, int64_t end)
{
    PyCodeObject *code = PyFrame_GetCode(f);
    PyObject *detail = code_class(self->codes, (PyObject *)code);
    Py_DECREF(code);
    if (detail == NULL || !PyUnicode_CheckExact(detail))
        return 0;
    Py_INCREF(detail);
    PyFrameObject *user = PyFrame_GetBack(f);
    PyCodeObject *ucode = user != NULL ? PyFrame_GetCode(user) : NULL;
    PyObject *c = ucode != NULL ? code_class(self->codes, (PyObject *)ucode) : NULL;
    int usual = c != NULL && (c == self->user || (PyLong_CheckExact(c) &&
                                                   PyObject_RichCompareBool(c, self->user,
                                                                            Py_EQ) == 1));
    int done = 0;
    if (usual) {
#if PY_VERSION_HEX >= 0x030B0000
        PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(user));
#else
        PyObject *lasti = PyObject_GetAttrString((PyObject *)user, "f_lasti");
#endif
        Py_ssize_t n = head_nbytes(out, self->ndarray, &self->descr, &self->itemsize);
        PyObject *nbytes = n >= 0 ? PyLong_FromSsize_t(n) : PyObject_GetAttr(out, str_nbytes);
        PyObject *s = PyLong_FromLongLong(start), *e = PyLong_FromLongLong(end);
        /* jax_transfers: (kind, code, f_lasti, detail, start, end, nbytes) */
        PyObject *fields[7] = {self->kind, (PyObject *)ucode, lasti, detail, s, e, nbytes};
        done = lasti && nbytes && s && e ? append_fields(self->queue, fields, 7) : -1;
        Py_XDECREF(lasti);
        Py_XDECREF(nbytes);
        Py_XDECREF(s);
        Py_XDECREF(e);
        if (done == 0) {
            done = 1;
            if (PyList_GET_SIZE(self->queue) >= self->fold_at) {
                PyObject *r = PyObject_CallNoArgs(self->flush);
                done = r != NULL ? 1 : -1;
                Py_XDECREF(r);
            }
        }
    }
    if (PyErr_Occurred() && done >= 0)
        hold_or_clear();
    Py_XDECREF(ucode);
    Py_XDECREF(user);
    Py_DECREF(detail);
    return done;
}

static PyObject *
syncvalue_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SyncValue *self = (SyncValue *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || kwnames != NULL)
        return raise_held(PyObject_Vectorcall(self->fget, args, nargsf, kwnames));
    PyObject *cached = PyObject_GetAttr(args[0], str_npy_value);
    if (cached == NULL)
        hold_or_clear(); /* JAX's getter says what is wrong */
    else if (cached != Py_None) { /* the host copy is cached: nothing moves */
        Py_DECREF(cached);
        return raise_held(PyObject_Vectorcall(self->fget, args, 1, NULL));
    }
    Py_XDECREF(cached);
    int64_t start = monotonic_ns();
    PyObject *out = PyObject_Vectorcall(self->fget, args, 1, NULL);
    int64_t end = monotonic_ns();
    if (out == NULL)
        return NULL;
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed: the frame that read _value */
    int done = f != NULL ? syncvalue_usual(self, f, out, start, end) : 0;
    if (done == 0) {
        PyObject *n = PyObject_GetAttr(out, str_nbytes);
        PyObject *s = n ? PyLong_FromLongLong(start) : NULL;
        PyObject *e = s ? PyLong_FromLongLong(end) : NULL;
        PyObject *r = e ? PyObject_CallFunctionObjArgs(self->record, self->kind,
                                                       f != NULL ? (PyObject *)f : Py_None,
                                                       s, e, n, NULL)
                        : NULL;
        done = r != NULL ? 1 : -1;
        Py_XDECREF(r);
        Py_XDECREF(n);
        Py_XDECREF(s);
        Py_XDECREF(e);
    }
    if (done < 0)
        hand_over_error(self->on_error);
    return raise_held(out);
}

static PyObject *
syncvalue_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fget", "codes", "queue", "flush", "record", "user", "kind",
                             "on_error", "fold_at", "ndarray", NULL};
    PyObject *fget, *codes, *queue, *flush, *record, *user, *kind, *on_error;
    PyObject *ndarray = Py_None;
    Py_ssize_t fold_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!O!OOOOOn|O", kwlist, &fget, &PyDict_Type,
                                     &codes, &PyList_Type, &queue, &flush, &record, &user,
                                     &kind, &on_error, &fold_at, &ndarray))
        return NULL;
    SyncValue *self = (SyncValue *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = syncvalue_vectorcall;
    self->fget = Py_NewRef(fget);
    self->codes = Py_NewRef(codes);
    self->queue = Py_NewRef(queue);
    self->flush = Py_NewRef(flush);
    self->record = Py_NewRef(record);
    self->user = Py_NewRef(user);
    self->kind = Py_NewRef(kind);
    self->on_error = Py_NewRef(on_error);
    self->ndarray = Py_NewRef(ndarray);
    self->fold_at = fold_at;
    return (PyObject *)self;
}

#define SYNCVALUE_FIELDS(X) \
    X(fget) X(codes) X(queue) X(flush) X(record) X(user) X(kind) X(ndarray) X(descr) \
    X(on_error) X(dict)

GC_METHODS(syncvalue, SyncValue, SYNCVALUE_FIELDS)

static void
syncvalue_dealloc(SyncValue *self)
{
    PyObject_GC_UnTrack(self);
    syncvalue_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef syncvalue_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(SyncValue, dict), READONLY},
    {NULL}};

static PyTypeObject SyncValueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metrics.recording._native.SyncValue",
    .tp_doc = PyDoc_STR("SyncValue(fget, codes, queue, flush, record, user, kind, on_error, "
                        "fold_at, ndarray=None): jax.Array._value's getter, its "
                        "device->host syncs counted."),
    .tp_basicsize = sizeof(SyncValue),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = syncvalue_new,
    .tp_traverse = (traverseproc)syncvalue_traverse,
    .tp_clear = (inquiry)syncvalue_clear,
    .tp_dealloc = (destructor)syncvalue_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SyncValue, vectorcall),
    .tp_members = syncvalue_members,
    .tp_getset = dict_getset,
    .tp_dictoffset = offsetof(SyncValue, dict),
};

/* StepMarker -------------------------------------------------------------- */

/* A recorder's mark_step(): the clock read appended to its steps journal
   (folded there when fold_at are waiting), as
   metrics.recording.recorder.Recorder.mark_step does in Python. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *queue;
    PyObject *flush;
    Py_ssize_t fold_at;
} StepMarker;

static PyObject *
marker_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    StepMarker *self = (StepMarker *)op;
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "mark_step() takes no arguments");
        return NULL;
    }
    PyObject *t = PyLong_FromLongLong(monotonic_ns());
    if (t == NULL || PyList_Append(self->queue, t) < 0) {
        Py_XDECREF(t);
        return NULL;
    }
    Py_DECREF(t);
    if (PyList_GET_SIZE(self->queue) >= self->fold_at)
        return PyObject_CallNoArgs(self->flush);
    Py_RETURN_NONE;
}

static PyObject *
marker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"queue", "flush", "fold_at", NULL};
    PyObject *queue, *flush;
    Py_ssize_t fold_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!On", kwlist, &PyList_Type, &queue, &flush,
                                     &fold_at))
        return NULL;
    StepMarker *self = (StepMarker *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = marker_vectorcall;
    self->queue = Py_NewRef(queue);
    self->flush = Py_NewRef(flush);
    self->fold_at = fold_at;
    return (PyObject *)self;
}

#define MARKER_FIELDS(X) X(queue) X(flush)
GC_METHODS(marker, StepMarker, MARKER_FIELDS)

static void
marker_dealloc(StepMarker *self)
{
    PyObject_GC_UnTrack(self);
    marker_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject StepMarkerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "metrics.recording._native.StepMarker",
    .tp_doc = PyDoc_STR("StepMarker(queue, flush, fold_at)(): one training step marked: "
                        "the monotonic clock appended to queue, flush() called when "
                        "fold_at are waiting."),
    .tp_basicsize = sizeof(StepMarker),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = marker_new,
    .tp_traverse = (traverseproc)marker_traverse,
    .tp_clear = (inquiry)marker_clear,
    .tp_dealloc = (destructor)marker_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StepMarker, vectorcall),
};

/* Module ------------------------------------------------------------------ */

static PyMethodDef native_methods[] = {
    {"array_nbytes", (PyCFunction)(void (*)(void))array_nbytes, METH_FASTCALL,
     "array_nbytes(x, ndarray) -> x.nbytes, read from the array's head when x is exactly "
     "ndarray."},
    {"calling", calling, METH_NOARGS,
     "calling() -> the Owner of the counted call running on this thread (in C), or None."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "metrics.recording._native",
    .m_doc = "The JAX hooks' usual calls in C (see metrics.recording.native).",
    .m_size = -1,
    .m_methods = native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(str_active, "active");
    INTERN(str_calls_queue, "calls_queue");
    INTERN(str_calls, "calls");
    INTERN(str_flush, "flush");
    INTERN(str_nested_numpy, "nested_numpy");
    INTERN(str_numpy_args, "numpy_args");
    INTERN(str_compiles, "compiles");
    INTERN(str_explicit_device_put, "explicit_device_put");
    INTERN(str_nbytes, "nbytes");
    INTERN(str_npy_value, "_npy_value");
#undef INTERN
    if (PyType_Ready(&CountingType) < 0 || PyType_Ready(&ShardPutType) < 0 ||
        PyType_Ready(&ExplicitScopeType) < 0 || PyType_Ready(&SyncValueType) < 0 ||
        PyType_Ready(&StepMarkerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Counting", (PyObject *)&CountingType) < 0 ||
        PyModule_AddObjectRef(m, "ShardPut", (PyObject *)&ShardPutType) < 0 ||
        PyModule_AddObjectRef(m, "ExplicitScope", (PyObject *)&ExplicitScopeType) < 0 ||
        PyModule_AddObjectRef(m, "SyncValue", (PyObject *)&SyncValueType) < 0 ||
        PyModule_AddObjectRef(m, "StepMarker", (PyObject *)&StepMarkerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
