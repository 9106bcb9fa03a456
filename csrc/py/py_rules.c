/* py_rules.c - the scheduling and caching decisions of rules.h as module
 * functions, for the Python scheduler loop (mambaradix/scheduler.py) under
 * the reference driver and the simulator: the same C code the lifecycle
 * applies, so each rule has one home. */
#include "py_common.h"
#include "py_args.h"
#include "rules.h"

/* Each rule's arguments are read by one table: a kind letter per argument,
 * in order, into int64 values (a flag as 0 or 1):
 *   n  an int >= 0 (a length)
 *   N  None or an int >= 0 (None, or left out, reads as -1)
 *   p  an int >= 1 (a chunk size, an interval, a page size)
 *   P  an int in [1, 2**31 - 1] (a page size a product is taken of)
 *   i  0 or 1 (a ping-pong index)
 *   q  1 or 2 (a ping-pong buffer size)
 *   b  True or False (an argument left out reads as 0)
 * Errors name the function and the argument, as mr_arg_int64 and
 * mr_arg_bool word them. */
static int
rule_args(mr_argspec *spec, const char *kinds, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
          PyObject **a, int64_t *v)
{
    if (mr_parse(spec, args, nargs, kwnames, a) < 0) {
        return -1;
    }
    for (int i = 0; kinds[i] != '\0'; i++) {
        const char *name = spec->names[i];
        int64_t lo = kinds[i] == 'p' || kinds[i] == 'P' || kinds[i] == 'q' ? 1 : 0;
        int64_t hi = kinds[i] == 'P' ? INT32_MAX : kinds[i] == 'i' ? 1 : kinds[i] == 'q' ? 2 : INT64_MAX;
        int flag = 0;
        v[i] = kinds[i] == 'N' ? -1 : 0;
        if (kinds[i] == 'b') {
            if (mr_arg_bool(a[i], spec->fname, name, &flag) < 0) {
                return -1;
            }
            v[i] = flag;
        }
        else if (!(kinds[i] == 'N' && a[i] == Py_None) && mr_arg_int64(a[i], spec->fname, name, lo, hi, &v[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The start of a rule: its signature (every argument positional-or-keyword,
 * the first `required` required), and v[] read by kinds. */
#define RULE_ARGS(fname, required, kinds, ...)                                          \
    MR_ARGS(spec, a, fname, 0, sizeof(kinds) - 1, required, __VA_ARGS__);               \
    int64_t v[sizeof(kinds) - 1];                                                       \
    if (rule_args(&spec, kinds, args, nargs, kwnames, a, v) < 0) {                      \
        return NULL;                                                                    \
    }

/* A rule function (METH_FASTCALL | METH_KEYWORDS). */
#define RULE_FN(name) \
    static PyObject *rules_##name(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)

PyDoc_STRVAR(match_key_limit__doc__,
"match_key_limit(fill_len, match_cap)\n"
"--\n"
"\n"
"Tokens of a request's fill ids the prefix match may cover: fill_len - 1\n"
"with match_cap (SGLang computes at least one token, for the logits), else\n"
"fill_len.");

RULE_FN(match_key_limit)
{
    RULE_ARGS("match_key_limit", 2, "nb", "fill_len", "match_cap");
    return PyLong_FromLongLong(mr_rule_match_limit(v[0], (int)v[1]));
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

RULE_FN(prefill_track_point)
{
    RULE_ARGS("prefill_track_point", 4, "nnpN", "prefix_len", "extend_len", "chunk_size", "branching_seqlen");
    if (mr_rule_prefill_track_overflows(v[0], v[1])) {
        PyErr_SetString(PyExc_OverflowError, "prefill_track_point(): prefix_len + extend_len overflows");
        return NULL;
    }
    int64_t point, kernel;
    if (!mr_rule_prefill_track(v[0], v[1], v[2], v[3], &point, &kernel)) {
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

RULE_FN(decode_track_due)
{
    RULE_ARGS("decode_track_due", 2, "np", "seq_len", "interval");
    return PyBool_FromLong(mr_rule_decode_due(v[0], v[1]));
}

PyDoc_STRVAR(chunk_continuation__doc__,
"chunk_continuation(prefix_len, cand, budget, page_size)\n"
"--\n"
"\n"
"How much of its remaining cand tokens the chunked request prefills next\n"
"with budget tokens: (extend_len, truncated).  A cut ends on a page\n"
"boundary: rounded down, or up to the next page when that would leave\n"
"nothing (SGLang v0.5.15 cuts anywhere; later versions round down).");

RULE_FN(chunk_continuation)
{
    RULE_ARGS("chunk_continuation", 4, "nnnp", "prefix_len", "cand", "budget", "page_size");
    if (mr_rule_chunk_continuation_overflows(v[0], v[1], v[3])) {
        PyErr_SetString(PyExc_OverflowError, "chunk_continuation(): prefix_len + cand (or the next page) overflows");
        return NULL;
    }
    int truncated = 0;
    int64_t n = mr_rule_chunk_continuation(v[0], v[1], v[2], v[3], &truncated);
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

RULE_FN(state_headroom)
{
    /* wants None or left out (-1): SGLang v0.5.15's rule */
    RULE_ARGS("state_headroom", 3, "nnbN", "available", "num_reqs", "lazy", "wants");
    int v0515 = v[3] < 0;
    if (v0515 && mr_rule_state_headroom_overflows(v[1], (int)v[2])) {
        PyErr_SetString(PyExc_OverflowError, "state_headroom(): num_reqs * slots_per_req(lazy) overflows");
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_state_shortfall(v0515, v[0], v[1], (int)v[2], v0515 ? 0 : v[3]));
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

RULE_FN(ping_pong_other)
{
    RULE_ARGS("ping_pong_other", 2, "iq", "idx", "pp_size");
    return PyLong_FromLong(mr_rule_ping_pong_other((int)v[0], (int)v[1]));
}

PyDoc_STRVAR(keep_index__doc__,
"keep_index(next_idx, pp_size, lazy)\n"
"--\n"
"\n"
"The track slot holding the newest snapshot, which the tree takes at\n"
"cache time: ping_pong_other(next_idx, pp_size), or next_idx in lazy mode.");

RULE_FN(keep_index)
{
    RULE_ARGS("keep_index", 3, "iqb", "next_idx", "pp_size", "lazy");
    return PyLong_FromLong(mr_rule_keep_index((int)v[0], (int)v[1], (int)v[2]));
}

PyDoc_STRVAR(end_of_turn__doc__,
"end_of_turn(enabled, extra_buffer, committed, page_size, available, lazy)\n"
"--\n"
"\n"
"Whether a finished request's running slot (its state at exactly committed\n"
"tokens) goes to the tree (end-of-turn states): the option is on, in\n"
"extra_buffer mode, committed is non-zero and whole pages, and `available`\n"
"free slots keep one admission's headroom (slots_per_req(lazy)).");

RULE_FN(end_of_turn)
{
    RULE_ARGS("end_of_turn", 6, "bbnpnb", "enabled", "extra_buffer", "committed", "page_size", "available", "lazy");
    return PyBool_FromLong(mr_rule_end_of_turn((int)v[0], (int)v[1], v[2], v[3], v[4], (int)v[5]));
}

PyDoc_STRVAR(finish_cache_len__doc__,
"finish_cache_len(extra_buffer, last_track, committed, end_of_turn, page_size)\n"
"--\n"
"\n"
"The length a finished request caches: its newest snapshot's (last_track,\n"
"None: nothing) in extra_buffer mode, all of committed otherwise or at an\n"
"end of turn; never past committed, rounded down to whole pages.");

RULE_FN(finish_cache_len)
{
    RULE_ARGS("finish_cache_len", 5, "bNnbp", "extra_buffer", "last_track", "committed", "end_of_turn",
              "page_size");
    return PyLong_FromLongLong(mr_rule_finish_cache_len((int)v[0], v[1], v[2], (int)v[3], v[4]));
}

PyDoc_STRVAR(extend_kv_need__doc__,
"extend_kv_need(extend_total, num_reqs, page_size)\n"
"--\n"
"\n"
"KV tokens an extend of extend_total tokens over num_reqs requests makes\n"
"room for (SGLang's alloc_for_extend): extend_total, or with pages\n"
"extend_total + num_reqs * page_size (a fresh page per request).");

RULE_FN(extend_kv_need)
{
    RULE_ARGS("extend_kv_need", 3, "nnP", "extend_total", "num_reqs", "page_size");
    if (mr_rule_extend_kv_overflows(v[0], v[1], v[2])) {
        PyErr_SetString(PyExc_OverflowError, "extend_kv_need(): num_reqs * page_size overflows");
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_extend_kv_need(v[0], v[1], v[2]));
}

PyDoc_STRVAR(decode_kv_need__doc__,
"decode_kv_need(num_reqs, page_size)\n"
"--\n"
"\n"
"KV tokens a decode step of num_reqs requests makes room for (SGLang's\n"
"alloc_for_decode): num_reqs * page_size.");

RULE_FN(decode_kv_need)
{
    RULE_ARGS("decode_kv_need", 2, "nP", "num_reqs", "page_size");
    if (mr_rule_decode_kv_overflows(v[0], v[1])) {
        PyErr_SetString(PyExc_OverflowError, "decode_kv_need(): num_reqs * page_size overflows");
        return NULL;
    }
    return PyLong_FromLongLong(mr_rule_decode_kv_need(v[0], v[1]));
}

PyDoc_STRVAR(kv_evict__doc__,
"kv_evict(available, need, shortfall=False)\n"
"--\n"
"\n"
"KV tokens to evict from the tree when `need` are wanted and `available`\n"
"are free: SGLang v0.5.15's evict_from_tree_cache evicts all of need when\n"
"short, not the shortfall; SGLang 0.5.23's (shortfall=True) evicts\n"
"need - available.  0 when nothing is short.");

RULE_FN(kv_evict)
{
    RULE_ARGS("kv_evict", 2, "nnb", "available", "need", "shortfall");
    return PyLong_FromLongLong(mr_rule_kv_evict_v(!v[2], v[0], v[1]));
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

RULE_FN(request_kv_need)
{
    RULE_ARGS("request_kv_need", 5, "nnPnb", "prompt_len", "output_len", "page_size", "clip_max_new_tokens",
              "overlap");
    return PyLong_FromLongLong(mr_rule_request_kv_need(v[0], v[1], v[2], v[3], (int)v[4]));
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
