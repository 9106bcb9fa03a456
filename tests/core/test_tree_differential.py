"""Randomized differential tests: the C tree against the reference model.

Every operation (insert, match, lock/unlock, both evictions, reset, and
errors such as unlocking an unlocked node) runs on both; every result, the
four size counters, total_size and node_count are compared after each one,
both `sanity_check()`s run, and the whole trees (paths, KV indices, states,
lock counts) and both LRU orders are compared every few operations.

The seeded runs below add up to a little over 10^5 operations (scale them
with MAMBARADIX_DIFF_SCALE, e.g. 0.1 for a quick run, 10 for a long one);
the `slow` test (run by `-m slow` or MAMBARADIX_SLOW=1) runs 2 * 10^5 more.  The Hypothesis state machine uses the
"ci" profile unless HYPOTHESIS_PROFILE says "dev" (more, longer examples).
"""

import os

import pytest

from tree_helpers import HAVE_C

pytestmark = pytest.mark.skipif(not HAVE_C, reason="mambaradix._C.RadixTree is not built")

from tree_differ import Differ  # noqa: E402

try:
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

    HAVE_HYPOTHESIS = True
except ImportError:  # pragma: no cover
    HAVE_HYPOTHESIS = False

SCALE = float(os.environ.get("MAMBARADIX_DIFF_SCALE", "1"))

# (id, Differ keyword arguments); small alphabets so that prefixes collide.
CONFIGS = [
    ("p1-consumed", dict(page_size=1, chunk_size=4, lru_policy="consumed", alphabet=3)),
    ("p1-sglang", dict(page_size=1, chunk_size=2, lru_policy="sglang", alphabet=3)),
    ("p1-alpha2-c64", dict(page_size=1, lru_policy="consumed", alphabet=2, max_pages=90, max_tokens=300)),
    ("p16-consumed", dict(page_size=16, chunk_size=32, lru_policy="consumed", alphabet=2, max_pages=5, max_tokens=1200)),
    ("p16-sglang", dict(page_size=16, chunk_size=16, lru_policy="sglang", alphabet=2, max_pages=5, max_tokens=1200)),
    ("p4-chunk2-sglang", dict(page_size=4, chunk_size=2, lru_policy="sglang", alphabet=2, max_pages=4, max_tokens=200)),
    # wide fan-out: dozens of children per node
    ("p1-wide", dict(page_size=1, chunk_size=2, lru_policy="consumed", alphabet=40, max_pages=4, max_tokens=300)),
]
SEEDS = [11, 22]
OPS_PER_RUN = 7300  # 7 configs x 2 seeds x 7300 = 102,200 operations
DEEP_EVERY = 3

# Cases each configuration must have hit, so that a run that never reaches
# the interesting paths does not pass silently.
MUST_SEE = [
    "match_hit",
    "match_miss",
    "insert_exists",
    "insert_revive",
    "insert_duplicates",
    "evict_mamba_internal",
    "evict_mamba_leaf",
    "lock_tombstone",
    "unlock_unlocked",
    "orphan_tombstone_leaf",
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cfg", [c[1] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_random_ops_match_reference(cfg, seed):
    d = Differ(seed, deep_every=DEEP_EVERY, **cfg)
    n = max(50, int(OPS_PER_RUN * SCALE))
    d.run(n)
    assert d.ops == n
    if n >= 2000:
        missing = [k for k in MUST_SEE if not d.stats.get(k)]
        assert not missing, "the run never reached %r (stats %r)" % (missing, d.stats)
    if cfg.get("chunk_size") is not None and n >= 2000:
        assert d.stats.get("match_branching"), d.stats


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [c[1] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_random_ops_match_reference_long(cfg, request):
    if "slow" not in (request.config.getoption("markexpr") or "") and not os.environ.get("MAMBARADIX_SLOW"):
        pytest.skip("long run: select it with -m slow or MAMBARADIX_SLOW=1")
    d = Differ(1000 + len(repr(cfg)), deep_every=7, **cfg)
    d.run(int(34000 * SCALE))


# (id, config): the C tree without values, and evictions that only count
VALUE_CONFIGS = [
    ("p1-consumed", dict(page_size=1, chunk_size=4, lru_policy="consumed", alphabet=3)),
    ("p1-sglang", dict(page_size=1, chunk_size=2, lru_policy="sglang", alphabet=3)),
    ("p16-consumed", dict(page_size=16, chunk_size=32, lru_policy="consumed", alphabet=2, max_pages=5,
                          max_tokens=1200)),
    ("p4-chunk2-sglang", dict(page_size=4, chunk_size=2, lru_policy="sglang", alphabet=2, max_pages=4,
                              max_tokens=200)),
]


@pytest.mark.parametrize("values", [False, True], ids=["keys-only", "with-values"])
@pytest.mark.parametrize("cfg", [c[1] for c in VALUE_CONFIGS], ids=[c[0] for c in VALUE_CONFIGS])
def test_keys_only_tree_and_counting_evictions_match_reference(cfg, values):
    """RadixTree(values=False) splits, matches, locks and evicts exactly as
    the model (which keeps values) does, and evict_*(indices=False) counts
    what it releases; whole trees compared every other operation."""
    d = Differ(31, deep_every=2, values=values, hide_indices=0.4, **cfg)
    n = max(50, int(3000 * SCALE))
    d.run(n)
    if n >= 2000:
        missing = [k for k in MUST_SEE if not d.stats.get(k)]
        assert not missing, "the run never reached %r (stats %r)" % (missing, d.stats)


def test_random_ops_every_step_deep():
    """A shorter run that compares the whole trees after every operation."""
    for i, (_, cfg) in enumerate(CONFIGS):
        Differ(500 + i, deep_every=1, **cfg).run(max(50, int(600 * SCALE)))


# ----------------------------------------------------------------------
# Hypothesis state machine (shrinks a divergence to a short sequence)

if HAVE_HYPOTHESIS:
    settings.register_profile(
        "ci",
        max_examples=40,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        derandomize=True,
    )
    settings.register_profile(
        "dev",
        max_examples=400,
        stateful_step_count=120,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

    HYP_CONFIGS = [
        dict(page_size=1, chunk_size=2, lru_policy="consumed", alphabet=2),
        dict(page_size=1, chunk_size=3, lru_policy="sglang", alphabet=3),
        dict(page_size=2, chunk_size=4, lru_policy="consumed", alphabet=2, max_pages=4),
        dict(page_size=4, chunk_size=2, lru_policy="sglang", alphabet=2, max_pages=3),
    ]

    class TreeMachine(RuleBasedStateMachine):
        d = None

        @initialize(cfg=st.sampled_from(HYP_CONFIGS), seed=st.integers(0, 1000))
        def setup(self, cfg, seed):
            self.d = Differ(seed, deep_every=1, **cfg)

        def _key(self, data, for_match):
            d = self.d
            if d.page == 1:
                key = data.draw(st.lists(st.integers(0, d.alphabet - 1), max_size=8), label="key")
            else:
                idx = data.draw(st.lists(st.integers(0, len(d.atoms) - 1), max_size=d.max_pages), label="pages")
                key = [t for i in idx for t in d.atoms[i]]
                if for_match:
                    tail = data.draw(st.lists(st.integers(0, d.alphabet - 1), max_size=d.page - 1), label="tail")
                    key += tail
            return key

        @precondition(lambda self: self.d is not None)
        @rule(data=st.data(), extra=st.sampled_from([None, None, "a"]), prev=st.integers(0, 10))
        def insert(self, data, extra, prev):
            key = self._key(data, False)
            if data.draw(st.booleans(), label="prev0"):
                prev = 0
            self.d.op_insert(key, extra, prev)

        @precondition(lambda self: self.d is not None)
        @rule(data=st.data(), extra=st.sampled_from([None, None, "a"]))
        def match(self, data, extra):
            self.d.op_match(self._key(data, True), extra)

        @precondition(lambda self: self.d is not None)
        @rule(which=st.integers(0, 30))
        def lock(self, which):
            self.d.op_lock(which)

        @precondition(lambda self: self.d is not None and self.d.locks)
        @rule(held=st.integers(0, 30))
        def unlock_held(self, held):
            self.d.op_unlock(held=held)

        @precondition(lambda self: self.d is not None)
        @rule(which=st.integers(0, 30))
        def unlock_any(self, which):
            self.d.op_unlock(which=which)

        @precondition(lambda self: self.d is not None)
        @rule(n=st.integers(0, 12))
        def evict_full(self, n):
            self.d.op_evict_full(n * self.d.page)

        @precondition(lambda self: self.d is not None)
        @rule(n=st.integers(0, 3))
        def evict_mamba(self, n):
            self.d.op_evict_mamba(n)

        @precondition(lambda self: self.d is not None)
        @rule()
        def check_handles(self):
            self.d.op_check_handles()

        @precondition(lambda self: self.d is not None)
        @rule()
        def reset(self):
            self.d.op_reset()

        @invariant()
        def same_trees(self):
            if self.d is not None:
                self.d.ops += 1
                self.d.compare(deep=True)

    TestTreeMachine = TreeMachine.TestCase
