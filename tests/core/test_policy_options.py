"""policy_options of RadixTree and Lifecycle (module.c over
csrc/core/policy_opts.c): which keys each policy takes, their ranges and
the refusals, against the documented keys (docs and SGLang's
eviction_policy_config names) written out by hand."""

from __future__ import annotations

import math

import pytest

from mambaradix import _C

UTILITY_KEYS = ("alpha, flops_per_token, attn_flops_per_pos, state_bytes, kv_bytes_per_token, "
                "evict_window, tune_window, mru, chunked_prefill_size")
WINDOWS = {"evict_window": 1024, "tune_window": 1 << 20, "mru": 1, "chunked_prefill_size": (1 << 31) - 1}


@pytest.mark.parametrize("cls", [_C.RadixTree, _C.Lifecycle])
@pytest.mark.parametrize("policy", ["sglang", "consumed", "utility", "adaptive"])
def test_scoring_policies_take_the_utility_keys(cls, policy):
    name = cls.__name__
    for key, hi in WINDOWS.items():
        cls(lru_policy=policy, policy_options={key: hi})
        with pytest.raises(ValueError) as e:
            cls(lru_policy=policy, policy_options={key: hi + 1})
        assert str(e.value) == f"policy_options['{key}'] must be in [0, {hi}]"
    for bad in (-1.0, math.inf, -math.inf, math.nan, 10**400):      # (an int past a double's range)
        with pytest.raises(ValueError) as e:
            cls(lru_policy=policy, policy_options={"state_bytes": bad})
        assert str(e.value) == f"{name}(): policy_options['state_bytes'] must be finite and >= 0"
    with pytest.raises(TypeError) as e:
        cls(lru_policy=policy, policy_options={"alpha": "x"})
    assert str(e.value) == f"{name}(): policy_options['alpha'] must be a number"
    with pytest.raises(ValueError) as e:
        cls(lru_policy=policy, policy_options={"alpha": 1.0, "threshold": 3})
    assert str(e.value) == (f"{name}(): policy_options has unknown keys for lru_policy '{policy}' "
                            f"(known: {UTILITY_KEYS})")


def test_values_reach_the_policy():
    t = _C.RadixTree(lru_policy="utility", policy_options={"alpha": 0.25, "mru": 1, "evict_window": 7})
    stats = t.policy_stats()
    assert stats["alpha"] == 0.25 and stats["mru"] is True
    assert _C.RadixTree(lru_policy="utility", policy_options={"alpha": 3}).policy_stats()["alpha"] == 3.0


@pytest.mark.parametrize("policy,known", [("slru", "protected_threshold"),
                                          ("tlru", "threshold, next_prompt_estimate"),
                                          ("lfu", "none"), ("fifo", "none"), ("priority", "none")])
def test_leaf_orders_take_their_own_keys(policy, known):
    keys = [k.strip() for k in known.split(",")] if known != "none" else []
    for key in keys:
        _C.RadixTree(lru_policy=policy, policy_options={key: 1 << 60})
        with pytest.raises(ValueError) as e:
            _C.RadixTree(lru_policy=policy, policy_options={key: -1})
        assert str(e.value) == f"policy_options['{key}'] must be in [0, {1 << 60}]"
    with pytest.raises(ValueError) as e:
        _C.RadixTree(lru_policy=policy, policy_options={"alpha": 1.0})
    assert str(e.value) == f"RadixTree(): policy_options has unknown keys for lru_policy '{policy}' (known: {known})"
    with pytest.raises(ValueError) as e:
        _C.Lifecycle(lru_policy=policy)
    assert str(e.value) == ("Lifecycle(): lru_policy must be 'sglang', 'consumed', 'utility' or 'adaptive', "
                            f"not '{policy}'")


@pytest.mark.parametrize("cls", [_C.RadixTree, _C.Lifecycle])
def test_a_mapping_that_fails_raises_its_own_error(cls):
    """A mapping whose lookup raises something other than KeyError: that
    error, not "unknown keys" (the key is not absent, the mapping failed)."""
    class Failing(dict):
        def __getitem__(self, key):
            if key == "evict_window" and key in self:
                raise RuntimeError("the options store is unreachable")
            return super().__getitem__(key)

    with pytest.raises(RuntimeError, match="unreachable"):
        cls(lru_policy="utility", policy_options=Failing(alpha=1.0, evict_window=8))
    # absent keys (KeyError) are still simply absent
    cls(lru_policy="utility", policy_options=Failing(alpha=1.0))
