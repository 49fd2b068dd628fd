// SPDX-License-Identifier: GPL-2.0-only
/*
 * The runtime API ring's producer in C: tacc.runtime.apitrace's begin() and
 * end() for the calling thread's ring, without the Python-level work of the pure-Python
 * producer (a threading.local lookup, two clock calls through Python, a 14-field
 * struct.pack_into): under TCG a traced call cost ~15 us of guest CPU in the traced
 * thread, most of it that.
 *
 * The ring format is apitrace.py's (docs/capture-format.md "API rings"): a 4096-byte
 * header, then capacity records of 128 bytes; the producer writes a record into its slot
 * and stores head once per batch (release: a consumer that sees head sees the records).
 * tests/host/test_apiring_c.py checks byte for byte that this producer writes what the
 * Python one writes.
 *
 * Threads: a Producer belongs to one thread's ring; the thread's current Producer is a
 * C thread-local (a strong reference), set on the thread's first traced call by the
 * opener apitrace registers.  Every entry point runs with the GIL held.  A Producer holds
 * a buffer export of the ring's mmap, so the mmap cannot be closed under it; close()
 * releases it and makes every later call a no-op.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define HEADER_SIZE 4096
#define REC_SIZE 128
#define ARGS_MAX 72
#define OFF_ENABLE 20
#define OFF_HEAD 32
#define OFF_TAIL 40
#define OFF_DROPPED 48
#define NO_DEV 0xFFFFFFFFu
#define NO_CTX 0xFFFFFFFFu

struct rec {			/* apitrace.RECORD_DTYPE, little endian (x86) */
	int64_t t_start, t_end;
	uint64_t tag, bytes;
	uint32_t pid, tid, dev;
	uint16_t name_id;
	int16_t status;
	uint32_t ctx;
	uint16_t args_len, rsvd;
	char args[ARGS_MAX];
};

_Static_assert(sizeof(struct rec) == REC_SIZE, "record size");

typedef struct {
	PyObject_HEAD
	Py_buffer buf;
	int open;
	uint8_t *base;
	uint64_t capacity, mask, head, tail, published, batch;
	int64_t t_first, batch_age_ns;
	uint32_t pid, tid;
} Producer;

static __thread PyObject *cur_producer;	/* this thread's Producer, or Py_None */
static PyObject *opener;		/* apitrace's: () -> Producer | None */

static inline int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline volatile uint64_t *hdr_u64(Producer *p, size_t off)
{
	return (volatile uint64_t *)(p->base + off);
}

/* this thread's open Producer, asking the opener on the thread's first call; NULL: none */
static Producer *current(int open_if_unknown)
{
	PyObject *p = cur_producer;

	if (!p) {
		if (!open_if_unknown || !opener)
			return NULL;
		p = PyObject_CallNoArgs(opener);
		if (!p) {	/* a ring that cannot be opened: untraced, as in Python */
			PyErr_Clear();
			p = Py_NewRef(Py_None);
		}
		Py_XSETREF(cur_producer, p);	/* the reference the call returned */
	}
	if (p == Py_None || !((Producer *)p)->open)
		return NULL;
	return (Producer *)p;
}

static void publish(Producer *p)
{
	if (p->head != p->published) {
		__atomic_store_n(hdr_u64(p, OFF_HEAD), p->head, __ATOMIC_RELEASE);
		p->published = p->head;
	}
}

/* False: the ring is full (the consumer is behind); the record is dropped and counted */
static int room(Producer *p)
{
	p->tail = __atomic_load_n(hdr_u64(p, OFF_TAIL), __ATOMIC_ACQUIRE);
	if (p->head - p->tail < p->capacity)
		return 1;
	__atomic_store_n(hdr_u64(p, OFF_DROPPED), *hdr_u64(p, OFF_DROPPED) + 1,
			 __ATOMIC_RELAXED);
	return 0;
}

static int write_record(Producer *p, int64_t t0, int64_t t1, unsigned int name_id,
			uint64_t tag, uint64_t nbytes, uint32_t dev, uint32_t ctx, int status,
			PyObject *args)
{
	struct rec *r;
	const char *a = NULL;
	Py_ssize_t n = 0;
	PyObject *enc = NULL;
	uint64_t n_pending;

	if (p->head - p->tail >= p->capacity && !room(p))
		return 0;
	if (args && args != Py_None && PyUnicode_GET_LENGTH(args)) {
		a = PyUnicode_AsUTF8AndSize(args, &n);
		if (!a) {	/* lone surrogates: as str.encode("utf-8", "replace") */
			PyErr_Clear();
			enc = PyUnicode_AsEncodedString(args, "utf-8", "replace");
			if (!enc)
				return -1;
			a = PyBytes_AS_STRING(enc);
			n = PyBytes_GET_SIZE(enc);
		}
	}
	if (n > ARGS_MAX)
		n = ARGS_MAX;
	r = (struct rec *)(p->base + HEADER_SIZE + (p->head & p->mask) * REC_SIZE);
	r->t_start = t0;
	r->t_end = t1;
	r->tag = tag;
	r->bytes = nbytes;
	r->pid = p->pid;
	r->tid = p->tid;
	r->dev = dev;
	r->name_id = (uint16_t)name_id;
	r->status = (int16_t)status;
	r->ctx = ctx;
	r->args_len = (uint16_t)n;
	r->rsvd = 0;
	if (n)
		memcpy(r->args, a, n);
	memset(r->args + n, 0, ARGS_MAX - n);
	Py_XDECREF(enc);
	p->head++;
	n_pending = p->head - p->published;
	if (n_pending == 1)
		p->t_first = t1;
	/* exact, as Python's ints (times from a caller of emit() may be anything) */
	if (n_pending >= p->batch || (__int128)t1 - p->t_first >= p->batch_age_ns)
		publish(p);
	return 0;
}

/* ---------------------------------------------------------------- Producer --- */
static int producer_init(Producer *p, PyObject *argsv, PyObject *kw)
{
	static char *kwl[] = {"mm", "capacity", "pid", "tid", "batch", "batch_age_ns", NULL};
	PyObject *mm;
	unsigned long long cap, batch;
	unsigned int pid, tid;
	long long age;

	if (p->open) {
		PyErr_SetString(PyExc_RuntimeError, "Producer already initialised");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(argsv, kw, "OKIIKL", kwl, &mm, &cap, &pid, &tid,
					 &batch, &age))
		return -1;
	if (cap < 2 || (cap & (cap - 1))) {
		PyErr_SetString(PyExc_ValueError, "ring capacity must be a power of two >= 2");
		return -1;
	}
	if (PyObject_GetBuffer(mm, &p->buf, PyBUF_WRITABLE) < 0)
		return -1;
	if ((unsigned long long)p->buf.len < HEADER_SIZE + cap * REC_SIZE) {
		PyBuffer_Release(&p->buf);
		PyErr_SetString(PyExc_ValueError, "mapping smaller than the ring");
		return -1;
	}
	p->base = p->buf.buf;
	p->capacity = cap;
	p->mask = cap - 1;
	p->pid = pid;
	p->tid = tid;
	p->batch = batch ? batch : 1;
	p->batch_age_ns = age;
	p->head = p->published = *hdr_u64(p, OFF_HEAD);
	p->tail = *hdr_u64(p, OFF_TAIL);
	p->open = 1;
	return 0;
}

static void producer_dealloc(Producer *p)
{
	if (p->open)
		PyBuffer_Release(&p->buf);
	Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *producer_close(Producer *p, PyObject *unused)
{
	if (p->open) {
		publish(p);
		p->open = 0;
		PyBuffer_Release(&p->buf);
		p->base = NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *producer_publish(Producer *p, PyObject *unused)
{
	uint64_t n = 0;

	if (p->open) {
		n = p->head - p->published;
		publish(p);
	}
	return PyLong_FromUnsignedLongLong(n);
}

static PyObject *producer_emit(Producer *p, PyObject *const *a, Py_ssize_t na,
			       PyObject *kwn);

static PyMethodDef producer_methods[] = {
	{"close", (PyCFunction)producer_close, METH_NOARGS,
	 "Publish what is written and release the mapping; later calls do nothing."},
	{"publish", (PyCFunction)producer_publish, METH_NOARGS,
	 "Store head; returns the number of records it made visible."},
	{"emit", (PyCFunction)(void (*)(void))producer_emit, METH_FASTCALL | METH_KEYWORDS,
	 "emit(name_id, t_start, t_end, tag, nbytes, dev, ctx, status, args): one record."},
	{NULL}
};

#define U64_MEMBER(name, doc) \
	{#name, T_ULONGLONG, offsetof(Producer, name), 0, doc}

static PyMemberDef producer_members[] = {
	U64_MEMBER(head, "records written"),
	U64_MEMBER(published, "records made visible (head stored)"),
	U64_MEMBER(tail, "the consumer's tail as last read"),
	U64_MEMBER(batch, "records per publish"),
	{NULL}
};

static PyTypeObject ProducerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "tacc.runtime._apiring.Producer",
	.tp_doc = "Producer(mm, capacity, pid, tid, batch, batch_age_ns): one thread's ring.",
	.tp_basicsize = sizeof(Producer),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)producer_init,
	.tp_dealloc = (destructor)producer_dealloc,
	.tp_methods = producer_methods,
	.tp_members = producer_members,
};

/* ------------------------------------------------------------- arguments --- */
static int u64_arg(PyObject *o, uint64_t *v)
{
	*v = PyLong_AsUnsignedLongLongMask(o);	/* wraps, as a C caller's value would */
	return (*v == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

#define MAX_ARGS 9

/*
 * The arguments, positional a[0..na) then keywords (kwn: their names, values after the
 * positional ones), by the parameter names: the integers into v[0..nint) (the caller's
 * defaults kept for the missing ones; the first nmin are required), then an optional
 * str (or None) as the last parameter; -1 on a bad call, as Python would refuse it.
 */
static int parse(const char *fn, const char *const *names, PyObject *const *a,
		 Py_ssize_t na, PyObject *kwn, Py_ssize_t nmin, Py_ssize_t nint, uint64_t *v,
		 PyObject **args)
{
	PyObject *slot[MAX_ARGS] = {NULL};
	Py_ssize_t i, j, nkw = kwn ? PyTuple_GET_SIZE(kwn) : 0;

	if (na > nint + 1) {
		PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments (%zd given)", fn,
			     nint + 1, na);
		return -1;
	}
	for (i = 0; i < na; i++)
		slot[i] = a[i];
	for (j = 0; j < nkw; j++) {
		PyObject *k = PyTuple_GET_ITEM(kwn, j);

		for (i = 0; i <= nint; i++)
			if (PyUnicode_CompareWithASCIIString(k, names[i]) == 0)
				break;
		if (i > nint || slot[i]) {
			PyErr_Format(PyExc_TypeError, "%s() got %s keyword argument '%U'", fn,
				     i > nint ? "an unexpected" : "a repeated", k);
			return -1;
		}
		slot[i] = a[na + j];
	}
	for (i = 0; i < nint; i++) {
		if (!slot[i]) {
			if (i < nmin) {
				PyErr_Format(PyExc_TypeError, "%s() missing argument '%s'", fn,
					     names[i]);
				return -1;
			}
			continue;
		}
		if (u64_arg(slot[i], &v[i]) < 0)
			return -1;
	}
	*args = slot[nint];
	if (*args == Py_None)
		*args = NULL;
	if (*args && !PyUnicode_Check(*args)) {
		PyErr_Format(PyExc_TypeError, "%s: args must be a str", fn);
		return -1;
	}
	return 0;
}

/* end(t0, name_id, tag=0, nbytes=0, dev=NO_DEV, ctx=NO_CTX, status=0, args="") */
static const char *const end_names[] = {"t0", "name_id", "tag", "nbytes", "dev", "ctx",
					"status", "args"};
static const char *const emit_names[] = {"name_id", "t_start", "t_end", "tag", "nbytes",
					 "dev", "ctx", "status", "args"};

static PyObject *record_end(Producer *p, PyObject *const *a, Py_ssize_t na, PyObject *kwn)
{
	uint64_t v[7] = {0, 0, 0, 0, NO_DEV, NO_CTX, 0};
	PyObject *args;

	if (parse("end", end_names, a, na, kwn, 2, 7, v, &args) < 0)
		return NULL;
	if (write_record(p, (int64_t)v[0], now_ns(), (unsigned int)v[1], v[2], v[3],
			 (uint32_t)v[4], (uint32_t)v[5], (int16_t)v[6], args) < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *producer_emit(Producer *p, PyObject *const *a, Py_ssize_t na,
			       PyObject *kwn)
{
	/* emit(name_id, t_start, t_end, tag=0, nbytes=0, dev=NO_DEV, ctx=NO_CTX, status=0,
	 * args=""): Ring.emit's order */
	uint64_t v[8] = {0, 0, 0, 0, 0, NO_DEV, NO_CTX, 0};
	PyObject *args;

	if (parse("emit", emit_names, a, na, kwn, 3, 8, v, &args) < 0)
		return NULL;
	if (p->open && write_record(p, (int64_t)v[1], (int64_t)v[2], (unsigned int)v[0], v[3],
				    v[4], (uint32_t)v[5], (uint32_t)v[6], (int16_t)v[7],
				    args) < 0)
		return NULL;
	Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ module --- */
static PyObject *mod_begin(PyObject *m, PyObject *unused)
{
	Producer *p = current(1);

	if (!p || !p->base[OFF_ENABLE])
		return PyLong_FromLong(0);
	return PyLong_FromLongLong(now_ns());
}

static PyObject *mod_end(PyObject *m, PyObject *const *a, Py_ssize_t na, PyObject *kwn)
{
	Producer *p = current(0);

	if (!p)
		Py_RETURN_NONE;
	return record_end(p, a, na, kwn);
}

static PyObject *mod_flush(PyObject *m, PyObject *unused)
{
	Producer *p = current(0);

	if (p)
		publish(p);
	Py_RETURN_NONE;
}

static PyObject *mod_set_current(PyObject *m, PyObject *p)
{
	if (p != Py_None && !PyObject_TypeCheck(p, &ProducerType)) {
		PyErr_SetString(PyExc_TypeError, "a Producer or None");
		return NULL;
	}
	Py_XSETREF(cur_producer, Py_NewRef(p));
	Py_RETURN_NONE;
}

static PyObject *mod_forget_thread(PyObject *m, PyObject *unused)
{
	Py_CLEAR(cur_producer);	/* after fork: the parent thread's ring is not this one's */
	Py_RETURN_NONE;
}

static PyObject *mod_set_opener(PyObject *m, PyObject *f)
{
	if (f != Py_None && !PyCallable_Check(f)) {
		PyErr_SetString(PyExc_TypeError, "a callable or None");
		return NULL;
	}
	Py_XSETREF(opener, f == Py_None ? NULL : Py_NewRef(f));
	Py_RETURN_NONE;
}

static PyMethodDef mod_methods[] = {
	{"begin", mod_begin, METH_NOARGS,
	 "0 when this thread's ring is off, else the call's start time (ns)."},
	{"end", (PyCFunction)(void (*)(void))mod_end, METH_FASTCALL | METH_KEYWORDS,
	 "end(t0, name_id, tag=0, nbytes=0, dev=NO_DEV, ctx=NO_CTX, status=0, args=''):"
	 " records a call of this thread."},
	{"flush", mod_flush, METH_NOARGS, "Publish this thread's written records."},
	{"set_current", mod_set_current, METH_O, "This thread's Producer (or None)."},
	{"forget_thread", mod_forget_thread, METH_NOARGS,
	 "Drop this thread's Producer (in a forked child)."},
	{"set_opener", mod_set_opener, METH_O,
	 "The callable a thread's first begin() asks for its Producer (or None)."},
	{NULL}
};

static struct PyModuleDef moddef = {
	PyModuleDef_HEAD_INIT, "_apiring",
	"The runtime API ring's producer in C (tacc.runtime.apitrace).", -1, mod_methods,
};

PyMODINIT_FUNC PyInit__apiring(void)
{
	PyObject *m;

	if (PyType_Ready(&ProducerType) < 0)
		return NULL;
	m = PyModule_Create(&moddef);
	if (!m)
		return NULL;
	/* the layout it was built for: apitrace.py checks it against its own (one truth) */
	if (PyModule_AddObjectRef(m, "Producer", (PyObject *)&ProducerType) < 0 ||
	    PyModule_AddIntConstant(m, "REC_SIZE", REC_SIZE) < 0 ||
	    PyModule_AddIntConstant(m, "HEADER_SIZE", HEADER_SIZE) < 0 ||
	    PyModule_AddIntConstant(m, "ARGS_MAX", ARGS_MAX) < 0 ||
	    PyModule_AddIntConstant(m, "OFF_ENABLE", OFF_ENABLE) < 0 ||
	    PyModule_AddIntConstant(m, "OFF_HEAD", OFF_HEAD) < 0 ||
	    PyModule_AddIntConstant(m, "OFF_TAIL", OFF_TAIL) < 0 ||
	    PyModule_AddIntConstant(m, "OFF_DROPPED", OFF_DROPPED) < 0 ||
	    PyModule_AddObject(m, "NO_DEV", PyLong_FromUnsignedLong(NO_DEV)) < 0 ||
	    PyModule_AddObject(m, "NO_CTX", PyLong_FromUnsignedLong(NO_CTX)) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
