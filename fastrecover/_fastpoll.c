/*
 * fastrecover._fastpoll: the steady state of Consumer.poll() in C.
 *
 * Why C: an application calls poll() once per record, and on this project's machine a Python
 * method of any kind in front of confluent_kafka's poll() costs 7 % of the plain consumer's CPU
 * per record (a frame and its argument handling), more than issue 9's budget of 5 %.  This file
 * holds no decision of its own: it repeats, branch for branch, the steady path of Consumer.poll in
 * fastrecover/steady.py (the Python function ``poll``), which stays the reference and the fallback when the
 * extension is not built.  Anything the fast path does not recognise goes to the Python function.
 *
 * Three types:
 *   FastState  the counters the fast path reads and writes, as C fields; SteadyGate (Python, the
 *              consumer's ``_gate``) inherits them, so its methods read and write them as ordinary
 *              attributes.
 *   FastPoll   a method descriptor put in Consumer's class dict as ``poll``; it binds like a
 *              function (super().poll, Consumer.poll(c, t) and bound methods all work).
 *   FastOffsets  the same kind of descriptor for ``commit`` and ``store_offsets``, which many
 *              applications call once per record too.  It takes no decision of its own either: it
 *              repeats the first test of Consumer.commit / Consumer.store_offsets (consumer.py), which
 *              hand a one-record call to confluent_kafka's own method while nothing of the mode's is
 *              on any partition, and gives every other call to them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* ---- FastState ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    Py_ssize_t fast_calls;       /* poll() calls the fast path may serve before the next tick */
    PyObject *fast_timeout;      /* the timeout object those calls must pass */
    PyObject *fast_wait;         /* and their wait on the primary */
    Py_ssize_t primary_messages; /* messages the primary returned (records and error events) */
    double next_tick;            /* time.monotonic() of the next tick */
    double joining_until;        /* until when the waits use the short slices of a join */
} FastState;

static int
state_traverse(FastState *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast_timeout);
    Py_VISIT(self->fast_wait);
    return 0;
}

static int
state_clear(FastState *self)
{
    Py_CLEAR(self->fast_timeout);
    Py_CLEAR(self->fast_wait);
    return 0;
}

static void
state_dealloc(FastState *self)
{
    PyObject_GC_UnTrack(self);
    state_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef state_members[] = {
    {"fast_calls", T_PYSSIZET, offsetof(FastState, fast_calls), 0, NULL},
    {"fast_timeout", T_OBJECT, offsetof(FastState, fast_timeout), 0, NULL},
    {"fast_wait", T_OBJECT, offsetof(FastState, fast_wait), 0, NULL},
    {"primary_messages", T_PYSSIZET, offsetof(FastState, primary_messages), 0, NULL},
    {"next_tick", T_DOUBLE, offsetof(FastState, next_tick), 0, NULL},
    {"joining_until", T_DOUBLE, offsetof(FastState, joining_until), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FastStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastrecover._fastpoll.FastState",
    .tp_doc = "The counters of Consumer.poll()'s steady path, shared by C and Python.",
    .tp_basicsize = sizeof(FastState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_dealloc = (destructor)state_dealloc,
    .tp_members = state_members,
};

/* ---- FastPoll ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *kafka_poll;  /* confluent_kafka.Consumer.poll (a method descriptor) */
    PyObject *slow;        /* the Python method: every call the fast path does not take */
    PyObject *slice;       /* IDLE_SLICE_S, a float */
    double slice_s;
    Py_ssize_t run;        /* FAST_CALLS: the calls one clock read covers */
    /* kafka_poll's C function and the type it belongs to, when it is the METH_VARARGS|METH_KEYWORDS
       method descriptor confluent_kafka defines: called directly, with a kept argument tuple for the
       usual wait (one slice), it saves the descriptor's checks and a tuple per record. */
    PyCFunctionWithKeywords kafka_meth;
    PyTypeObject *kafka_type;
    PyObject *slice_args;  /* (slice,) */
    PyObject *dict;        /* __doc__, __name__, __wrapped__ ... (functools.update_wrapper) */
} FastPoll;

static PyObject *str_gate;  /* "_gate": the consumer's SteadyGate */
static PyObject *str_fr;    /* "_fr": the consumer's mode, whose poll() takes the rest of a long wait */
static PyObject *str_poll;  /* "poll" */

/* time.monotonic(), for the refill below; 0 (never a refill) where the clock is not CLOCK_MONOTONIC. */
static double
monotonic_s(void)
{
#if defined(CLOCK_MONOTONIC) && !defined(_WIN32) && !defined(__APPLE__)
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0) {
        return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    }
#endif
    return 0.0;
}

/* The rest of a wait longer than one slice, for ParallelMode.poll: None or a negative timeout
   waits forever; otherwise what is left after the slice. */
static PyObject *
rest_of_wait(PyObject *timeout, double slice_s)
{
    double t;
    if (timeout == Py_None) {
        return Py_NewRef(timeout);
    }
    t = PyFloat_AsDouble(timeout);
    if (t == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (t < 0) {
        return Py_NewRef(timeout);
    }
    t -= slice_s;
    return PyFloat_FromDouble(t > 0.0 ? t : 0.0);
}

static PyObject *
fastpoll_vectorcall(FastPoll *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *consumer, *timeout, *gate, *wait, *msg, *call[2];
    FastState *st;

    if (kwnames != NULL || nargs < 1 || nargs > 2) {
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    }
    consumer = args[0];
    timeout = nargs == 2 ? args[1] : Py_None;
    gate = PyObject_GetAttr(consumer, str_gate);
    if (gate == NULL) {
        PyErr_Clear();
        return PyObject_Vectorcall(self->slow, args, nargsf, NULL);
    }
    if (!PyObject_TypeCheck(gate, &FastStateType) || ((FastState *)gate)->fast_calls <= 0) {
        Py_DECREF(gate);
        return PyObject_Vectorcall(self->slow, args, nargsf, NULL);
    }
    st = (FastState *)gate;
    if (timeout == st->fast_timeout && st->fast_wait != NULL) {
        wait = st->fast_wait;
    }
    else if (PyFloat_CheckExact(timeout) && PyFloat_AS_DOUBLE(timeout) > self->slice_s) {
        wait = self->slice;
    }
    else {
        Py_DECREF(gate);
        return PyObject_Vectorcall(self->slow, args, nargsf, NULL);
    }
    Py_INCREF(wait);
    if (--st->fast_calls == 0) {
        /* The run is used up.  The Python path would now read the clock and, with no tick due and no
           join under way, start a new run with the same timeout and wait: do that here.  Python code
           that wants the next call on its path sets fast_calls to 0 itself, which this never undoes. */
        double now = monotonic_s();
        if (now > 0.0 && now < st->next_tick && now >= st->joining_until) {
            st->fast_calls = self->run;
        }
    }
    call[0] = consumer;
    call[1] = wait;
    if (self->kafka_meth != NULL && PyObject_TypeCheck(consumer, self->kafka_type)) {
        PyObject *targs = wait == self->slice ? Py_NewRef(self->slice_args) : PyTuple_Pack(1, wait);
        if (targs == NULL) {
            msg = NULL;
        }
        else {
            msg = self->kafka_meth(consumer, targs, NULL);
            Py_DECREF(targs);
            if (msg == NULL && !PyErr_Occurred()) {
                PyErr_SetString(PyExc_SystemError, "confluent_kafka's poll() failed without an exception");
            }
        }
    }
    else {
        msg = PyObject_Vectorcall(self->kafka_poll, call, 2, NULL);
    }
    if (msg == Py_None) {
        st->fast_calls = 0; /* nothing came: the next call reads the clock (the tick) */
        if (wait != timeout) {
            PyObject *rest = rest_of_wait(timeout, self->slice_s);
            PyObject *mode = rest == NULL ? NULL : PyObject_GetAttr(consumer, str_fr);
            Py_DECREF(msg);
            msg = mode == NULL ? NULL : PyObject_CallMethodOneArg(mode, str_poll, rest);
            Py_XDECREF(mode);
            Py_XDECREF(rest);
        }
    }
    else if (msg != NULL) {
        st->primary_messages += 1;
    }
    Py_DECREF(wait);
    Py_DECREF(gate);
    return msg;
}

static PyObject *
fastpoll_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *kafka_poll, *slow, *slice;
    Py_ssize_t run;
    FastPoll *self;
    static char *kwlist[] = {"kafka_poll", "slow", "slice", "run", NULL};

    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OOO!n", kwlist, &kafka_poll, &slow, &PyFloat_Type, &slice, &run)) {
        return NULL;
    }
    if (run < 1) {
        PyErr_Format(PyExc_ValueError, "FastPoll: run must be at least 1, not %zd", run);
        return NULL;
    }
    if (!PyCallable_Check(kafka_poll) || !PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "FastPoll: kafka_poll and slow must be callable");
        return NULL;
    }
    self = (FastPoll *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)fastpoll_vectorcall;
    self->kafka_poll = Py_NewRef(kafka_poll);
    self->slow = Py_NewRef(slow);
    self->slice = Py_NewRef(slice);
    self->slice_s = PyFloat_AS_DOUBLE(slice);
    self->run = run;
    self->slice_args = PyTuple_Pack(1, slice);
    if (self->slice_args == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    if (Py_IS_TYPE(kafka_poll, &PyMethodDescr_Type)) {
        PyMethodDescrObject *d = (PyMethodDescrObject *)kafka_poll;
        if (d->d_method->ml_flags == (METH_VARARGS | METH_KEYWORDS)) {
            self->kafka_meth = (PyCFunctionWithKeywords)(void (*)(void))d->d_method->ml_meth;
            self->kafka_type = (PyTypeObject *)Py_NewRef(PyDescr_TYPE(d));
        }
    }
    return (PyObject *)self;
}

static int
fastpoll_traverse(FastPoll *self, visitproc visit, void *arg)
{
    Py_VISIT(self->kafka_poll);
    Py_VISIT(self->slow);
    Py_VISIT(self->slice);
    Py_VISIT(self->slice_args);
    Py_VISIT(self->kafka_type);
    Py_VISIT(self->dict);
    return 0;
}

static int
fastpoll_clear(FastPoll *self)
{
    Py_CLEAR(self->kafka_poll);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->slice);
    Py_CLEAR(self->slice_args);
    Py_CLEAR(self->kafka_type);
    self->kafka_meth = NULL;
    Py_CLEAR(self->dict);
    return 0;
}

static void
fastpoll_dealloc(FastPoll *self)
{
    PyObject_GC_UnTrack(self);
    fastpoll_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Binds like a function: Consumer.poll is the descriptor, consumer.poll a bound method. */
static PyObject *
fastpoll_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static PyMemberDef fastpoll_members[] = {
    {"slow", T_OBJECT, offsetof(FastPoll, slow), READONLY, "the Python method behind the fast path"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
fastpoll_direct(FastPoll *self, void *closure)
{
    return PyBool_FromLong(self->kafka_meth != NULL);
}

static PyGetSetDef fastpoll_getset[] = {
    {"direct", (getter)fastpoll_direct, NULL, "True when confluent_kafka's poll() is called as a C function", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastPollType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastrecover._fastpoll.FastPoll",
    .tp_doc = "Consumer.poll(): the steady state in C, everything else in the Python method `slow`.",
    .tp_basicsize = sizeof(FastPoll),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = fastpoll_new,
    .tp_traverse = (traverseproc)fastpoll_traverse,
    .tp_clear = (inquiry)fastpoll_clear,
    .tp_dealloc = (destructor)fastpoll_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastPoll, vectorcall),
    .tp_descr_get = fastpoll_get,
    .tp_dictoffset = offsetof(FastPoll, dict),
    .tp_members = fastpoll_members,
    .tp_getset = fastpoll_getset,
};

/* ---- FastOffsets ---------------------------------------------------------------------------- */

/* Which method a FastOffsets stands for: they differ in the keywords they take, and store_offsets
   also tests that the application stores offsets itself. */
enum { OFFSETS_COMMIT = 0, OFFSETS_STORE = 1 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *kafka;  /* confluent_kafka.Consumer.commit or .store_offsets (a method descriptor) */
    PyObject *slow;   /* the Python method: every call the fast path does not take */
    int kind;
    PyObject *dict;   /* __doc__, __name__, __wrapped__ ... (functools.update_wrapper) */
} FastOffsets;

static PyObject *str_partitions;   /* "partitions": the mode's Partitions */
static PyObject *str_owned;        /* "owned": the partitions with a range, a mirror or a floor */
static PyObject *str_auto_store;   /* "auto_store": enable.auto.offset.store as the application set it */
static PyObject *str_message;      /* "message" */
static PyObject *str_asynchronous; /* "asynchronous" */

static int
same_name(PyObject *name, PyObject *interned)
{
    return name == interned || (PyUnicode_Check(name) && PyUnicode_Compare(name, interned) == 0);
}

/* The truth of ``obj.name``: 1 or 0, and -1 (no exception left) when it cannot be read. */
static int
attr_truth(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    int truth;

    if (value == NULL) {
        PyErr_Clear();
        return -1;
    }
    truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    if (truth < 0) {
        PyErr_Clear();
    }
    return truth;
}

/* 1 when the Python method would hand this call to confluent_kafka's: a mode, with nothing of its
   own on any partition (and, for store_offsets, offsets stored by the application); else 0. */
static int
steady_offsets(FastOffsets *self, PyObject *consumer)
{
    PyObject *fr, *partitions;
    int fast = 0;

    fr = PyObject_GetAttr(consumer, str_fr);
    if (fr == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (fr != Py_None && (self->kind == OFFSETS_COMMIT || attr_truth(fr, str_auto_store) == 0)) {
        partitions = PyObject_GetAttr(fr, str_partitions);
        if (partitions == NULL) {
            PyErr_Clear();
        }
        else {
            fast = attr_truth(partitions, str_owned) == 0;
            Py_DECREF(partitions);
        }
    }
    Py_DECREF(fr);
    return fast;
}

static PyObject *
fastoffsets_vectorcall(FastOffsets *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), i, nkw;
    PyObject *message = NULL;

    /* One record: (consumer, message), or (consumer, message=m) and for commit also asynchronous=. */
    nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs == 2 && nkw == 0) {
        message = args[1];
    }
    else if (nargs == 1 && nkw >= 1 && nkw <= 2) {
        for (i = 0; i < nkw; i++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, i);
            if (same_name(name, str_message)) {
                message = args[1 + i];
            }
            else if (!(self->kind == OFFSETS_COMMIT && same_name(name, str_asynchronous))) {
                message = NULL; /* offsets=, or a keyword the Python method answers */
                break;
            }
        }
    }
    if (message == NULL || message == Py_None || !steady_offsets(self, args[0])) {
        return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
    }
    return PyObject_Vectorcall(self->kafka, args, nargsf, kwnames);
}

static PyObject *
fastoffsets_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *kafka, *slow;
    const char *kind;
    FastOffsets *self;
    static char *kwlist[] = {"kafka", "slow", "kind", NULL};

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOs", kwlist, &kafka, &slow, &kind)) {
        return NULL;
    }
    if (!PyCallable_Check(kafka) || !PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "FastOffsets: kafka and slow must be callable");
        return NULL;
    }
    if (strcmp(kind, "commit") != 0 && strcmp(kind, "store_offsets") != 0) {
        PyErr_Format(PyExc_ValueError, "FastOffsets: kind must be 'commit' or 'store_offsets', not '%s'", kind);
        return NULL;
    }
    self = (FastOffsets *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)fastoffsets_vectorcall;
    self->kafka = Py_NewRef(kafka);
    self->slow = Py_NewRef(slow);
    self->kind = strcmp(kind, "commit") == 0 ? OFFSETS_COMMIT : OFFSETS_STORE;
    return (PyObject *)self;
}

static int
fastoffsets_traverse(FastOffsets *self, visitproc visit, void *arg)
{
    Py_VISIT(self->kafka);
    Py_VISIT(self->slow);
    Py_VISIT(self->dict);
    return 0;
}

static int
fastoffsets_clear(FastOffsets *self)
{
    Py_CLEAR(self->kafka);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->dict);
    return 0;
}

static void
fastoffsets_dealloc(FastOffsets *self)
{
    PyObject_GC_UnTrack(self);
    fastoffsets_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef fastoffsets_members[] = {
    {"slow", T_OBJECT, offsetof(FastOffsets, slow), READONLY, "the Python method behind the fast path"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef fastoffsets_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FastOffsetsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fastrecover._fastpoll.FastOffsets",
    .tp_doc = "Consumer.commit()/store_offsets() of one record: confluent_kafka's own while the mode holds "
              "nothing, everything else in the Python method `slow`.",
    .tp_basicsize = sizeof(FastOffsets),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL
                | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = fastoffsets_new,
    .tp_traverse = (traverseproc)fastoffsets_traverse,
    .tp_clear = (inquiry)fastoffsets_clear,
    .tp_dealloc = (destructor)fastoffsets_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastOffsets, vectorcall),
    .tp_descr_get = fastpoll_get,
    .tp_dictoffset = offsetof(FastOffsets, dict),
    .tp_members = fastoffsets_members,
    .tp_getset = fastoffsets_getset,
};

/* ---- the module ----------------------------------------------------------------------------- */

/* The interface fastrecover/_accel.py expects (its ABI): change both together, with every change of
 * these types or of the steady path they repeat, so that a module built from an older source is refused. */
#define FASTPOLL_ABI 2

static struct PyModuleDef fastpoll_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fastrecover._fastpoll",
    .m_doc = "Consumer.poll()'s steady path, and commit()/store_offsets() of one record, in C.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__fastpoll(void)
{
    PyObject *m;

    str_gate = PyUnicode_InternFromString("_gate");
    str_fr = PyUnicode_InternFromString("_fr");
    str_poll = PyUnicode_InternFromString("poll");
    str_partitions = PyUnicode_InternFromString("partitions");
    str_owned = PyUnicode_InternFromString("owned");
    str_auto_store = PyUnicode_InternFromString("auto_store");
    str_message = PyUnicode_InternFromString("message");
    str_asynchronous = PyUnicode_InternFromString("asynchronous");
    if (str_gate == NULL || str_fr == NULL || str_poll == NULL || str_partitions == NULL || str_owned == NULL
        || str_auto_store == NULL || str_message == NULL || str_asynchronous == NULL) {
        return NULL;
    }
    if (PyType_Ready(&FastStateType) < 0 || PyType_Ready(&FastPollType) < 0
        || PyType_Ready(&FastOffsetsType) < 0) {
        return NULL;
    }
    m = PyModule_Create(&fastpoll_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "FastState", (PyObject *)&FastStateType) < 0
        || PyModule_AddObjectRef(m, "FastPoll", (PyObject *)&FastPollType) < 0
        || PyModule_AddObjectRef(m, "FastOffsets", (PyObject *)&FastOffsetsType) < 0
        || PyModule_AddIntConstant(m, "ABI", FASTPOLL_ABI) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
