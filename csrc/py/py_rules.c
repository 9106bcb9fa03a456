/* py_rules.c - the scheduling and caching decisions of rules.h as module
 * functions, for the Python scheduler loop (mambaradix/scheduler.py) under
 * the reference driver and the simulator: the same C code the lifecycle
 * applies, so each rule has one home. */
#include "py_common.h"
#include "py_args.h"
#include "rules.h"

/* A length argument: an int >= 0. */
static int
len_arg(PyObject *o, const char *fname, const char *arg, int64_t *out)
{
    return mr_arg_int64(o, fname, arg, 0, INT64_MAX, out);
}

/* None or an int >= 0 (-1 stands for None). */
static int
opt_len_arg(PyObject *o, const char *fname, const char *arg, int64_t *out)
{
    *out = -1;
    return o == Py_None ? 0 : len_arg(o, fname, arg, out);
}

PyDoc_STRVAR(match_key_limit__doc__,
"match_key_limit(fill_len, match_cap)\n"
"--\n"
"\n"
"Tokens of a request's fill ids the prefix match may cover: fill_len - 1\n"
"with match_cap (SGLang computes at least one token, for the logits), else\n"
"fill_len.");

static PyObject *
rules_match_key_limit(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "match_key_limit", 0, 2, 2, "fill_len", "match_cap");
    int64_t n;
    int cap;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "fill_len", &n) < 0
        || mr_arg_bool(a[1], spec.fname, "match_cap", &cap) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_match_limit(n, cap));
}

PyDoc_STRVAR(prefill_track_point__doc__,
"prefill_track_point(prefix_len, extend_len, chunk_size, branching_seqlen)\n"
"--\n"
"\n"
"The sequence length whose state an extend of extend_len tokens after\n"
"prefix_len cached ones snapshots in extra_buffer mode, or None.  Tracked\n"
"when extend_len >= chunk_size: prefix_len + (extend_len // chunk_size) *\n"
"chunk_size, or the match's branching point B (None: none) when\n"
"prefix_len < B < prefix_len + extend_len and B - prefix_len is a multiple\n"
"of chunk_size.");

static PyObject *
rules_prefill_track_point(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "prefill_track_point", 0, 4, 4, "prefix_len", "extend_len", "chunk_size", "branching_seqlen");
    int64_t p, e, c, b, point, kernel;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "prefix_len", &p) < 0
        || len_arg(a[1], spec.fname, "extend_len", &e) < 0
        || mr_arg_int64(a[2], spec.fname, "chunk_size", 1, INT64_MAX, &c) < 0
        || opt_len_arg(a[3], spec.fname, "branching_seqlen", &b) < 0) {
        return NULL;
    }
    if (!mr_rule_prefill_track(p, e, c, b, &point, &kernel)) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(point);
}

PyDoc_STRVAR(decode_track_due__doc__,
"decode_track_due(seq_len, interval)\n"
"--\n"
"\n"
"Whether a decode step that brings a request to seq_len tokens snapshots its\n"
"state: seq_len is a multiple of mamba_track_interval.");

static PyObject *
rules_decode_track_due(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "decode_track_due", 0, 2, 2, "seq_len", "interval");
    int64_t n, iv;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "seq_len", &n) < 0
        || mr_arg_int64(a[1], spec.fname, "interval", 1, INT64_MAX, &iv) < 0) {
        return NULL;
    }
    return PyBool_FromLong(mr_rule_decode_due(n, iv));
}

PyDoc_STRVAR(chunk_continuation__doc__,
"chunk_continuation(prefix_len, cand, budget, page_size)\n"
"--\n"
"\n"
"How much of its remaining cand tokens the chunked request prefills next\n"
"with budget tokens: (extend_len, truncated).  A cut ends on a page\n"
"boundary: rounded down, or up to the next page when that would leave\n"
"nothing (SGLang v0.5.15 cuts anywhere; later versions round down).");

static PyObject *
rules_chunk_continuation(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "chunk_continuation", 0, 4, 4, "prefix_len", "cand", "budget", "page_size");
    int64_t p, cand, budget, page;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "prefix_len", &p) < 0
        || len_arg(a[1], spec.fname, "cand", &cand) < 0 || len_arg(a[2], spec.fname, "budget", &budget) < 0
        || mr_arg_int64(a[3], spec.fname, "page_size", 1, INT64_MAX, &page) < 0) {
        return NULL;
    }
    int truncated = 0;
    int64_t n = mr_rule_chunk_continuation(p, cand, budget, page, &truncated);
    return Py_BuildValue("(LN)", (long long)n, PyBool_FromLong(truncated));
}

PyDoc_STRVAR(state_headroom__doc__,
"state_headroom(available, num_reqs, lazy, wants=None)\n"
"--\n"
"\n"
"States to evict before allocating request slots for num_reqs requests\n"
"when `available` slots are free.  SGLang v0.5.15's alloc_req_slots (wants\n"
"None): max(0, num_reqs * slots_per_req(lazy) - available); SGLang 0.5.23's\n"
"ensure_mamba_capacity (wants: the slots the requests' allocation takes):\n"
"max(0, wants - available).");

static PyObject *
rules_state_headroom(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "state_headroom", 0, 4, 3, "available", "num_reqs", "lazy", "wants");
    int64_t avail, n, wants = 0;
    int lazy;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "available", &avail) < 0
        || len_arg(a[1], spec.fname, "num_reqs", &n) < 0 || mr_arg_bool(a[2], spec.fname, "lazy", &lazy) < 0) {
        return NULL;
    }
    int v0515 = a[3] == NULL || a[3] == Py_None;
    if (!v0515 && len_arg(a[3], spec.fname, "wants", &wants) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_state_shortfall(v0515, avail, n, lazy, wants));
}

PyDoc_STRVAR(slots_per_req__doc__,
"slots_per_req(lazy)\n"
"--\n"
"\n"
"State slots an admitted request may hold: 3 (running slot + ping-pong\n"
"pair), 2 in lazy mode; the headroom factor of SGLang's alloc_req_slots.");

static PyObject *
rules_slots_per_req(PyObject *m, PyObject *arg)
{
    int lazy;
    if (mr_arg_bool(arg, "slots_per_req", "lazy", &lazy) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_slots_per_req(lazy));
}

PyDoc_STRVAR(ping_pong_other__doc__,
"ping_pong_other(idx, pp_size)\n"
"--\n"
"\n"
"The other index of a ping-pong track buffer of pp_size (1 or 2) slots:\n"
"flips with 2, stays with 1 (get_mamba_ping_pong_other_idx).");

/* idx in {0, 1}, pp in {1, 2} */
static int
pp_args(mr_argspec *spec, PyObject **a, int64_t *idx, int64_t *pp)
{
    if (mr_arg_int64(a[0], spec->fname, spec->names[0], 0, 1, idx) < 0
        || mr_arg_int64(a[1], spec->fname, "pp_size", 1, 2, pp) < 0) {
        return -1;
    }
    return 0;
}

static PyObject *
rules_ping_pong_other(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "ping_pong_other", 0, 2, 2, "idx", "pp_size");
    int64_t idx, pp;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || pp_args(&spec, a, &idx, &pp) < 0) {
        return NULL;
    }
    return PyLong_FromLong(mr_rule_ping_pong_other((int)idx, (int)pp));
}

PyDoc_STRVAR(keep_index__doc__,
"keep_index(next_idx, pp_size, lazy)\n"
"--\n"
"\n"
"The track slot holding the newest snapshot, which the tree takes at\n"
"cache time: ping_pong_other(next_idx, pp_size), or next_idx in lazy mode.");

static PyObject *
rules_keep_index(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "keep_index", 0, 3, 3, "next_idx", "pp_size", "lazy");
    int64_t idx, pp;
    int lazy;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || pp_args(&spec, a, &idx, &pp) < 0
        || mr_arg_bool(a[2], spec.fname, "lazy", &lazy) < 0) {
        return NULL;
    }
    return PyLong_FromLong(mr_rule_keep_index((int)idx, (int)pp, lazy));
}

PyDoc_STRVAR(end_of_turn__doc__,
"end_of_turn(enabled, extra_buffer, committed, page_size, available, lazy)\n"
"--\n"
"\n"
"Whether a finished request's running slot (its state at exactly committed\n"
"tokens) goes to the tree (end-of-turn states): the option is on, in\n"
"extra_buffer mode, committed is non-zero and whole pages, and `available`\n"
"free slots keep one admission's headroom (slots_per_req(lazy)).");

static PyObject *
rules_end_of_turn(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "end_of_turn", 0, 6, 6, "enabled", "extra_buffer", "committed", "page_size", "available",
            "lazy");
    int on, eb, lazy;
    int64_t committed, page, avail;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || mr_arg_bool(a[0], spec.fname, "enabled", &on) < 0
        || mr_arg_bool(a[1], spec.fname, "extra_buffer", &eb) < 0
        || len_arg(a[2], spec.fname, "committed", &committed) < 0
        || mr_arg_int64(a[3], spec.fname, "page_size", 1, INT64_MAX, &page) < 0
        || len_arg(a[4], spec.fname, "available", &avail) < 0 || mr_arg_bool(a[5], spec.fname, "lazy", &lazy) < 0) {
        return NULL;
    }
    return PyBool_FromLong(mr_rule_end_of_turn(on, eb, committed, page, avail, lazy));
}

PyDoc_STRVAR(finish_cache_len__doc__,
"finish_cache_len(extra_buffer, last_track, committed, end_of_turn, page_size)\n"
"--\n"
"\n"
"The length a finished request caches: its newest snapshot's (last_track,\n"
"None: nothing) in extra_buffer mode, all of committed otherwise or at an\n"
"end of turn; never past committed, rounded down to whole pages.");

static PyObject *
rules_finish_cache_len(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "finish_cache_len", 0, 5, 5, "extra_buffer", "last_track", "committed", "end_of_turn",
            "page_size");
    int eb, eot;
    int64_t last, committed, page;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || mr_arg_bool(a[0], spec.fname, "extra_buffer", &eb) < 0
        || opt_len_arg(a[1], spec.fname, "last_track", &last) < 0
        || len_arg(a[2], spec.fname, "committed", &committed) < 0
        || mr_arg_bool(a[3], spec.fname, "end_of_turn", &eot) < 0
        || mr_arg_int64(a[4], spec.fname, "page_size", 1, INT64_MAX, &page) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_finish_cache_len(eb, last, committed, eot, page));
}

PyDoc_STRVAR(extend_kv_need__doc__,
"extend_kv_need(extend_total, num_reqs, page_size)\n"
"--\n"
"\n"
"KV tokens an extend of extend_total tokens over num_reqs requests makes\n"
"room for (SGLang's alloc_for_extend): extend_total, or with pages\n"
"extend_total + num_reqs * page_size (a fresh page per request).");

static PyObject *
rules_extend_kv_need(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "extend_kv_need", 0, 3, 3, "extend_total", "num_reqs", "page_size");
    int64_t e, n, page;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "extend_total", &e) < 0
        || len_arg(a[1], spec.fname, "num_reqs", &n) < 0
        || mr_arg_int64(a[2], spec.fname, "page_size", 1, INT32_MAX, &page) < 0) {
        return NULL;
    }
    if (n > 0 && n > (INT64_MAX - e) / page) {
        PyErr_SetString(PyExc_OverflowError, "extend_kv_need(): num_reqs * page_size overflows");
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_extend_kv_need(e, n, page));
}

PyDoc_STRVAR(decode_kv_need__doc__,
"decode_kv_need(num_reqs, page_size)\n"
"--\n"
"\n"
"KV tokens a decode step of num_reqs requests makes room for (SGLang's\n"
"alloc_for_decode): num_reqs * page_size.");

static PyObject *
rules_decode_kv_need(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "decode_kv_need", 0, 2, 2, "num_reqs", "page_size");
    int64_t n, page;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "num_reqs", &n) < 0
        || mr_arg_int64(a[1], spec.fname, "page_size", 1, INT32_MAX, &page) < 0) {
        return NULL;
    }
    if (n > INT64_MAX / page) {
        PyErr_SetString(PyExc_OverflowError, "decode_kv_need(): num_reqs * page_size overflows");
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_decode_kv_need(n, page));
}

PyDoc_STRVAR(kv_evict__doc__,
"kv_evict(available, need, shortfall=False)\n"
"--\n"
"\n"
"KV tokens to evict from the tree when `need` are wanted and `available`\n"
"are free: SGLang v0.5.15's evict_from_tree_cache evicts all of need when\n"
"short, not the shortfall; SGLang 0.5.23's (shortfall=True) evicts\n"
"need - available.  0 when nothing is short.");

static PyObject *
rules_kv_evict(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "kv_evict", 0, 3, 2, "available", "need", "shortfall");
    int64_t avail, need;
    int shortfall = 0;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0 || len_arg(a[0], spec.fname, "available", &avail) < 0
        || len_arg(a[1], spec.fname, "need", &need) < 0
        || mr_arg_bool(a[2], spec.fname, "shortfall", &shortfall) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_kv_evict_v(!shortfall, avail, need));
}

PyDoc_STRVAR(request_kv_need__doc__,
"request_kv_need(prompt_len, output_len, page_size, clip_max_new_tokens, overlap)\n"
"--\n"
"\n"
"KV tokens one request needs to run at all, alone in the pool: the most of\n"
"what admission asks for (prompt_len + min(output_len, clip_max_new_tokens)\n"
"+ page_size + 1) and the positions its decode steps hold in whole pages\n"
"(prompt_len + output_len, less one without the overlap scheduler).\n"
"Saturates at 2**63 - 1.");

static PyObject *
rules_request_kv_need(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    MR_ARGS(spec, a, "request_kv_need", 0, 5, 5, "prompt_len", "output_len", "page_size",
            "clip_max_new_tokens", "overlap");
    int64_t p, o, page, clip;
    int overlap;
    if (mr_parse(&spec, args, nargs, kwnames, a) < 0
        || len_arg(a[0], spec.fname, "prompt_len", &p) < 0 || len_arg(a[1], spec.fname, "output_len", &o) < 0
        || mr_arg_int64(a[2], spec.fname, "page_size", 1, INT32_MAX, &page) < 0
        || len_arg(a[3], spec.fname, "clip_max_new_tokens", &clip) < 0
        || mr_arg_bool(a[4], spec.fname, "overlap", &overlap) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_request_kv_need(p, o, page, clip, overlap));
}

#define RULE(name) {#name, (PyCFunction)(void (*)(void))rules_##name, METH_FASTCALL | METH_KEYWORDS, name##__doc__}

static PyMethodDef rules_methods[] = {
    RULE(match_key_limit),
    RULE(prefill_track_point),
    RULE(decode_track_due),
    RULE(chunk_continuation),
    RULE(state_headroom),
    {"slots_per_req", (PyCFunction)rules_slots_per_req, METH_O, slots_per_req__doc__},
    RULE(ping_pong_other),
    RULE(keep_index),
    RULE(end_of_turn),
    RULE(finish_cache_len),
    RULE(extend_kv_need),
    RULE(decode_kv_need),
    RULE(kv_evict),
    RULE(request_kv_need),
    {NULL, NULL, 0, NULL},
};

int
mr_py_rules_init(PyObject *m, mr_state *st)
{
    (void)st;
    return PyModule_AddFunctions(m, rules_methods);
}
