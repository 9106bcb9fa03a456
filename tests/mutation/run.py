#!/usr/bin/env python3
"""Mutation testing: does the suite catch deliberate one-line bugs?

Copies the working tree (tracked and untracked, not ignored files) to a
scratch directory, builds it CPU-only (MAMBARADIX_CUDA=0), then for each
mutant of MUTANTS: replaces one exact piece of one line, rebuilds when the
file is under csrc/ (a source or a header), runs the mutant's tests, and restores the line.  A mutant is
*killed* when tests in at least two test files fail (two independent
tests); *weak* when the failures are all in one file; *survived* when no
test fails.  Equivalent mutants (no behaviour can tell
them apart) are listed with the reason and not run.

    python3 tests/mutation/run.py              # every mutant
    python3 tests/mutation/run.py --fast       # the CI subset
    python3 tests/mutation/run.py LC_B1 KEEP   # by id
    python3 tests/mutation/run.py --list

Exit status 0 when every mutant run was killed.  The scratch copy is removed
unless --keep.  The working tree is never modified.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# test groups (files or node ids); slow tests are never selected here
T_DECIDE = ["tests/dropin/test_sglang_decisions.py"]
T_LIFE = ["tests/core/test_lifecycle.py", "tests/core/test_lifecycle_random.py"]
T_DROPIN = ["tests/dropin/test_sglang_dropin.py"]
T_DRIVER = ["tests/sim/test_driver.py"]
T_TREE = ["tests/core/test_tree_sglang_flows.py", "tests/core/test_tree_handles.py", "tests/core/test_tree_bad_input.py",
          "tests/core/test_tree_differential.py"]
T_POOLS = ["tests/core/test_pools.py"]
T_RECORD = ["tests/core/test_req_state.py", "tests/dropin/test_dropin_no_sync.py"]
T_KERN = ["tests/tensor/test_kernels_cpu.py", "tests/tensor/test_kernels_numpy.py", "tests/tensor/test_dlpack.py"]
T_FG = ["tests/core/test_pools.py", "tests/dropin/test_sglang_pools_oracle.py", "tests/c/test_c_core.py"]
T_TONLY = ["tests/core/test_lifecycle_tree_view.py", "tests/sim/test_sim_engine.py", "tests/dropin/test_sglang_pools_oracle.py",
           "tests/c/test_c_lifecycle.py"]
T_INS = ["tests/core/test_lifecycle_insert_owners.py", "tests/core/test_lifecycle_insert_dups.py",
         "tests/core/test_insert_mixed_owners.py",
         "tests/dropin/test_dropin_refusals.py", "tests/c/test_c_lifecycle.py"]
T_INT64 = ["tests/core/test_match_int64_keys.py", "tests/dropin/test_sglang_pools_oracle.py", "tests/dropin/test_sglang_dropin.py"]
T_HEAP = ["tests/core/test_tree_leaf_orders.py", "tests/c/test_c_core.py", "tests/sim/test_state_policies.py"]
T_ADAPT = ["tests/core/test_tree_adaptive.py", "tests/core/test_adaptive_rules.py", "tests/sim/test_state_policies.py"]
T_END = ["tests/core/test_tree_adaptive_place.py", "tests/core/test_adaptive_rules.py", "tests/sim/test_adaptive_place.py"]
T_CHK = ["tests/c/test_c_lifecycle.py", "tests/core/test_req_state.py", "tests/core/test_lifecycle.py"]
T_OPS = ["tests/dropin/test_dropin_ops_oracle.py"]
T_TAKE = ["tests/dropin/test_sglang_pools_oracle.py", "tests/dropin/test_sglang_dropin.py",
          "tests/core/test_lifecycle_tree_view.py", "tests/dropin/test_row_after_cache_unfinished.py"]
T_BOUND = ["tests/sim/test_bound.py", "tests/sim/test_bound_replays.py", "tests/package/test_docs.py"]
T_RESULTS = ["tests/core/test_lifecycle_foreign_results.py", "tests/sim/test_sim_engine.py"]
T_COUNT = ["tests/core/test_counted_pools.py", "tests/sim/test_sim_engine.py", "tests/c/test_c_lifecycle.py",
           "tests/sim/test_state_policies.py",
           "tests/sim/test_driver.py"]
T_PAGED = ["tests/dropin/test_sglang_pools_oracle_paged.py", "tests/dropin/test_sglang_pools_oracle.py",
           "tests/core/test_lifecycle_free_calls.py"]


@dataclass
class Mutant:
    id: str
    path: str
    find: str          # exact text, once in the file (it may span lines)
    repl: str
    tests: List[str]
    what: str
    fast: bool = False
    equivalent: Optional[str] = None  # reason, when no behaviour can tell it apart


MUTANTS: List[Mutant] = [
    # ---- lifecycle decisions (csrc/core/rules.h, csrc/core/lifecycle.c)
    Mutant("LC_B1", "csrc/core/rules.h", "*kernel_seqlen = branching + 1;", "*kernel_seqlen = branching;", T_DECIDE + T_LIFE + T_DROPIN + T_DRIVER,
           "branching track_seqlen B instead of B + 1 (the kernel then reads the final state)", fast=True),
    Mutant("LC_MASK", "csrc/core/rules.h", "if (extend_len < chunk) {", "if (extend_len <= chunk) {",
           T_DECIDE + T_LIFE + T_DRIVER, "prefill track mask: boundary operator", fast=True),
    Mutant("LC_GRID", "csrc/core/rules.h", "*point = prefix_len + (extend_len / chunk) * chunk;",
           "*point = (prefix_len + extend_len) / chunk * chunk;", T_DECIDE + T_LIFE + T_DRIVER,
           "prefill track point on the absolute grid instead of the chunk-relative one"),
    Mutant("LC_BR_LT", "csrc/core/rules.h", "branching > prefix_len && branching < end",
           "branching > prefix_len && branching <= end",
           T_DECIDE + T_LIFE + T_DRIVER, "branching point: upper bound inclusive"),
    Mutant("LC_BR_GT", "csrc/core/rules.h", "branching > prefix_len && branching < end",
           "branching >= prefix_len && branching < end",
           T_DECIDE + T_LIFE + T_DRIVER, "branching point: lower bound inclusive"),
    Mutant("LC_LAZY_FLIP", "csrc/core/lifecycle.c", "if (!lc->cfg.lazy && st->next_track >= 0) {",
           "if (st->next_track >= 0) {", T_DECIDE + T_LIFE, "lazy mode flips the ping-pong index at prefill"),
    Mutant("LC_KEEP", "csrc/core/rules.h",
           "return lazy ? next_track : mr_rule_ping_pong_other(next_track, pp);",
           "return next_track;", T_DECIDE + T_LIFE + T_DROPIN + T_DRIVER,
           "keep index: swapped ping-pong (the tree gets the slot being written)", fast=True),
    Mutant("LC_KEEP_LAZY", "csrc/core/rules.h", "return lazy ? next_track : mr_rule_ping_pong_other(next_track, pp);",
           "return lazy ? 1 - next_track : mr_rule_ping_pong_other(next_track, pp);", T_DECIDE + T_LIFE + T_DRIVER,
           "lazy keep index swapped"),
    Mutant("LC_DEC_MASK", "csrc/core/rules.h", "return seq_len % interval == 0;", "return (seq_len - 1) % interval == 0;",
           T_DECIDE + T_LIFE + T_DRIVER, "decode track mask off by one"),
    Mutant("LC_DEC_BOUND", "csrc/core/lifecycle.c", "!mr_rule_decode_due((int64_t)committed_len, lc->cfg.track_interval)",
           "!mr_rule_decode_due((int64_t)committed_len + 1, lc->cfg.track_interval)", T_DECIDE + T_LIFE,
           "decode boundary off by one"),
    Mutant("LC_LAZY_FREE", "csrc/core/lifecycle.c", "            (void)free_slot(lc, st->track[other]);\n",
           "", T_DECIDE + T_LIFE, "lazy post-decode: borrowed slot never freed (dropped free)"),
    Mutant("LC_HEADROOM", "csrc/core/rules.h", "return lazy ? 2 : 3;", "return lazy ? 2 : 2;", T_DECIDE + T_LIFE + T_DRIVER,
           "admission headroom factor"),
    Mutant("LC_CAP", "csrc/core/rules.h", "return cap ? (fill_len > 0 ? fill_len - 1 : 0) : fill_len;", "return fill_len;",
           T_DECIDE + T_LIFE + T_DRIVER, "batch match without the input_len - 1 cap", fast=True),
    Mutant("LC_COW_DST", "csrc/core/lifecycle.c", "out->cow_dst[i] = st->running;", "out->cow_dst[i] = st->cow_src;",
           T_DECIDE + T_LIFE, "batch copy-on-write: destination is the tree's slot"),
    Mutant("LC_COW_SRC", "csrc/core/lifecycle.c", "    st->cow_src = state;\n",
           "    st->cow_src = st->running;\n", T_DECIDE + T_LIFE + T_DROPIN,
           "copy-on-write source is the request's own slot"),
    Mutant("LC_TAIL_FREE", "csrc/core/lifecycle.c",
           "        size_t ntail = end < (int64_t)committed_len ? committed_len - (size_t)end : 0;",
           "        size_t ntail = 0;", T_LIFE + T_DROPIN, "finish: tail KV never freed (dropped free)"),
    Mutant("LC_UNLOCK", "csrc/core/lifecycle.c", "        (void)mr_radix_unlock(lc->tree, old);\n", "",
           T_LIFE + T_DROPIN, "cache_unfinished: old node's lock never released (skipped unlock)"),
    Mutant("LC_LOCK", "csrc/core/lifecycle.c",
           "        rc = mr_radix_lock(lc->tree, m.node);\n        if (rc != MR_OK) {\n            break;\n        }\n"
           "        st->locked = 1;",
           "        st->locked = 1;", T_DECIDE + T_LIFE, "prefill batch: matched prefix never locked (skipped lock)"),
    Mutant("LC_PROTECT", "csrc/core/lifecycle.c",
           "    if (protect != NULL && (rc = mr_radix_lock(lc->tree, protect)) != MR_OK) {",
           "    if (0 && protect != NULL && (rc = mr_radix_lock(lc->tree, protect)) != MR_OK) {",
           ["tests/core/test_lifecycle_tree_view.py", "tests/dropin/test_sglang_pools_oracle.py"],
           "eviction for a copy-on-write slot does not protect the matched node (skipped lock)"),
    # ---- request records in their rows (csrc/core/req_pool.c, the ReqState binding)
    Mutant("RP_BIND", "csrc/core/req_pool.c", "    p->req[r] = *st;\n    p->bound[r] = MR_ROW_BOUND;",
           "    p->bound[r] = MR_ROW_BOUND;", T_RECORD, "admission: the record never moves into its row"),
    Mutant("RP_LOAD_MAP", "csrc/core/req_pool.c", "    *out = p->req[r];\n    if (p->bound[r] & MR_ROW_BOUND) {",
           "    *out = p->req[r];\n    if (0) {", T_RECORD, "a bound row's track entries not read from its track map"),
    Mutant("PY_TAKE_BACK", "csrc/py/py_pools.c", "        mr_py_req_state_take_back(h, gen, &rec);\n", "",
           T_RECORD, "ReqPool.free: the record never goes back to its ReqState"),
    # ---- tree (csrc/core/radix.c)
    Mutant("TR_BRANCH", "csrc/core/radix.c", "    if (pos > best_len) {\n        size_t aligned",
           "    if (pos >= best_len) {\n        size_t aligned", T_TREE + T_DECIDE, "branching point also at the state",
           equivalent=None),
    Mutant("TR_ALIGN", "csrc/core/radix.c", "size_t aligned = pos / t->cfg.chunk_size * t->cfg.chunk_size;",
           "size_t aligned = pos / t->cfg.page_size * t->cfg.page_size;", T_TREE,
           "branching point aligned to pages, not chunks"),
    Mutant("TR_TRIM_FORK", "csrc/core/radix.c", "victim == NULL && a->nchildren == 1) {",
           "victim == NULL && a->nchildren >= 1) {",
           ["tests/sim/test_state_policies.py", "tests/sim/test_path_budget.py"],
           "the per-path budget drops a fork's state, which the other branches resume from"),
    Mutant("TR_STATE_VICTIM", "csrc/core/radix.c",
           "(n->nchildren > 0 || n->full_lock == 0 || t->cfg.semantics == MR_SEMANTICS_V0523)", "1", T_TREE, "state eviction takes a leaf whose KV is locked (SGLang #21379)"),
    Mutant("TR_LEAF_VICTIM", "csrc/core/radix.c",
           "        mr_node *n = link_node((mr_link *)l, LRU_FULL);\n        if (n->full_lock == 0 && n->nchildren == 0) {\n            return n;\n        }\n    }\n    return NULL;\n}\n\n/* Utility",
           "        mr_node *n = link_node((mr_link *)l, LRU_FULL);\n        if (n->nchildren == 0) {\n            return n;\n        }\n    }\n    return NULL;\n}\n\n/* Utility", T_TREE, "leaf eviction ignores locks (skipped lock)", fast=True),
    Mutant("TR_UNLOCK", "csrc/core/radix.c", "        if (--n->full_lock == 0) {", "        if (--n->full_lock == 1) {",
           T_TREE, "unlock: protected -> evictable at the wrong count"),
    Mutant("TR_BEST", "csrc/core/radix.c", "        if (node->state >= 0) {\n            best = node;\n            best_len = pos;\n        }\n        size_t p",
           "        size_t p", T_TREE, "match ignores states on the way down (only the deepest node counts)"),
    Mutant("TR_CASCADE", "csrc/core/radix.c", "while (t->cfg.semantics == MR_SEMANTICS_V0515 && parent != t->root && parent->state < 0\n           && parent->nchildren == 0 && parent->full_lock == 0) {",
           "while (0) {", T_TREE, "evicting a leaf leaves childless stateless parents (dropped free)"),
    Mutant("TR_LEAF_TIE", "csrc/core/radix.c", "(a->key == b->key && a->rank < b->rank)",
           "(a->key == b->key && a->rank > b->rank)", ["tests/core/test_tree_leaf_orders.py", "tests/c/test_c_core.py"],
           "leaf heap breaks key ties toward the most recently used leaf"),
    Mutant("TR_LEAF_STALE", "csrc/core/radix.c", "path_lock_delta(mr_radix *t, mr_node *node, int delta)\n{\n    t->ver++;",
           "path_lock_delta(mr_radix *t, mr_node *node, int delta)\n{",
           ["tests/core/test_tree_leaf_orders.py", "tests/c/test_c_core.py"],
           "a KV lock or unlock leaves the leaf heap current (stale evictability)"),
    # ---- allocators (csrc/core/slot_alloc.c)
    Mutant("SA_ENOSPC", "csrc/core/slot_alloc.c", "    if (k > s->count) {\n        return MR_ENOSPC;",
           "    if (k > s->count + 1) {\n        return MR_ENOSPC;", T_POOLS + T_LIFE,
           "allocator hands out one unit more than it has (boundary operator)"),
    Mutant("SA_OWNER", "csrc/core/slot_alloc.c", "        mark[u] = 0;\n        owner[u] = MR_OWNER_FREE;\n",
           "        mark[u] = 0;\n", T_POOLS + T_LIFE, "free does not clear the owner"),
    Mutant("SA_FRONT", "csrc/core/slot_alloc.c", "s->ring[s->head] = u[i];", "s->ring[s->head] = u[k - 1 - i];",
           T_POOLS + T_DROPIN + T_LIFE, "paged KV free puts the freed pages back in reverse order"),
    Mutant("SA_PEND", "csrc/core/slot_alloc.c", "        if (o == MR_OWNER_FREE || o == MR_OWNER_PENDING) {\n            rc = MR_ENOENT;",
           "        if (o == MR_OWNER_FREE) {\n            rc = MR_ENOENT;", T_POOLS + T_DROPIN,
           "a second free of a unit the open free group freed goes through (double free)"),
    # ---- kernels' C twins (csrc/tensor/kernels_cpu.c)
    Mutant("K_COPY", "csrc/tensor/kernels_cpu.c", "memcpy(row_ptr(d, l, dst[i]), row_ptr(d, l, src[i]), (size_t)d->row_bytes);",
           "memcpy(row_ptr(d, l, src[i]), row_ptr(d, l, dst[i]), (size_t)d->row_bytes);", T_KERN + T_DROPIN,
           "copy_slots copies dst -> src (swapped)", fast=True),
    # (the C twin's own mask test, kernels_cpu.c, runs only for device-resident
    # index arrays, which a CPU pool refuses: host calls apply the mask in
    # index_select, state_pool.c)
    Mutant("K_TRACK", "csrc/tensor/state_pool.c", "        if (mask[i]) {", "        if (!mask[i]) {",
           T_KERN, "track_decode on host indices inverts the mask"),
    Mutant("K_MASK_BOOL", "csrc/py/py_args.c", "        *v = o == Py_True;", "        *v = o != Py_True;",
           T_KERN + ["tests/tensor/test_index_args.py"], "a list of bools read as a mask is inverted"),
    Mutant("K_SSM_DTYPE", "csrc/tensor/state_pool.c", "    if (h->dtype != tt->dtype && !convertible) {",
           "    if (0 && h->dtype != tt->dtype && !convertible) {", T_KERN + ["tests/tensor/test_index_args.py"],
           "snapshot_ssm_from_h takes h of a dtype it cannot convert"),
    Mutant("K_CONV", "csrc/tensor/kernels_cpu.c", "pos[i] - p->km1 + j;", "pos[i] - p->km1 + j + 1;",
           T_KERN, "conv window snapshot off by one"),
    Mutant("K_SSM", "csrc/tensor/kernels_cpu.c", "const char *s = p->h + chunk[i] * p->elems * (int64_t)hsz;",
           "const char *s = p->h + (chunk[i] + 1) * p->elems * (int64_t)hsz;", T_KERN,
           "ssm snapshot reads the next chunk's h"),
    # ---- the Python copies of the match cap
    Mutant("PY_CAP_DRIVER", "mambaradix/driver.py", "limit = match_key_limit(len(fill), self.config.match_cap)",
           "limit = match_key_limit(len(fill), False)", T_DRIVER + T_DECIDE + ["tests/sim/test_sim_engine.py"],
           "driver's match cap (input_len - 1) dropped"),
    Mutant("PY_CAP_API", "mambaradix/sglang/_api.py", "        m = input_len - 1\n", "        m = input_len\n",
           T_LIFE + T_DECIDE + T_DROPIN, "drop-in Req's match cap (input_len - 1) dropped"),
    Mutant("PY_COPY_FROM", "mambaradix/sglang/pools.py", "        self._ops.copy(src, dst)\n        self.bytes_copied",
           "        self.bytes_copied", T_DROPIN + T_LIFE,
           "MambaPool.copy_from does nothing"),
    # ---- code newer than the list above (2026-12-01)
    # free groups (csrc/core/slot_alloc.c)
    Mutant("SA_FG_SORT", "csrc/core/slot_alloc.c", "    if (front && k > 1) {\n        qsort(s->pending",
           "    if (0) {\n        qsort(s->pending", T_FG, "paged free group's end: pending pages not sorted"),
    Mutant("SA_FG_FRONT", "csrc/core/slot_alloc.c", "mr_slots_free_group_end(&kv->pages, kv->page_size > 1);",
           "mr_slots_free_group_end(&kv->pages, 0);", T_FG, "paged free group's end puts its pages at the tail"),
    Mutant("SA_FG_NEST", "csrc/core/slot_alloc.c", "     * not copy. */\n    s->free_group = 1;",
           "     * not copy. */\n    s->n_pending = 0;\n    s->free_group = 1;", T_FG,
           "a nested free_group_begin drops the open group's frees (SGLang's leak)"),
    Mutant("SA_FG_CHECKED", "csrc/core/slot_alloc.c",
           "    if (s->free_group) {   /* the group's end puts them in the free list */", "    if (0) {",
           T_FG + T_INS, "an insert's duplicates (page size 1) skip the open free group"),
    Mutant("SA_FG_PEND_DUP", "csrc/core/slot_alloc.c", "            if (mark[u]) {   /* not a PENDING unit skipped */",
           "            if (1) {", T_FG, "a page the open group freed already is listed pending again"),
    Mutant("SA_FG_TREE", "csrc/core/slot_alloc.c", "const int defer = s->free_group && from == MR_FROM_CALLER;",
           "const int defer = s->free_group;", T_FG, "the tree's evictions deferred by an open free group"),
    # the tree-only lifecycle over SGLang's pools, eviction with a node protected (csrc/core/lifecycle.c)
    Mutant("LC_TO_OUTKV", "csrc/core/lifecycle.c",
           "    copy_kv(lc, idx, n);\n    lc->rcut[lc->nrcut++] = (int64_t)lc->nrkv;   /* a free call of its own */",
           "    lc->rcut[lc->nrcut++] = (int64_t)lc->nrkv;   /* a free call of its own */", T_TONLY,
           "tree-only: a caller's KV a call frees is never handed back (dropped free)"),
    Mutant("LC_TO_EVKV", "csrc/core/lifecycle.c",
           "        copy_kv(lc, idx, n);\n        lc->rcut[lc->nrcut++] = (int64_t)lc->nrkv;   /* one free call per node",
           "        lc->rcut[lc->nrcut++] = (int64_t)lc->nrkv;   /* one free call per node", T_TONLY,
           "tree-only: evicted KV never handed back (dropped free)"),
    # the tree-only calls' results and a keys-only lifecycle, as the simulator uses them
    Mutant("LC_CACHED_FIN", "csrc/core/lifecycle.c", "            lc->cached_len = cache_len;\n",
           "            lc->cached_len = (int64_t)committed_len;\n", T_RESULTS,
           "cache_finished reports the committed length as cached, not what it inserted"),
    Mutant("LC_CACHED_UNF", "csrc/core/lifecycle.c", "    st->last_track_seqlen = -1;\n    lc->cached_len = cache_len;",
           "    st->last_track_seqlen = -1;\n    lc->cached_len = (int64_t)fill_len;", T_RESULTS,
           "cache_unfinished reports the fill length as cached, not the tracked length it inserted"),
    Mutant("LC_ADMIT_IDS", "csrc/core/lifecycle.c", "        fresh[j] = first + j;", "        fresh[j] = first;",
           T_RESULTS, "admission from a slot counter hands one id out for every slot"),
    Mutant("LC_NOVAL_TAIL", "csrc/core/lifecycle.c",
           "        rc = out_kv(lc, kv != NULL ? kv + protected_len : NULL, committed_len - (size_t)protected_len);",
           "        rc = out_kv(lc, kv != NULL ? kv + protected_len : NULL, kv != NULL ? committed_len - (size_t)protected_len : 0);",
           T_RESULTS, "keys-only: a request finished without insert hands back none of its KV"),
    Mutant("LC_TO_CLEAR", "csrc/core/lifecycle.c", "mr_lc_clear_released(mr_lifecycle *lc)\n{\n    lc->nrkv = lc->nrst = lc->nrcut = 0;",
           "mr_lc_clear_released(mr_lifecycle *lc)\n{\n    (void)lc;", T_TONLY,
           "tree-only: what a call handed back is handed back again by the next", fast=True),
    Mutant("LC_TO_HOOKRES", "csrc/core/lifecycle.c",
           "\n            || grow(&lc->rst, &lc->caprst, lc->nrst + 1) != MR_OK) {", ") {",
           T_TONLY + ["tests/c/test_c_core.py"],
           "tree-only KV release hook: no room reserved for the node's state"),
    Mutant("LC_EVP_UNLOCK", "csrc/core/lifecycle.c", "        (void)mr_radix_unlock(lc->tree, protect);\n", "", T_TONLY,
           "eviction with a node protected: the node stays locked (skipped unlock)"),
    Mutant("LC_EVP_COUNT", "csrc/core/lifecycle.c", "        *tokens_out = t1 + t2;", "        *tokens_out = t1;",
           T_TONLY + T_LIFE, "evict: tokens freed by state eviction not counted"),
    # insert refusals (csrc/core/lifecycle.c)
    Mutant("LC_INS_PENDING", "csrc/core/lifecycle.c",
           "o == MR_OWNER_RESERVED || o == MR_OWNER_PENDING) {", "o == MR_OWNER_RESERVED) {",
           T_INS + T_FG[:2], "insert accepts a KV page freed in the open free group"),
    Mutant("LC_INS_MINE", "csrc/core/lifecycle.c", "return i >= mine ? MR_EBUSY : MR_OK;",
           "return i > mine ? MR_EBUSY : MR_OK;", T_INS,
           "insert: a tree-owned index just past the tree's own prefix accepted (off by one)"),
    Mutant("LC_INS_FROM", "csrc/core/lifecycle.c", "for (size_t i = mine; i < len; i++) {",
           "for (size_t i = mine + 1; i < len; i++) {", T_INS,
           "insert (page size 1): the first index past the tree's own prefix goes unchecked"),
    Mutant("LC_INS_FAST", "csrc/core/lifecycle.c", "if (MR_UNLIKELY(ou < 1 && ou != pass_held)) {",
           "if (MR_UNLIKELY(ou < 0 && ou != pass_held)) {",
           T_INS, "insert (page size 1): a free KV index taken for a request's"),
    Mutant("LC_INS_OWN", "csrc/core/lifecycle.c", "return n < prev_prefix_len ? n : prev_prefix_len;",
           "return prev_prefix_len;", T_INS,
           "insert: the declared locked prefix trusted past the tree's own (its indices unchecked)"),
    Mutant("LC_ROW_FROM", "csrc/core/lifecycle.c", "size_t first = check_from(lc, mine);",
           "size_t first = check_from(lc, mine) + 1;", T_LIFE + T_INS + T_DROPIN,
           "cache_unfinished reads the table from one past the insert's first used index (a stale KV index)"),
    Mutant("PY_I32_RANGE", "csrc/core/ints.c", "        if (n == 0 || (mn >= lo && mx <= hi)) {\n            return -1;",
           "        if (1) {\n            return -1;", ["tests/core/test_tree_bad_input.py", "tests/core/test_int_arrays.py"],
           "int32 indices widened without their range check"),
    Mutant("PY_I32_WIDEN", "csrc/core/ints.c", "            d[i] = x;\n        }\n        if (n == 0 ||",
           "            d[i] = mn;\n        }\n        if (n == 0 ||", ["tests/core/test_int_arrays.py"] + T_TONLY[:1] + T_TAKE[:2],
           "int32 indices widened to the wrong values"),
    Mutant("SA_SET_OWNERS", "csrc/core/slot_alloc.c", "        count_add(s, owner[idx[i]], -1);\n        owner[idx[i]] = to;",
           "        owner[idx[i]] = to;", T_FG + T_INS + T_LIFE,
           "checked free / transfer: units not taken out of their owner's count"),
    Mutant("LC_CLAIM_GRP", "csrc/core/lifecycle.c", "if (o0 >= 1 || (o0 == MR_OWNER_HELD && !grp)) {",
           "if (o0 >= 1 || o0 == MR_OWNER_HELD) {", T_INS,
           "insert (page size 1): the one-pass claim takes an open alloc group's units not handed out"),
    Mutant("LC_CLAIM_DUPS", "csrc/core/lifecycle.c", "        if (pl > mine) {\n            unclaim_units(",
           "        if (0) {\n            unclaim_units(", T_INS + T_LIFE,
           "insert (page size 1): the duplicates freed while still claimed for the tree (counts off)"),
    Mutant("LC_CLAIM_DUPS32", "csrc/core/lifecycle.c",
           "        mr_slots_unclaim32(&lc->kv->pages, row + from, k, expect, MR_OWNER_TREE);",
           "        (void)0;", T_INS + T_LIFE,
           "cache_unfinished over a row (page size 1): claimed units never given back (duplicates freed as the tree's)"),
    Mutant("LC_ROW_VALS", "csrc/core/lifecycle.c", "    opts.val32 = row;", "    opts.val32 = NULL;", T_LIFE + T_INS + T_DROPIN,
           "cache_unfinished over a row: the insert stores the unwritten scratch instead of the row's KV indices"),
    Mutant("LC_ROW_WIDEN", "csrc/core/lifecycle.c", "i < len; i++) {\n            wide[i] = row[i];",
           "i < len; i++) {\n            wide[i] = row[i] + 1;",
           T_INS + T_LIFE + ["tests/core/test_batch_refusal_entries.py", "tests/core/test_lifecycle_refused_batches.py",
                             "tests/core/test_error_entries.py"],
           "cache_unfinished over a row: the checking pass reads the row's KV indices off by one"),
    Mutant("LC_ROW_PATH", "csrc/core/lifecycle.c", "mr_node_values(n) + (a - start), (size_t)(b - a)",
           "mr_node_values(n) + (a - start) + 1, (size_t)(b - a)",
           T_LIFE + T_TAKE + ["tests/c/test_c_lifecycle.py", "tests/core/test_batch_outputs.py", "tests/core/test_req_state.py",
                              "tests/core/test_match_int64_keys.py"],
           "the prefix's KV indices copied from the tree into the row one token late"),
    Mutant("RX_VALS_OUT", "csrc/core/radix.c", "            dst[i] = v[i];\n", "            dst[i] = v[i] + (i == 1);\n",
           T_TAKE + T_LIFE + ["tests/c/test_c_core.py"],
           "a val32 tree's KV indices widened wrong (matches, node values, evictions without free_kv32)"),
    Mutant("RX_VALS_DUP32", "csrc/core/radix.c", "                    dup_out[ndup + i - pos - start] = opts->val32[i];",
           "                    dup_out[ndup + i - pos - start] = opts->val32[i - 1];", T_INS + T_LIFE,
           "an insert over a row reports the wrong KV indices as duplicates"),
    Mutant("LC_INS_AGAIN", "csrc/core/lifecycle.c", "    if (again >= 0) {\n        int64_t at = -1;",
           "    if (0) {\n        int64_t at = -1;", T_INS, "insert: an index listed twice is not refused (skipped check)"),
    Mutant("LC_INS_BAD", "csrc/core/lifecycle.c", "            *bad = (int64_t)mine + at;", "            *bad = at;", T_INS,
           "insert refusal: the repeated index reported relative to the tree's prefix"),
    Mutant("LC_INS_WHOLE", "csrc/core/lifecycle.c",
           "mr_kv_distinct(lc->kv, val + mine, (int64_t)(len - mine), (int64_t)mine, &at)",
           "mr_kv_distinct(lc->kv, val, (int64_t)len, 0, &at)", T_INS,
           "insert: a repeat inside the tree's own prefix refused too (SGLang ignores it)"),
    Mutant("LC_BATCH_PAGES", "csrc/core/lifecycle.c",
           "        need_pages += ((int64_t)lens[i] - st->prefix_len + ps - 1) / ps;",
           "        need_pages += ((int64_t)lens[i] - st->prefix_len) / ps;", T_LIFE + ["tests/c/test_c_lifecycle.py"],
           "batch admission: a partial last page not counted (rounds down)"),
    # int64 keys, the leaf heap (csrc/core/radix.c)
    Mutant("TR_C64_NARROW", "csrc/core/radix.c", "^ ((uint64_t)b[i + j] + UINT64_C(0x80000000));",
           "^ (uint64_t)((uint32_t)b[i + j] ^ UINT32_C(0x80000000));", T_INT64,
           "int64 key compared narrowed to 32 bits in the blocks"),
    Mutant("TR_C64_EXIT", "csrc/core/radix.c", "        if (d != 0) {\n            break;\n        }\n        i += 32;",
           "        if (d == 0) {\n            break;\n        }\n        i += 32;", T_INT64,
           "int64 key blocks: the block with a difference skipped (inverted test)", fast=True),
    Mutant("TR_HEAP_PARENT", "csrc/core/radix.c",
           "            if (up != NULL && up != t->root && up->full_lock == 0) {\n                leaf_heap_push",
           "            if (0) {\n                leaf_heap_push", T_HEAP,
           "leaf heap: a parent left a leaf by an eviction is not pushed"),
    Mutant("TR_HEAP_PLOCK", "csrc/core/radix.c", "up != NULL && up != t->root && up->full_lock == 0)",
           "up != NULL && up != t->root)", T_HEAP, "leaf heap: a locked parent pushed (skipped lock)"),
    Mutant("TR_HEAP_SIFT", "csrc/core/radix.c", "if (c + 1 < len && leaf_ent_less(&h[c + 1], &h[c])) {",
           "if (c + 1 < len && leaf_ent_less(&h[c], &h[c + 1])) {", T_HEAP, "leaf heap: sift-down takes the larger child"),
    Mutant("TR_HEAP_BUILD", "csrc/core/radix.c", "for (size_t i = k / 2; i-- > 0;) {", "for (size_t i = k / 2; i-- > 1;) {",
           T_HEAP, "leaf heap build: the root never sifted (off by one)"),
    Mutant("TR_HEAP_MRU", "csrc/core/radix.c", "MR_POLICY_MRU ? -(int64_t)n->rank : leaf_order_key(t, n);",
           "MR_POLICY_MRU ? (int64_t)n->rank : leaf_order_key(t, n);", T_HEAP, "MRU's heap key not reversed (LRU order)"),
    # the adaptive state policy (csrc/core/radix.c, "Adaptive")
    Mutant("AD_VICTIM", "csrc/core/radix.c", "if (v == NULL || h < vh) {",
           "if (v == NULL || h > vh) {", T_ADAPT, "adaptive: the state of largest priority goes"),
    Mutant("AD_USES", "csrc/core/radix.c", "        best->ad_f++;\n", "", T_ADAPT,
           "adaptive: a match's use does not count (no frequency)"),
    Mutant("AD_SUPERSEDE", "csrc/core/radix.c", "return a != t->root && !branched && !a->forked ? a : NULL;",
           "return a != t->root && !branched ? a : NULL;", T_ADAPT,
           "adaptive: a state whose own node branched is superseded too"),
    Mutant("AD_FORKED", "csrc/core/radix.c", "    n->forked |= n->nchildren > 1;\n", "", T_ADAPT,
           "adaptive: no node is ever marked as branched (every continuation supersedes)"),
    Mutant("AD_GHOST", "csrc/core/radix.c", "if (t->ghosts != NULL) {   /* out of memory: no ghost, nothing else lost */",
           "if (0) {", T_ADAPT, "adaptive: a removed leaf leaves no ghost"),
    Mutant("AD_SPLIT_PLACED", "csrc/core/radix.c", "    upper->placed = child->placed;\n", "",
           ["tests/core/test_tree_adaptive_place.py"],
           "adaptive placement: a split forgets that the branch ended at a predicted junction"),
    Mutant("AD_PLACE_CHUNKED", "csrc/core/radix.c",
           "if (t->opt.chunked_prefill_size > 0 && len - s > t->opt.chunked_prefill_size) {", "if (0) {",
           ["tests/core/test_tree_adaptive_place.py", "tests/sim/test_adaptive_place.py"],
           "adaptive placement: a junction is predicted inside a chunked prefill, displacing a chunk end's snapshot"),
    Mutant("AD_SKIP_USED", "csrc/core/radix.c", "j->state < 0 && j->ad_f == 1 && e > s", "j->state < 0 && e > s",
           T_ADAPT + ["tests/core/test_tree_adaptive_place.py"],
           "adaptive placement: a junction whose evicted state a match used gives way to the end snapshot too"),
    Mutant("AD_SKIP_MARGIN", "csrc/core/radix.c",
           "&& (double)AD_PLACE_MARGIN * (double)(b - s) < (double)(e - s);", ";",
           T_ADAPT + ["tests/core/test_tree_adaptive_place.py"],
           "adaptive placement: an unused junction gives way to an end snapshot that spares hardly more"),
    Mutant("AD_SKIP_NONE", "csrc/core/radix.c", "            out->branching_seqlen = -1;   /* the end snapshot instead",
           "            (void)0;   /* the end snapshot instead", T_ADAPT + ["tests/core/test_tree_adaptive_place.py"],
           "adaptive placement: SGLang's junction always, though its last state there was evicted unused"),
    Mutant("AD_END_NONE", "csrc/core/radix.c",
           "if (p == 0 && (p = adaptive_place_end(t, best_len, pos, len)) > 0) {", "if (0) {", T_END,
           "end-relative placement: the end snapshot never moves up"),
    Mutant("AD_END_ONCE", "csrc/core/radix.c", "d <= (size_t)h->top || h->shared != 0) {", "d <= (size_t)h->top) {",
           T_END, "end-relative placement: a request matched again while it waits counts its parting again"),
    Mutant("AD_END_BUCKET", "csrc/core/radix.c", "size_t b = (r - 1) / step;", "size_t b = r / step;", T_END,
           "end-relative placement: a parting one step too deep (a state at a step's end counts a step more)"),
    Mutant("AD_END_SHARED", "csrc/core/radix.c", "if (r < d - (size_t)h->top && r <= reach) {",
           "if (r <= reach) {", T_END,
           "end-relative placement: partings at a branch's top (a system prompt's) count too"),
    Mutant("AD_END_COST", "csrc/core/radix.c",
           "cost = mul_sat(mul_sat(AD_PLACE_MARGIN, t->ad_ends), j);", "cost = 0;", T_END,
           "end-relative placement: continuations past the end cost nothing (a chat's end snapshot moves)"),
    Mutant("AD_END_MIN", "csrc/core/radix.c", "if (n >= AD_NEAR_MIN && gain != UINT64_MAX", "if (gain != UINT64_MAX",
           T_END, "end-relative placement: one parting moves every later end snapshot"),
    Mutant("AD_END_HALVE", "csrc/core/radix.c", "            t->ad_near[i] >>= 1;\n", "", T_END,
           "end-relative placement: old partings never fade"),
    Mutant("AD_PROBATION", "csrc/core/radix.c", "if (!supersedes && t->ad_wanted >= 2 * (uint64_t)t->ad_found + 2) {",
           "if (!supersedes && t->ad_wanted >= 2 * (uint64_t)t->ad_found) {", T_ADAPT,
           "adaptive: probation without evidence (no match has found a ghost yet)"),
    Mutant("AD_PROBATION_SUPERSEDES", "csrc/core/radix.c",
           "if (!supersedes && t->ad_wanted >= 2 * (uint64_t)t->ad_found + 2) {",
           "if (t->ad_wanted >= 2 * (uint64_t)t->ad_found + 2) {", T_ADAPT,
           "adaptive: while the pool thrashes a chat's next turn goes on probation too"),
    Mutant("AD_THRASH_FOUND", "csrc/core/radix.c", "    t->ad_found += best != t->root;\n",
           "    t->ad_found++;\n", T_ADAPT, "adaptive: a match that found no state counts as one that did"),
    Mutant("AD_THRASH_HALVE", "csrc/core/radix.c", "        t->ad_found /= 2;\n", "", T_ADAPT,
           "adaptive: old matches that found a state never fade"),
    Mutant("AD_PAIR_HAND", "csrc/core/radix.c", ": t->ad_continued >= 2 * (uint64_t)t->ad_parted + 4) {",
           ": 0) {", T_ADAPT, "adaptive: a state no match used never hands its value over, though requests go on past"),
    Mutant("AD_PAIR_KIND", "csrc/core/radix.c", "t->ad_continued += kind == AD_GHOST_LOWER;",
           "t->ad_continued += kind != AD_GHOST_UPPER;", T_ADAPT,
           "adaptive: a ghost of a state outside any supersession counts as a request going on past"),
    Mutant("AD_PAIR_UPPER", "csrc/core/radix.c", "        if (c->state >= 0) {\n            return AD_GHOST_UPPER;",
           "        if (0) {\n            return AD_GHOST_UPPER;", T_ADAPT,
           "adaptive: a superseded state's ghost never counts as wanted above its successor"),
    Mutant("AD_PAIR_HALVE", "csrc/core/radix.c", "        t->ad_parted /= 2;\n", "", T_ADAPT,
           "adaptive: old ghost hits on upper states of a supersession never fade"),
    # request records checked by mr_lc_check (csrc/core/lifecycle.c)
    Mutant("LC_CHK_COW", "csrc/core/lifecycle.c", "    if (st->cow_src != -1 && !bound) {", "    if (0) {", T_CHK,
           "check: an unbound row keeping a copy-on-write source passes"),
    Mutant("LC_CHK_MAP", "csrc/core/lifecycle.c",
           "            if (rp->track_map[(size_t)r * (size_t)rp->pp + (size_t)j] != st->track[j]) {",
           "            if (0) {", T_CHK, "check: a track map entry that differs from its record passes"),
    # the drop-in over SGLang's pools (mambaradix/sglang/cache.py)
    Mutant("PY_TAKE_RETRY", "mambaradix/sglang/cache.py", "            self._free_foreign(kv, st)\n            slot = alloc.alloc(1)\n",
           "            self._free_foreign(kv, st)\n", T_TAKE, "_take_mamba_slot: the allocator not asked again after evicting"),
    Mutant("PY_TAKE_PROTECT", "mambaradix/sglang/cache.py", "_, _, kv, st = self._lc.evict(0, 1, protect=protect)",
           "_, _, kv, st = self._lc.evict(0, 1)", T_TAKE, "_take_mamba_slot: the matched node not protected"),
    Mutant("PY_INS_PREFIX", "mambaradix/sglang/cache.py", "_from_numpy(view[at:upto])", "_from_numpy(view[:upto])",
           T_TAKE + T_OPS + ["tests/core/test_lifecycle_insert_dups.py"],
           "insert over SGLang's pools frees the locked prefix with the duplicates"),
    Mutant("PY_INS_PREFIX_T", "mambaradix/sglang/cache.py", "value[at:upto] if view", "value[:upto] if view",
           T_TAKE + T_OPS, "insert over SGLang's pools, a value with no host view (int32, on a device): the locked "
           "prefix freed with the duplicates"),
    Mutant("PY_INS_TOKENS", "mambaradix/sglang/cache.py",
           "            tokens = key.raw_token_ids()", "            tokens = key.token_ids",
           T_OPS + T_DROPIN, "insert ignores the key's limit"),
    Mutant("LC_TABLE_END", "csrc/core/lifecycle.c", "    if (differ > *table_end) {", "    if (0) {",
           T_TONLY + T_TAKE + T_DROPIN, "tree-only cache_unfinished never asks the caller to rewrite the duplicates"),
    Mutant("LC_ROW_DUPS", "csrc/core/lifecycle.c", "    if (differ > pl && has_pools(lc)) {", "    if (0) {",
           T_LIFE + T_TAKE + T_DROPIN + T_DRIVER, "cache_unfinished over our pools leaves the freed duplicates in the row"),
    Mutant("PY_TABLE_END", "mambaradix/sglang/cache.py", "            pool.write((row, slice(p, end)), _to_device(prefix[p:end]",
           "            pool.write((row, slice(p, p)), _to_device(prefix[p:p]", T_TAKE + T_DROPIN,
           "the drop-in over SGLang's pools leaves the freed duplicates in the row"),
    Mutant("PY_INS_NEG_LIMIT", "mambaradix/sglang/cache.py", '            count(limit, "insert(): key.limit")',
           "            pass", T_OPS + T_DROPIN + ["tests/dropin/test_dropin_bad_input.py"],
           "insert takes a negative key limit"),
    Mutant("PY_MATCH_NEG_LIMIT", "mambaradix/sglang/cache.py",
           'limit = -1 if key.limit is None else count(key.limit, "match_prefix(): key.limit")',
           "limit = -1 if key.limit is None else key.limit", T_OPS + T_DROPIN + ["tests/dropin/test_dropin_bad_input.py"],
           "match takes a negative key limit"),
    Mutant("PY_INS_EXIST", "mambaradix/sglang/cache.py", "return InsertResult(pl, 0, node, bool(existed))",
           "return InsertResult(pl, 0, node, False)", T_OPS + T_DROPIN + T_TAKE, "insert never reports mamba_exist"),
    Mutant("PY_MATCH_LIMIT", "mambaradix/sglang/cache.py", "plain = (key.extra_key is None and key.limit is None and not key.is_bigram\n",
           "plain = (key.extra_key is None and not key.is_bigram\n", T_OPS + T_DROPIN + T_TAKE,
           "a plain match ignores the key's limit"),
    Mutant("PY_MATCH_NS", "mambaradix/sglang/cache.py", "plain = (key.extra_key is None and key.limit is None and not key.is_bigram\n",
           "plain = (key.limit is None and not key.is_bigram\n", T_OPS + T_DROPIN,
           "a plain match ignores the key's namespace"),
    Mutant("PY_MATCH_BIGRAM", "mambaradix/sglang/cache.py", "plain = (key.extra_key is None and key.limit is None and not key.is_bigram\n",
           "plain = (key.extra_key is None and key.limit is None\n", T_OPS + T_DROPIN,
           "a one-token bigram key (empty) matched as its token"),
    Mutant("PY_MATCH_COW", "mambaradix/sglang/cache.py", "                 and (not params.cow_mamba or params.req is None))",
           "                 )", T_TAKE + T_DROPIN + T_RECORD, "match_prefix(cow_mamba=True) without the copy-on-write"),
    Mutant("PY_MATCH_TENSOR", "mambaradix/sglang/cache.py",
           "            except TypeError:   # a key C does not read (an empty tensor): the general path decides\n"
           "                plain = False",
           "            except TypeError:   # a key C does not read (an empty tensor): the general path decides\n"
           "                raise", T_OPS + T_DROPIN, "an empty tensor key raises instead of missing"),
    Mutant("PY_MATCH_NS_NEW", "mambaradix/sglang/cache.py", "        if ns < 0:  # a namespace never inserted: nothing can match\n            return None",
           "        if ns < 0:  # a namespace never inserted: nothing can match\n            ns = 0", T_OPS + T_DROPIN,
           "a match in a namespace never inserted looks in the default one"),
    Mutant("PY_NODE_ROOT", "mambaradix/sglang/cache.py", "self._handles: Dict[int, TreeNode] = {rid: self.root_node}",
           "self._handles: Dict[int, TreeNode] = {}", T_OPS + T_DROPIN + T_TAKE,
           "a miss returns a new handle of the root, not cache.root_node"),
    Mutant("PY_NODE_GEN", "mambaradix/sglang/cache.py", "        if h is None or h._gen != gen:\n",
           "        if h is None:\n", T_OPS + T_DROPIN, "a reused node id gets the handle of the node it named before"),
    # ---- free calls as SGLang's (a paged allocator's free list depends on them)
    Mutant("LC_DUP_RUNS", "csrc/core/lifecycle.c", "        lc->ends[i] = (int64_t)(depth - d0);",
           "        lc->ends[i] = (int64_t)(pl - d0);", T_PAGED,
           "an insert's duplicates freed in one call instead of one per node"),
    Mutant("LC_TAIL_FIRST", "csrc/core/lifecycle.c",
           "    if (rc == MR_OK) {\n        rc = out_kv(lc, tail, ntail);\n    }\n"
           "    for (size_t i = 0, from = 0; i < lc->nends && rc == MR_OK; from = (size_t)lc->ends[i++]) {\n"
           "        rc = out_kv(lc, lc->b + from, (size_t)lc->ends[i] - from);\n    }\n",
           "    for (size_t i = 0, from = 0; i < lc->nends && rc == MR_OK; from = (size_t)lc->ends[i++]) {\n"
           "        rc = out_kv(lc, lc->b + from, (size_t)lc->ends[i] - from);\n    }\n"
           "    if (rc == MR_OK) {\n        rc = out_kv(lc, tail, ntail);\n    }\n", T_PAGED,
           "tree-only cache_finished hands out the duplicates before the tail"),
    Mutant("PY_FREE_CALLS", "mambaradix/sglang/cache.py", "            if self.page_size == 1:\n                free(self._indices(kv))",
           "            if True:\n                free(self._indices(kv))", T_PAGED,
           "over SGLang's paged allocator, what the lifecycle hands out is freed in one call"),
    # the trusting paths (MR_VERIFY_TRUSTED off in this build) and the keys-only tree
    Mutant("SA_TREE_COUNT", "csrc/core/slot_alloc.c", "        s->n_tree -= k;\n        ring_put32(s, tok, k);",
           "        ring_put32(s, tok, k);", T_LIFE + T_CHK + ["tests/dropin/test_sglang_dropin.py"],
           "a tree eviction's trusted free leaves the tree-owned count as it was"),
    Mutant("SA_TREE_OWNER", "csrc/core/slot_alloc.c", "            owner[tok[i]] = MR_OWNER_FREE;",
           "            owner[tok[i]] = MR_OWNER_TREE;", T_LIFE + T_CHK + ["tests/dropin/test_sglang_dropin.py"],
           "a tree eviction's trusted free leaves the units owned by the tree"),
    Mutant("LC_HELD_COUNT", "csrc/core/lifecycle.c",
           "            nheld += ou == MR_OWNER_HELD;   /* past mine, kv_refusal accepts HELD only */",
           "            /* not counted */", T_LIFE + T_CHK + T_INS,
           "an insert's transfer is told there are no HELD units among those it moves"),
    Mutant("LC_HELD_BEFORE", "csrc/core/lifecycle.c", "            held_new -= owner[val[i]] == MR_OWNER_HELD;",
           "            (void)0;", T_LIFE + T_CHK + T_INS + T_TONLY,
           "an insert's transfer counts the HELD units of the duplicates (the longer part) as moved"),
    Mutant("LC_HELD_NEW", "csrc/core/lifecycle.c", "            held_new += owner[val[i]] == MR_OWNER_HELD;",
           "            (void)0;", T_LIFE + T_CHK + T_INS + T_TONLY,
           "an insert's transfer is told none of the new tokens' units (the shorter part) are HELD"),
    Mutant("LC_HELD_GROUP", "csrc/core/lifecycle.c", "pass_held = grp ? 1 : MR_OWNER_HELD;",
           "pass_held = MR_OWNER_HELD;", T_INS,
           "an insert takes a unit an open alloc group holds for its next alloc(1)"),
    Mutant("LC_FREE_COUNTED", "csrc/core/lifecycle.c",
           "mr_slots_free_counted(&lc->kv->pages, dup, (int64_t)out->ndup, held - held_new);",
           "mr_slots_free_counted(&lc->kv->pages, dup, (int64_t)out->ndup, 0);", T_LIFE + T_CHK + T_INS,
           "an insert's duplicate frees are told none of them are HELD"),
    Mutant("RX_NOVAL_SPLIT", "csrc/core/radix.c", "        memmove(ckey, ckey + p, rest * sizeof(int32_t));",
           "        (void)0;", ["tests/core/test_tree_differential.py", "tests/core/test_tree_keys_only.py"],
           "a keys-only tree's split leaves the lower node's tokens unshifted"),
    Mutant("RX_FROM_VISIT", "csrc/core/radix.c", "        pol->on_insert_visit(t, child);",
           "        if (nwalk == 0) { pol->on_insert_visit(t, child); }",
           ["tests/core/test_lifecycle.py", "tests/dropin/test_sglang_pools_oracle.py", "tests/c/test_c_core.py"],
           "an insert from a request's locked node refreshes none of the nodes it passes"),
    Mutant("LC_FROM_MINE", "csrc/core/lifecycle.c", "    size_t mine = from != NULL ? prev : has_pools(lc)",
           "    size_t mine = from != NULL ? 0 : has_pools(lc)", T_LIFE + T_CHK + T_DECIDE,
           "an end-of-prefill insert from the locked node checks the locked prefix's indices as the caller's"),
    Mutant("LC_KEYS_FIT", "csrc/core/lifecycle.c",
           "                int64_t at = join_tokens(k, i, lo, hi, lc->bk + off);\n                if (at >= 0) {",
           "                int64_t at = join_tokens(k, i, lo, hi, lc->bk + off);\n                if (0) {",
           ["tests/core/test_lifecycle.py", "tests/core/test_int_arrays.py", "tests/core/test_batch_outputs.py"],
           "unfinished_batch / finish_batch narrow an int64 key's token outside int32 instead of refusing it"),
    Mutant("LC_TAIL_RANGE", "csrc/core/lifecycle.c",
           "    if (from < len && mr_narrow_i32(tokens64 + from, len - from, lc->kb + from)) {",
           "    if (from < len && (mr_narrow_i32(tokens64 + from, len - from, lc->kb + from), 0)) {",
           ["tests/core/test_lifecycle.py", "tests/core/test_int_arrays.py"],
           "an end-of-request insert narrows an int64 key's token outside int32 instead of refusing it"),
    Mutant("CM_NARROW_BLOCK", "csrc/core/common.h",
           "            out |= (x + bias) >> shift;\n            dst[j] = (int32_t)(uint32_t)x;",
           "            dst[j] = (int32_t)(uint32_t)x;",
           ["tests/core/test_int_arrays.py", "tests/core/test_binding_args.py", "tests/core/test_tree_bad_input.py"],
           "narrowing an int64 key misses a token outside int32 inside a whole cache line of tokens"),
    Mutant("CM_FITS_BLOCK", "csrc/core/common.h",
           "            out |= ((uint64_t)src[j] + UINT64_C(0x80000000)) >> 32;",
           "            (void)0;",
           ["tests/core/test_int_arrays.py", "tests/core/test_lifecycle.py", "tests/core/test_match_int64_keys.py"],
           "an in-place int64 key's check misses a token outside int32 inside a whole cache line of tokens"),
    Mutant("LC_K64_RANGE", "csrc/core/lifecycle.c",
           "        if (k64 != NULL && !mr_fits_i32(k64 + m.kv_matched_len, lens[i] - m.kv_matched_len)) {",
           "        if (0) {", ["tests/core/test_lifecycle.py", "tests/core/test_int_arrays.py"],
           "prefill_batch accepts an in-place int64 key with a token outside int32 past its match"),
    Mutant("RL_KV_EVICT", "csrc/core/rules.h", "    return available < need ? need : 0;",
           "    return available < need ? need - available : 0;",
           ["tests/core/test_lifecycle.py", "tests/core/test_rules.py", "tests/sim/test_sim_engine.py"],
           "KV evictions ask for the shortfall, not for all SGLang asks for"),
    Mutant("RL_EXT_NEED", "csrc/core/rules.h", "    return page == 1 ? extend_total : extend_total + num_reqs * page;",
           "    return extend_total;",
           ["tests/core/test_lifecycle.py", "tests/core/test_rules.py", "tests/dropin/test_sglang_pools_oracle_paged.py"],
           "a paged extend evicts for its tokens only, without SGLang's page a request"),
    # the namespace table and the ownership checks (csrc/core/nstable.c, idset.c, slot_alloc.c)
    Mutant("NS_UNKNOWN", "csrc/core/nstable.c", "    if (!create) {\n        *id = -1;", "    if (!create) {\n        *id = 0;",
           ["tests/c/test_c_core.py", "tests/core/test_lifecycle_tree_view.py", "tests/dropin/test_sglang_oracle.py"],
           "a lookup without create of a name never seen gives the default namespace, not -1"),
    Mutant("OWN_FROM", "csrc/core/idset.c", "    size_t from = cached < prev ? cached : prev;", "    size_t from = prev;",
           ["tests/c/test_c_core.py", "tests/core/test_ownership_checks.py"],
           "check_ownership trusts prev_prefix_len past what the tree caches"),
    Mutant("KV_WHY_PENDING", "csrc/core/slot_alloc.c",
           "out->why = o == MR_OWNER_PENDING ? MR_KV_WHY_PENDING : MR_KV_WHY_FREE;", "out->why = MR_KV_WHY_FREE;",
           ["tests/c/test_c_core.py", "tests/core/test_pools.py"],
           "a refused free of a unit freed in the open free group is explained as already free"),
    Mutant("PY_HIDE_KV", "csrc/py/py_radix.c", "mr_i64_array(out.kv, want ? out.nkv : 0)", "mr_i64_array(out.kv, out.nkv)",
           ["tests/core/test_tree_differential.py", "tests/core/test_tree_keys_only.py",
            "tests/core/test_ownership_checks.py"],
           "evict_full(indices=False) on a check_ownership tree returns the indices"),
    # the SGLang front ends' argument checks (mambaradix/sglang/_check.py, unified.py)
    Mutant("PY_IDX_DTYPE", "mambaradix/sglang/_check.py",
           "    if x.dtype not in INT_DTYPES:\n        raise TypeError(f\"{name} must be an integer tensor",
           "    if False:\n        raise TypeError(f\"{name} must be an integer tensor",
           ["tests/dropin/test_dropin_bad_input.py", "tests/dropin/test_pool_write.py"],
           "a float or bool index tensor (a value, indices to free, a table write) is converted, not refused"),
    Mutant("PY_NEEDS_SGLANG", "mambaradix/sglang/unified.py", "    except ImportError as e:\n        why = str(e)",
           "    except KeyError as e:\n        why = str(e)",
           ["tests/dropin/test_unified_needs_sglang.py", "tests/dropin/test_sglang_unified.py"],
           "mambaradix.sglang.unified without SGLang 0.5.23 raises the bare import error, not that 0.5.23 is needed"),
    # ---- the simulator's input checks and its record of every key seen
    Mutant("SIM_KV_NEED", "csrc/core/rules.h", "    positions -= overlap ? 0 : 1;", "    positions -= 1;",
           ["tests/sim/test_sim_inputs.py", "tests/sim/test_sim_cli.py", "tests/sim/test_driver_bad_input.py"],
           "a request's KV need forgets the overlap scheduler's step past the finish"),
    Mutant("SIM_FINITE", "mambaradix/sim/checks.py", "and math.isfinite(value) and", "and",
           ["tests/sim/test_sim_inputs.py", "tests/sim/test_sim_first_run.py"],
           "an infinite SimConfig number (utility_alpha, a cost) passes the field check"),
    Mutant("SIM_SEEN_FLUSH", "mambaradix/sim/engine.py",
           "            if self.unseen:\n                self._flush_seen()\n", "",
           ["tests/sim/test_sim_inputs.py", "tests/sim/test_sim_engine.py", "tests/sim/test_hash_block_prompts.py"],
           "the record of every key seen is read without the inserts it deferred"),
    # ---- issue 29: refused batches, child holes, lock kinds, flags, batch rows
    Mutant("LC_PLAN_KV_LATE", "csrc/core/lifecycle.c",
           "            || need_pages * ps > mr_kv_available(lc->kv) + (int64_t)ts.full_evictable) {", "            ) {",
           ["tests/core/test_lifecycle_refused_batches.py", "tests/c/test_c_lifecycle.py"],
           "prefill_batch learns that KV is short only after evicting for it (a refused batch empties the tree)"),
    Mutant("LC_PLAN_KV_TIGHT", "csrc/core/lifecycle.c",
           "            || need_pages * ps > mr_kv_available(lc->kv) + (int64_t)ts.full_evictable) {",
           "            || need_pages * ps > mr_kv_available(lc->kv)) {",
           ["tests/core/test_lifecycle.py", "tests/c/test_c_lifecycle.py"],
           "prefill_batch refuses a batch whose KV eviction would make room"),
    Mutant("LC_PLAN_SLOTS_LATE", "csrc/core/lifecycle.c",
           "            || (short_slots > 0 && mr_radix_states_evictable_min(lc->tree, short_slots) < short_slots)\n",
           "", ["tests/core/test_lifecycle_refused_batches.py", "tests/c/test_c_lifecycle.py"],
           "prefill_batch learns that state slots are short only after the headroom eviction"),
    Mutant("LC_PLAN_ROWS_LATE", "csrc/core/lifecycle.c",
           "        if ((int64_t)n > mr_slots_available(&lc->rp->rows)\n            || (short_slots",
           "        if ((short_slots", ["tests/core/test_lifecycle_refused_batches.py", "tests/c/test_c_lifecycle.py"],
           "prefill_batch learns that rows are short only after evicting (20 requests for 8 rows)"),
    Mutant("LC_DECODE_LATE", "csrc/core/lifecycle.c",
           "    if (need > mr_kv_available(lc->kv) + (int64_t)ts.full_evictable) {", "    if (0) {",
           ["tests/core/test_lifecycle_refused_batches.py", "tests/c/test_c_lifecycle.py"],
           "a decode step evicts before learning it cannot have its KV"),
    Mutant("LC_UNF_LATE", "csrc/core/lifecycle.c",
           "    if (rc == MR_OK && short_slots > 0 && mr_radix_states_evictable_min(lc->tree, short_slots) < short_slots) {",
           "    if (0) {", ["tests/core/test_lifecycle_refused_batches.py", "tests/c/test_c_lifecycle.py"],
           "unfinished_batch caches the rows before the one short of a state slot, then refuses"),
    Mutant("RP_ROWS_TWICE", "csrc/core/req_pool.c", "        if (!mr_reqpool_in_use(p, rows[i]) || mark[rows[i]]) {",
           "        if (!mr_reqpool_in_use(p, rows[i])) {",
           ["tests/core/test_error_entries.py", "tests/c/test_c_lifecycle.py"],
           "a batch call takes a row listed twice (finish_batch finished it, then refused)"),
    Mutant("RX_ADD_OVERWRITE", "csrc/core/radix.c",
           "    else if (i == n->nent || n->children[i].child != NULL) {",
           "    else if (i == n->nent || n->children[i].child == NULL) {",
           ["tests/core/test_tree_many_siblings.py", "tests/c/test_c_core.py", "tests/core/test_tree_differential.py"],
           "an added child overwrites the live sibling at its place instead of shifting it"),
    Mutant("RX_KV_LOCK", "csrc/core/radix.c", "    node->kv_lock++;", "    node->nostate_lock++;",
           ["tests/core/test_tree_lock_kinds.py", "tests/core/test_tree_leaf_orders.py", "tests/core/test_can_evict_state.py"],
           "a KV-only lock counts as a tombstone lock: dec_lock_ref releases it (v0.5.15)"),
    Mutant("PY_BOOL_TRUTH", "csrc/py/py_args.c",
           "    PyErr_Format(PyExc_TypeError, \"%s() argument '%s' must be bool, not %.100s\", fname, arg, Py_TYPE(o)->tp_name);\n"
           "    return -1;",
           "    *out = PyObject_IsTrue(o);\n    return *out < 0 ? -1 : 0;",
           ["tests/core/test_bool_flags.py", "tests/core/test_binding_args.py"],
           "flags are truth-tested: check_ownership=\"false\" turns the checks on"),
    # the driver's refusal of a request that can never run (mambaradix/driver.py)
    Mutant("DRV_NEED_ADMIT", "csrc/core/rules.h", "__builtin_add_overflow(admit, page + 1, &admit)",
           "__builtin_add_overflow(admit, page, &admit)",
           ["tests/sim/test_driver_bad_input.py", "tests/sim/test_driver.py"],
           "a request one KV token over what admission needs is accepted: run() spins"),
    Mutant("DRV_NEED_ROW", "mambaradix/driver.py",
           "return kv, prompt_len + output_len - (0 if config.overlap else 1)",
           "return kv, prompt_len + output_len", ["tests/sim/test_driver_bad_input.py", "tests/sim/test_driver.py"],
           "submit() refuses a request that fills its row without the overlap scheduler's extra step"),
    # ---- the offline hit-rate bound (mambaradix/sim/bound.py, docs/bound.md)
    Mutant("BND_CAPACITY", "mambaradix/sim/bound.py", "C = max(0, int(cfg.state_slots) - held_slots(cfg.mode))",
           "C = max(0, int(cfg.state_slots) - held_slots(cfg.mode) + 1)", T_BOUND,
           "the bound lets one more state stand than the slots the admitted request leaves"),
    Mutant("BND_LATEST", "mambaradix/sim/bound.py", "        child.latest = j\n", "        child.latest = child.latest\n",
           T_BOUND, "a hit's interval starts at the first request that touched its prefix, not the last"),
    Mutant("BND_STAND", "mambaradix/sim/bound.py", "    first = as_ + 1\n", "    first = as_\n", T_BOUND,
           "a hit also stands at its last toucher's own admission"),
    Mutant("BND_PAGE", "mambaradix/sim/bound.py", "            p = hi // page * page", "            p = hi",
           T_BOUND, "candidate hits off the page grid"),
    Mutant("BND_CAP", "mambaradix/sim/bound.py", "limit = match_key_limit(len(r.input_ids), cap)",
           "limit = len(r.input_ids)", T_BOUND, "candidate hits past SGLang's match cap"),
    Mutant("BND_ORDER", "mambaradix/sim/bound.py",
           "order = sorted(range(len(requests)), key=lambda i: (float(requests[i].arrival), i))",
           "order = list(range(len(requests)))", T_BOUND, "requests taken in list order, not by arrival"),
    Mutant("BND_DUAL", "mambaradix/sim/bound.py", "        red = g - pi[h] + pi[t]", "        red = g - pi[h] - pi[t]",
           T_BOUND, "the dual certificate's reduced gains with the tail's potential's sign flipped"),
    Mutant("BND_FAST", "mambaradix/sim/bound.py", "np.cumsum(cover).max() > C:", "np.cumsum(cover).max() > C + 1:",
           T_BOUND, "the no-LP shortcut taken when one admission stands under C + 1 hits"),
    Mutant("BND_SHARED", "mambaradix/sim/bound.py",
           "        return int(cfg.page_size), bool(cfg.match_cap), room",
           "        return int(cfg.page_size), bool(cfg.match_cap), None",
           ["tests/sim/test_bound_cli.py", "tests/package/test_docs.py"],
           "a sweep's points share one bound whatever their state pools"),
    Mutant("BND_CLI_POINT", "mambaradix/sim/cli.py", "points[-1].bound = _bound_of(bounds, config,",
           "points[-1].bound = _bound_of(bounds, base,", ["tests/sim/test_bound_cli.py", "tests/sim/test_sim_cli.py"],
           "--bound reports the base configuration's bound at every sweep point"),
    Mutant("LC_STATE_OWNER", "csrc/core/lifecycle.c",
           "    if (owner != MR_OWNER_HELD && (owner < 1 || lc->rp == NULL || owner > lc->rp->size)) {",
           "    if (owner != MR_OWNER_HELD && owner < 1) {",
           ["tests/core/test_binding_refusals.py", "tests/c/test_c_lifecycle.py"],
           "alloc_state gives a slot to a row past the pool's last (owned by a row that does not exist)"),
    Mutant("LC_FRESH_RUNNING", "csrc/core/lifecycle.c", "    else if (fresh == st->running\n", "    else if (0\n",
           ["tests/core/test_binding_refusals.py", "tests/c/test_c_lifecycle.py"],
           "cache_unfinished takes the request's running slot as the node's: one slot, two owners"),
    Mutant("K_RANGE_END", "csrc/tensor/state_pool.c", "        if (x[i] < 0 || x[i] >= end) {",
           "        if (x[i] < 0 || x[i] > end) {", T_KERN + ["tests/c/test_c_core.py"],
           "clear_slots takes slot num_slots + 1 and snapshot_ssm_from_h the chunk past h's last"),
    Mutant("K_AGREE_LEN", "csrc/tensor/state_pool.c", "    if (a->n != b->n) {", "    if (0) {",
           T_KERN + ["tests/c/test_c_core.py"], "a kernel's index arguments of different lengths are read as one"),
    # the tree's calls as the front ends make them (csrc/core/radix_ops.c)
    Mutant("OPS_COUNT_ONLY", "csrc/core/radix_ops.c", "    out->count_only = !want_kv && owned == NULL;",
           "    out->count_only = !want_kv;",
           ["tests/core/test_tree_differential.py", "tests/core/test_ownership_checks.py",
            "tests/core/test_tree_keys_only.py"],
           "an eviction with indices=False on a check_ownership tree keeps no indices, so the check never forgets them"),
    Mutant("OPS_LOCK_OTHER", "csrc/core/radix_ops.c",
           "*other = op == MR_UNLOCK ? mr_node_kv_lock(node) : op == MR_UNLOCK_KV ? mr_node_full_lock(node) : 0;",
           "*other = op == MR_UNLOCK ? mr_node_full_lock(node) : op == MR_UNLOCK_KV ? mr_node_kv_lock(node) : 0;",
           ["tests/core/test_tree_lock_kinds.py", "tests/core/test_tree_bad_input.py"],
           "a refused unlock names the wrong kind of lock the node holds"),
    Mutant("OPS_NODEID_GEN", "csrc/core/radix_ops.c",
           "    if (n != NULL && (uint64_t)mr_node_handle(n).gen != ((uint64_t)nodeid >> 32)) {",
           "    if (0) {",
           ["tests/dropin/sglang_0523/test_unified_core.py", "tests/dropin/test_reentrant_unified.py"],
           "a NodeId kept past an eviction that reused its node id names the new node"),
    # ---- the integer reader's conversions and the policy option keys (csrc/core/ints.c, policy_opts.c)
    Mutant("INTS_STRIDE", "csrc/core/ints.c", "(const char *)src + (ptrdiff_t)i * stride",
           "(const char *)src + (ptrdiff_t)i * itemsize", T_POOLS + ["tests/core/test_int_reader_forms.py"],
           "integer reader: a strided buffer read as if contiguous"),
    Mutant("POLICY_WINDOW", "csrc/core/policy_opts.c", '{"evict_window", MR_KEY_WINDOW, 1024,', '{"evict_window", MR_KEY_WINDOW, 1023,',
           ["tests/core/test_policy_options.py", "tests/core/test_tree_adaptive.py"], "policy_options: evict_window's largest value off by one"),
    Mutant("PSEUDO_MIX", "csrc/core/hash_blocks.c", "z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);",
           "z = (z ^ (z >> 28)) * UINT64_C(0x94D049BB133111EB);", ["tests/sim/test_hash_block_prompts.py", "tests/sim/test_sim_inputs.py"],
           "pseudo output tokens: one shift of the mix off by one"),
    Mutant("PSEUDO_FNV", "csrc/core/hash_blocks.c", "h = (h ^ p[i]) * UINT64_C(1099511628211);",
           "h = (h + p[i]) * UINT64_C(1099511628211);", ["tests/sim/test_hash_block_prompts.py", "tests/sim/test_sim_inputs.py"],
           "pseudo output tokens: the rid's hash adds its bytes instead of xoring them"),
    Mutant("BATCH_KEYS_HELD", "csrc/py/py_lifecycle.c", "        Py_XDECREF(nseq);\n    }\n    if (!ok) {",
           "        Py_XDECREF(nseq);\n    }\n    Py_CLEAR(k->seq);\n    if (!ok) {",
           ["tests/core/test_reentrant_calls.py", "tests/core/test_batch_outputs.py"],
           "batch calls: int64 keys read in place no longer held for the call (an __index__ may free them)"),
    Mutant("RS_TUPLE_RANGE", "csrc/py/py_lifecycle.c", "mr_as_int64(PyTuple_GET_ITEM(seq, i), lo, hi, names[i], &v[i])",
           "mr_as_int64(PyTuple_GET_ITEM(seq, i), INT64_MIN, INT64_MAX, names[i], &v[i])",
           ["tests/core/test_reentrant_calls.py", "tests/core/test_req_state.py"],
           "a 13-tuple record's items narrowed without their fields' ranges"),
    Mutant("NEXT_TRACK_RANGE", "csrc/core/lc_check.c", "    case 't':\n        *lo = -1;\n        *hi = 1;",
           "    case 't':\n        *lo = INT32_MIN;\n        *hi = INT32_MAX;", ["tests/core/test_reentrant_calls.py", "tests/core/test_req_state.py"],
           "next_track takes any int32 (the core indexes the two-entry track buffer with it)"),
    Mutant("UNFIN_CACHE_LEN", "csrc/core/lifecycle.c",
           "return lc->cfg.extra_buffer ? st->last_track_seqlen : (int64_t)fill_len;",
           "return lc->cfg.extra_buffer && st->last_track_seqlen >= 0 ? st->last_track_seqlen : (int64_t)fill_len;",
           ["tests/core/test_lifecycle_foreign_results.py", "tests/dropin/test_sglang_oracle.py",
            "tests/sim/test_sim_engine.py", "tests/dropin/test_sglang_decisions.py"],
           "cache_unfinished with nothing tracked caches every fill token (SGLang caches nothing)"),
    Mutant("NS_FORGET", "csrc/core/nstable.c", "    if (id < 1 || id != t->n) {", "    if (id < 1 || id == t->n) {",
           ["tests/core/test_tree_bad_input.py", "tests/core/test_binding_refusals.py"],
           "a refused insert's new namespace stays in the table (takes an id)"),
    Mutant("LCC_OUT_POS", "csrc/core/lc_check.c", "    j -= keys->lens[i];\n", "",
           ["tests/core/test_batch_refusal_entries.py", "tests/core/test_batch_outputs.py"],
           "a refused output token is named at its position in the joined sequence, not in the output"),
    Mutant("LCC_TWICE_AT", "csrc/core/lc_check.c", "return say(why, MR_LC_WHY_ROW_TWICE, at, j, rows[at]);",
           "return say(why, MR_LC_WHY_ROW_TWICE, at, at, rows[at]);",
           ["tests/core/test_batch_refusal_entries.py", "tests/core/test_error_entries.py"],
           "a row listed twice names itself as the earlier entry"),
    Mutant("LC_PROTECTED_NEG", "csrc/core/lifecycle.c",
           "    int64_t protected_len = st->protected_len > 0 ? st->protected_len : 0;",
           "    int64_t protected_len = st->protected_len;", ["tests/core/test_lifecycle_foreign_results.py"],
           "cache_finished(is_insert=False) of a record with a negative protected_len reads kv before its start"),
    Mutant("LCR_STALE", "csrc/core/lc_record.c", "return h->rp == NULL || mr_reqpool_gen(h->rp, h->row) == h->gen;",
           "return 1;", T_RECORD,
           "a ReqState whose row was freed behind its back still reads and writes that row (a stale handle)"),
    Mutant("AD_VALUE_RISES", "csrc/core/radix.c", "v = n->ad_eff < v ? n->ad_eff : v;", ";",
           T_ADAPT, "a state's value rises as soon as the states above it are evicted"),
    Mutant("AD_VALUE_KEPT", "csrc/core/radix.c", "v = n->ad_eff < v ? n->ad_eff : v;", "v = n->ad_eff;",
           T_ADAPT, "a state's value stays what it was at its admission though a state is cached above it"),
    Mutant("AD_L_MAX", "csrc/core/radix.c", "if (v != NULL && vh > t->ad_inflation) {", "if (v != NULL) {",
           T_ADAPT, "the adaptive inflation falls to a victim whose value fell below it"),
    Mutant("AD_F_RESTORE", "csrc/core/radix.c", "n->ad_f = n->ad_f > 1 ? n->ad_f : 1;", "n->ad_f = 1;",
           T_ADAPT, "a state recreated where one was evicted starts from one use, not that state's uses"),
    Mutant("AD_HANDOVER", "csrc/core/radix.c", "return v > n->ad_floor ? v : n->ad_floor;", "return v;",
           T_ADAPT, "a state that supersedes a used state counts only its own value, so it goes first"),
    Mutant("AD_HANDOVER_CAP", "csrc/core/radix.c",
           "handed->ad_eff = n->ad_eff < handed->ad_eff ? n->ad_eff : handed->ad_eff;", "(void)handed;",
           T_ADAPT, "a used state superseded by a deeper one keeps its whole value beside the value it handed over"),
    Mutant("AD_HANDOVER_LOCK", "csrc/core/radix.c", "a->reused ? a->full_lock <= 1 && ", "a->reused ? ",
           T_ADAPT, "a state another request runs from hands its value over to the first sibling's new state"),
    Mutant("AD_HANDOVER_FIRST", "csrc/core/radix.c", "a->full_lock <= 1 && a->kid_used == 0 && a->kid_wasted == 0\n", "a->full_lock <= 1\n",
           T_ADAPT, "a shared prefix's state, whose requests' states came and went below it, hands its value over"),
    # ---- counted pools (csrc/core/lifecycle.c, the simulator's)
    Mutant("CNT_PAGE", "csrc/core/lifecycle.c", "lc->cnt.kv_free += ((int64_t)n + page - 1) / page * page;",
           "lc->cnt.kv_free += (int64_t)n;", T_COUNT, "a request's freed tail goes back as tokens, not whole pages"),
    Mutant("CNT_KV_RULE", "csrc/core/lifecycle.c",
           "mr_rule_kv_evict_v(lc->cfg.semantics == MR_SEMANTICS_V0515, lc->cnt.kv_free, evict_below)",
           "mr_rule_kv_evict_v(1, lc->cnt.kv_free, evict_below)", T_COUNT,
           "counted KV eviction follows v0.5.15's rule under v0.5.23 semantics"),
    Mutant("CNT_DONATED", "csrc/core/lifecycle.c", "lc->cnt.donated += !existed;", "lc->cnt.donated += existed;",
           T_COUNT, "a finished request's slot counts as donated when the tree already had the state"),
    Mutant("CNT_COW_PROTECT", "csrc/core/lifecycle.c", "int rc = mr_lc_count_slot(lc, (mr_node *)node, &fresh);",
           "int rc = mr_lc_count_slot(lc, NULL, &fresh);", T_COUNT,
           "the copy-on-write's slot from an empty counted pool may evict the matched state"),
    Mutant("CNT_EOT_AVAIL", "csrc/core/lifecycle.c", ": lc->counted ? lc->cnt.slots_free", ": lc->counted ? -1",
           T_COUNT, "the end-of-turn rule does not see the counted pool's free slots"),
    Mutant("CNT_ROW_KV", "csrc/core/lifecycle.c", "lc->cnt.kv_free += more * page;", "lc->cnt.kv_free += more;",
           T_COUNT, "free_row gives back pages as tokens"),
    Mutant("CNT_VICTIMS", "csrc/core/lifecycle.c", "lc->victim != NULL && s2 < num_states", "lc->victim != NULL && s2 < 1",
           T_COUNT, "a victim policy is asked for one state however many the eviction wants"),
]


def _copy_tree(dst: str) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for f in files:
        if not f or not os.path.isfile(os.path.join(ROOT, f)):
            continue
        os.makedirs(os.path.dirname(os.path.join(dst, f)) or dst, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dst, f))


def _build(d: str) -> Optional[str]:
    env = dict(os.environ, MAMBARADIX_CUDA="0")
    for k in ("MAMBARADIX_SANITIZE", "MAMBARADIX_DEBUG"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=d, env=env,
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stdout + r.stderr)[-2000:]


def _run_tests(d: str, tests: List[str], timeout: int) -> tuple:
    """The failing test functions (file::name), and the output.  When pytest
    itself dies (a crash under the mutant), each file is run on its own and
    a file whose run dies counts as one failure."""
    failed, out = _run_pytest(d, tests, timeout)
    if any(f.startswith("<pytest exit") for f in failed) and len(tests) > 1:
        failed = set()
        for t in tests:
            f1, o1 = _run_pytest(d, [t], timeout)
            failed |= {t + "::<crashed>" if f.startswith("<") else f for f in f1}
            out += o1
    return failed, out


def _run_pytest(d: str, tests: List[str], timeout: int) -> tuple:
    env = dict(os.environ, PYTHONPATH=d, PYTHONDONTWRITEBYTECODE="1")
    env.pop("MAMBARADIX_TEST_SEEDS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", "-m", "not slow"]
    try:
        r = subprocess.run(cmd + tests, cwd=d, env=env, capture_output=True, text=True, timeout=timeout)
        out = r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return {"<timeout: killed by the time limit>"}, out
    failed = set()
    for line in out.splitlines():
        m = re.match(r"(FAILED|ERROR) (\S+?)(\[.*\])?( - .*)?$", line)
        if m:
            failed.add(m.group(2))
    if r.returncode not in (0, 1) and not failed:
        failed.add("<pytest exit %d>" % r.returncode)
    return failed, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    ap.add_argument("--fast", action="store_true", help="only the CI subset")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per mutant's test run")
    a = ap.parse_args(argv)
    sel = [m for m in MUTANTS if (not a.ids or m.id in a.ids) and (not a.fast or m.fast)]
    if a.list:
        for m in MUTANTS:
            print("%-16s %-28s %s%s" % (m.id, m.path, m.what, "  [fast]" if m.fast else ""))
        return 0
    if a.ids and len(sel) != len(a.ids):
        print("unknown mutant id(s):", sorted(set(a.ids) - {m.id for m in MUTANTS}), file=sys.stderr)
        return 2
    d = tempfile.mkdtemp(prefix="mambaradix-mut-")
    t0 = time.time()
    try:
        _copy_tree(d)
        err = _build(d)
        if err:
            print("the unmutated copy does not build:\n" + err, file=sys.stderr)
            return 2
        # the unmutated suite must pass (skipped with --fast: CI ran it just before)
        base, out = (set(), "") if a.fast else _run_tests(d, sorted({t for m in sel for t in m.tests}),
                                                          a.timeout)
        if base:
            print("the unmutated suite fails (%s):\n%s" % (sorted(base), out[-3000:]), file=sys.stderr)
            return 2
        rows = []
        stale = False   # the extension was built with a C mutant since restored
        for m in sel:
            if m.equivalent:
                rows.append((m, "equivalent", [], 0.0))
                continue
            if stale and not m.path.startswith("csrc/"):
                _build(d)   # a Python mutant runs over the unmutated C core
                stale = False
            path = os.path.join(d, m.path)
            with open(path) as f:
                orig = f.read()
            find, repl = m.find, m.repl
            if orig.count(find) != 1:
                rows.append((m, "NOT APPLICABLE (text not found once)", [], 0.0))
                continue
            t1 = time.time()
            with open(path, "w") as f:
                f.write(orig.replace(find, repl))
            try:
                if m.path.startswith("csrc/"):
                    stale = True
                    err = _build(d)
                    if err:
                        rows.append((m, "NOT BUILT", [], time.time() - t1))
                        continue
                failed, _ = _run_tests(d, m.tests, a.timeout)
            finally:
                with open(path, "w") as f:
                    f.write(orig)
                if m.path.startswith("csrc/"):
                    os.utime(path)
            fns = sorted(failed)
            files = {f.split("::")[0] for f in fns}
            verdict = "killed" if len(files) >= 2 else ("WEAK (one file)" if fns else "SURVIVED")
            rows.append((m, verdict, fns, time.time() - t1))
            print("%-16s %-16s %3d tests in %d files %5.0fs  %s"
                  % (m.id, verdict, len(fns), len(files), time.time() - t1,
                     ", ".join(f.split("/")[-1] for f in fns[:6])), flush=True)
        if stale:
            _build(d)
    finally:
        if a.keep:
            print("scratch copy kept:", d)
        else:
            shutil.rmtree(d, ignore_errors=True)
    run = [r for r in rows if r[1] != "equivalent"]
    killed = [r for r in run if r[1].startswith("killed")]
    print()
    print("| mutant | file | what | result | failing tests (files) |")
    print("|---|---|---|---|---|")
    for m, v, fns, _ in rows:
        note = m.equivalent if v == "equivalent" else v
        nfiles = len({f.split("::")[0] for f in fns})
        print("| %s | %s | %s | %s | %d (%d) |" % (m.id, m.path, m.what, note, len(fns), nfiles))
    print()
    print("%d mutants: %d killed, %d survived or weak, %d equivalent (%.0f s)"
          % (len(rows), len(killed), len(run) - len(killed), len(rows) - len(run), time.time() - t0))
    return 0 if len(killed) == len(run) else 1


if __name__ == "__main__":
    sys.exit(main())
