"""The adaptive policy's rules on small trees worked by hand (docs/adaptive.md):
each state's priority h = L0 + uses * tokens spared (no costs set: the tokens
from the nearest state above, as the tree stands at the eviction, at most
what it was when its uses were set; L0 the inflation then), the victim of least h (ties: the less
recently used), L the highest victim's h, a value at most what it was when
the uses were last set, supersession on a path that never branched only (a
used state handing its value to the state that supersedes it), ghosts of
removed leaves and admission on probation."""

from __future__ import annotations

import mambaradix


def _tree():
    return mambaradix.RadixTree(page_size=1, lru_policy="adaptive")


def _put(tree, key, slot):
    assert not tree.insert(key, list(range(len(key))), slot).state_existed


def _victims(tree, n):
    return [int(tree.evict_mamba(1).state_slots[0]) for _ in range(n)]


def test_uses_keep_a_state_and_a_branch_stops_supersession():
    t = _tree()
    a = [1] * 8
    _put(t, a, 1)                       # h(1) = 0 + 8
    _put(t, a + [5] * 4, 2)             # unbranched below 1: 1 superseded (h 8); h(2) = 4
    assert t.match_prefix(a + [6]).state == 1     # uses 2: h(1) = 0 + 2 * 8 = 16
    _put(t, a + [6] * 4, 3)             # 1 has two children now: not superseded; h(3) = 4
    _put(t, [9] * 12, 4)                # h(4) = 12
    assert _victims(t, 3) == [2, 3, 4]  # 2 and 3 (h 4; 2 the less recently used), then 4 (12) before 1 (16)
    assert t.policy_stats()["adaptive_inflation"] == 12.0
    assert t.policy_stats()["states_superseded"] == 1


def test_a_continuation_supersedes_the_uses_of_the_state_above_it():
    t = _tree()
    a = [1] * 8
    _put(t, a, 1)
    for _ in range(3):
        assert t.match_prefix(a + [7]).state == 1  # h(1) = 0 + 4 * 8 = 32
    _put(t, [9] * 12, 2)                # h(2) = 12
    _put(t, a + [5] * 20, 3)            # supersedes 1: h(1) = 0 + 8; h(3) = 20
    assert _victims(t, 2) == [1, 2]
    assert t.policy_stats()["adaptive_inflation"] == 12.0


def test_a_used_state_hands_its_value_to_the_state_that_supersedes_it():
    """A chat's next turn resumes from the last turn's state and caches a
    state a few tokens deeper: that one takes the value of the state it
    superseded, which keeps at most the newer one's own value (the deeper
    state serves every request the older one served)."""
    for used, want in ((True, [1, 3, 2]), (False, [2, 3, 1])):
        t = _tree()
        a = [1] * 40
        _put(t, a, 1)                       # h(1) = 0 + 40
        if used:
            assert t.match_prefix(a + [7]).state == 1
        _put(t, a + [5] * 4, 2)             # supersedes 1 (uses 1 again; h(1) = 0 + 40, h(2) = 0 + 4) ...
        _put(t, [9] * 12, 3)                # h(3) = 12
        # ... but a used 1 hands 2 its 40 and keeps 4: victims 1 (4), 3 (12), 2 (40)
        assert _victims(t, 3) == want, used
        assert t.policy_stats()["adaptive_inflation"] == 40.0


def test_no_handover_from_a_state_another_request_runs_from_or_one_with_states_below_before():
    """The handover is for a path continued for the first time by the request
    that resumed from it: not when another request holds the superseded
    state's node (a sibling running from a shared step), nor when a state
    was attached below it before (a shared prefix whose requests' states came
    and went)."""
    for locks, want in ((1, [1, 3, 2]), (2, [2, 3, 1])):
        t = _tree()
        a = [1] * 40
        _put(t, a, 1)
        m = t.match_prefix(a + [7])
        assert m.state == 1
        for _ in range(locks):
            t.inc_lock_ref(m.node)
        _put(t, a + [5] * 4, 2)
        for _ in range(locks):
            t.dec_lock_ref(m.node)
        _put(t, [9] * 12, 3)
        assert _victims(t, 3) == want, locks
    t = _tree()
    a = [1] * 40
    _put(t, a, 1)
    _put(t, a + [6] * 4, 9)                 # below 1 (supersedes it: h(1) = 40, h(9) = 4)
    assert t.match_prefix(a + [7]).state == 1     # h(1) = 0 + 2 * 40
    assert _victims(t, 1) == [9]            # evicted unused below 1 (L = 4)
    _put(t, a + [5] * 4, 2)                 # supersedes 1: h(1) = 4 + 40, h(2) = 4 + 4, no handover
    _put(t, [9] * 12, 3)                    # h(3) = 16
    assert _victims(t, 3) == [2, 3, 1]


def test_the_inflation_ages_states_that_are_not_used_again():
    t = _tree()
    _put(t, [1] * 30, 1)
    assert t.match_prefix([1] * 31).state == 1    # h(1) = 0 + 2 * 30 = 60 (and the root's states were used)
    _put(t, [2] * 10, 2)                # h 10
    assert _victims(t, 1) == [2]        # L = 10
    _put(t, [3] * 40, 3)                # h = 10 + 40 = 50: still below 60
    assert _victims(t, 1) == [3]        # L = 50
    _put(t, [4] * 15, 4)                # h = 50 + 15 = 65: now above 60
    assert _victims(t, 1) == [1]
    assert t.policy_stats()["adaptive_inflation"] == 60.0
    assert t.policy_stats()["admissions_probation"] == 0


def test_probation_while_reuses_find_ghosts_rather_than_states():
    """States evicted unused and never asked for again (one-shot requests)
    change nothing; matches that find ghosts more than twice as often as
    states (the pool thrashes on cyclic reuse) put the new states that
    supersede nothing on probation, until a state is found again."""
    t = _tree()
    _put(t, [11] * 4, 1)
    _put(t, [12] * 4, 2)
    assert _victims(t, 2) == [1, 2]     # L = 4; both leaves removed, their ghosts kept
    _put(t, [10] * 4, 5)                # two states wasted, none asked for: admitted as usual
    assert t.policy_stats()["admissions_probation"] == 0
    assert _victims(t, 1) == [5]        # h(5) = 4 + 4: L = 8
    t.match_prefix([11] * 5)            # finds 1's ghost
    t.match_prefix([12] * 5)            # and 2's: wanted 2 >= 2 * 0 + 2, the pool thrashes
    assert t.policy_stats()["ghost_hits"] == 2
    _put(t, [13] * 4, 3)                # supersedes nothing: on probation, h(3) = L = 8, at the LRU end
    s = t.policy_stats()
    assert s["admissions_probation"] == 1
    assert t.lru_order("mamba")[-1].state == 3
    assert t.match_prefix([13] * 5).state == 3    # a state found: 2 < 2 * 1 + 2; h(3) = 8 + 2 * 4 = 16
    _put(t, [14] * 4, 4)                # admitted as usual: h(4) = 8 + 4 = 12, at the MRU end
    s = t.policy_stats()
    assert s["admissions_probation"] == 1
    assert t.lru_order("mamba")[0].state == 4
    assert _victims(t, 1) == [4]


def test_a_state_that_supersedes_another_is_never_on_probation():
    """While the pool thrashes, a state below another on a path that never
    branched (a chat's next turn) takes that one's place as usual."""
    t = _tree()
    _put(t, [11] * 4, 1)
    _put(t, [12] * 4, 2)
    assert _victims(t, 2) == [1, 2]
    t.match_prefix([11] * 5)
    t.match_prefix([12] * 5)            # the pool thrashes
    _put(t, [13] * 4, 3)                # on probation
    _put(t, [13] * 4 + [5] * 4, 4)      # supersedes 3: admitted as usual, at the MRU end
    s = t.policy_stats()
    assert s["admissions_probation"] == 1 and s["states_superseded"] == 1
    assert t.lru_order("mamba")[0].state == 4


def test_a_junction_whose_branches_were_evicted_keeps_its_uses():
    t = _tree()
    a = [1] * 8
    _put(t, a, 1)                       # h(1) = 8
    _put(t, a + [5] * 4, 2)             # the first state below 1: 1 superseded (h 8); h(2) = 4
    _put(t, a + [6] * 4, 3)             # 1's node has two children now (it branched); h(3) = 4
    for _ in range(2):
        assert t.match_prefix(a + [7]).state == 1  # h(1) = 0 + 3 * 8 = 24
    assert _victims(t, 2) == [2, 3]     # L = 4; 1's node has no child left
    _put(t, a + [7] * 4, 4)             # it branched once: no supersession; h(4) = L + 4 = 8
    _put(t, [9] * 16, 5)                # h(5) = 4 + 16 = 20
    assert _victims(t, 2) == [4, 5]     # 1 (h 24) stays
    assert t.policy_stats()["states_superseded"] == 1


def test_a_state_cached_above_lowers_the_value_of_the_states_below_it():
    """A shared prompt's first request leaves its end state (12 tokens
    spared from the root); the second request's junction state at the end
    of the prompt (8) is cached above it later: the end state then spares 4
    tokens only, and goes first (its value is read at the eviction, not kept
    from its admission, when it spared 12)."""
    t = _tree()
    p = [1] * 8
    _put(t, p + [5] * 4, 1)             # h(1) = 0 + 12 when admitted
    _put(t, p + [6] * 4, 2)             # splits at 8: h(2) = 0 + 12
    _put(t, p, 3)                       # the junction: h(3) = 8; now h(1) = h(2) = 0 + 4
    assert _victims(t, 2) == [1, 2]
    assert t.policy_stats()["adaptive_inflation"] == 4.0


def test_a_state_evicted_above_raises_the_value_below_at_its_next_use_only():
    """Once the junction is gone 1 and 2 would spare 12 tokens each, but a
    value counts at most what it was when the uses were last set (4): 1
    (h 8) goes before 4 (9); 2, used again since, counts its 12."""
    t = _tree()
    p = [1] * 8
    _put(t, p + [5] * 4, 1)
    _put(t, p + [6] * 4, 2)
    _put(t, p, 3)                       # h(3) = 8, h(1) = h(2) = 0 + 4
    assert t.match_prefix(p + [5] * 4 + [0]).state == 1    # h(1) = 0 + 2 * 4 = 8
    assert t.match_prefix(p + [6] * 4 + [0]).state == 2    # h(2) = 8
    _put(t, [9] * 9, 4)                 # h(4) = 9
    assert _victims(t, 1) == [3]        # the least recent of the three at 8: L = 8
    assert t.match_prefix(p + [6] * 4 + [0]).state == 2    # h(2) = 8 + 3 * 12 = 44
    assert _victims(t, 2) == [1, 4]     # 8 (its 4 kept, not the 12 it spares now), then 9
    assert t.policy_stats()["adaptive_inflation"] == 9.0


def test_a_superseded_state_keeps_at_most_its_value_when_superseded():
    """A chat: turn 0's state (6 tokens), turn 1's (8 more) superseding it,
    turn 2's (4 more) superseding turn 1's.  Once turn 0's state is evicted,
    turn 1's would spare 14 tokens from the root, but its value stays at
    most the 8 it had when superseded: a newer state of value 6 + 5 = 11
    outlives it."""
    t = _tree()
    t0, t1, t2 = [1] * 6, [2] * 8, [3] * 4
    _put(t, t0, 1)                      # h(1) = 6
    _put(t, t0 + t1, 2)                 # supersedes 1 (0 + 6); h(2) = 8
    _put(t, t0 + t1 + t2, 3)            # supersedes 2 (0 + 8, at most 8 from now on); h(3) = 4
    assert _victims(t, 2) == [3, 1]     # L = 6
    _put(t, [8] * 5, 4)                 # h(4) = 6 + 5 = 11
    assert _victims(t, 1) == [2]        # 8 (not 14) < 11


def test_the_inflation_never_falls():
    """A state whose value fell (a junction cached above it) may be the
    victim at a priority below L: L stays, and a new state's priority counts
    from it."""
    t = _tree()
    p = [1] * 8
    _put(t, p + [5] * 4, 1)             # h(1) = 12
    assert t.match_prefix(p + [5] * 4 + [0]).state == 1      # h(1) = 0 + 2 * 12 = 24
    _put(t, [7] * 12, 2)
    assert t.match_prefix([7] * 12 + [0]).state == 2         # h(2) = 24
    _put(t, [3] * 20, 3)                # h(3) = 20
    assert _victims(t, 1) == [3]        # L = 20
    _put(t, p, 4)                       # h(4) = 20 + 8; h(1) = 0 + 2 * 4 = 8
    assert _victims(t, 1) == [1]        # at 8: L stays 20
    assert t.policy_stats()["adaptive_inflation"] == 20.0
    _put(t, [4] * 5, 5)                 # h(5) = 20 + 5 = 25
    assert _victims(t, 1) == [2]        # 24 < 25 < 28


def test_a_junction_recreated_where_it_was_evicted_keeps_its_uses():
    """A shared prompt's junction state, used twice, is evicted (its node
    stays, a tombstone above a branch); the next request that parts there
    recreates it, and it starts from the three uses it had: h = L + 3 * 8,
    not L + 8, which would put it first in line again."""
    t = _tree()
    p = [1] * 8
    _put(t, p + [5] * 4, 1)             # h(1) = 12
    _put(t, p + [6] * 30, 2)            # splits at 8: h(2) = 38
    _put(t, p, 3)                       # the junction: h(3) = 8; h(1) = 4, h(2) = 30
    for _ in range(2):
        assert t.match_prefix(p + [7]).state == 3  # h(3) = 0 + 3 * 8 = 24
    assert _victims(t, 1) == [1]        # L = 4
    _put(t, [9] * 40, 4)                # h(4) = 4 + 40 = 44
    assert _victims(t, 1) == [3]        # 24: L = 24; its node stays above 2's
    _put(t, p, 5)                       # recreated: h(5) = 24 + 3 * 8 = 48
    _put(t, [8] * 20, 6)                # h(6) = 24 + 20 = 44
    assert _victims(t, 3) == [2, 4, 6]  # 30, then 44 twice (4 the less recently used); 5 stays
    assert t.policy_stats()["adaptive_inflation"] == 44.0


def test_the_thrash_counts_fade():
    """The counts of matches that found a state and of those that found a
    ghost are halved together whenever they reach 4,096: 2,100 matches that
    found a state, then one-shot states each evicted and asked for again.
    Without the halving the 2,100 would hold probation off for ever; with it
    the found count falls to 1,050 and then 525 while the ghosts build up,
    and the state admitted after the 3,100th ghost is the first on
    probation."""
    t = _tree()
    shared = [1] * 400
    _put(t, shared, 1)                  # h(1) = 2101 * 400 after the matches below: never a victim here
    for _ in range(2100):
        assert t.match_prefix(shared + [2]).state == 1
    for i in range(3200):
        key = [1000 + i] * 4
        _put(t, key, 2 + i)
        assert t.policy_stats()["admissions_probation"] == (i >= 3100) * (i - 3099)
        assert _victims(t, 1) == [2 + i]
        t.match_prefix(key + [0])       # its ghost
    assert t.policy_stats()["ghost_hits"] == 3200


def _junction_tree(used: bool):
    """An instruction's state (slot 1, held by a request), a prompt's end
    state below a document (2), and the document's junction state (3),
    evicted with one use (used: two)."""
    t = mambaradix.RadixTree(page_size=1, chunk_size=4, lru_policy="adaptive")
    inst, doc = [1] * 8, [2] * 8
    _put(t, inst, 1)
    _put(t, inst + doc + [3] * 40, 2)
    m = t.match_prefix(inst + doc + [4] * 40)             # KV to 16, the state at 8: SGLang's junction at 16
    assert (m.state, m.kv_matched_len, m.branching_seqlen) == (1, 16, 16)
    _put(t, inst + doc, 3)                                # h(3) = 8; h(2) = 40 now
    t.inc_lock_ref(m.node)                                # a request runs from 1: not a victim
    if used:
        assert t.match_prefix(inst + doc + [5]).state == 3
    assert _victims(t, 1) == [3]                          # its node stays, a tombstone
    return t, inst + doc


def test_a_junction_evicted_unused_gives_way_to_the_end_snapshot():
    """A query's KV match goes past its state (8) to a document's end (16),
    where a state was cached and evicted without a use: SGLang's rule would
    snapshot its prefill there (its only snapshot).  With its end snapshot
    (56) sparing more than 4 times the junction's 8 tokens, the match gives
    no branching length (the prefill snapshots at its end); a shorter query
    (end 24: 16 tokens, not more than 32) keeps the junction, and so does any
    query once the evicted junction state had been used."""
    t, head = _junction_tree(used=False)
    m = t.match_prefix(head + [6] * 40)
    assert (m.state, m.kv_matched_len, m.branching_seqlen) == (1, 16, None)
    assert t.match_prefix(head + [7] * 8).branching_seqlen == 16
    t, head = _junction_tree(used=True)
    assert t.match_prefix(head + [6] * 40).branching_seqlen == 16
    # the other policies keep SGLang's junction
    t = mambaradix.RadixTree(page_size=1, chunk_size=4, lru_policy="consumed")
    _put(t, [1] * 8, 1)
    _put(t, [1] * 8 + [2] * 8 + [3] * 40, 2)
    _put(t, [1] * 8 + [2] * 8, 3)
    assert t.match_prefix([1] * 8 + [2] * 8 + [3] * 40 + [0]).state == 2      # the most recent
    assert _victims(t, 2) == [1, 3]
    m = t.match_prefix([1] * 8 + [2] * 8 + [6] * 40)
    assert (m.state, m.kv_matched_len, m.branching_seqlen) == (None, 16, 16)


def test_an_unused_state_hands_its_value_over_while_requests_go_on_past_the_answers():
    """A prompt's state (20 tokens) and its answer's two tokens below it: the
    answer's state goes first (2 < 20), and a follow-up that goes on past the
    answer finds its ghost (the lower state of a supersession).  After four
    such, 4 >= 2 * 0 + 4: a prompt state that no match used hands its value
    to the answer's state below it and keeps 2.  The prompt state then goes
    first, and a request that parts at the prompt's end finds its ghost (the
    upper state): 4 < 2 * 1 + 4, and the next prompt keeps its value again."""
    t = _tree()
    for c in range(4):
        p = [10 + c] * 20
        _put(t, p, 1 + 2 * c)               # h = 20
        _put(t, p + [5, 5], 2 + 2 * c)      # supersedes it, unused: h = 0 + 2; the prompt's keeps 20
    assert _victims(t, 4) == [2, 4, 6, 8]   # L = 2, the leaves removed (lower ghosts)
    for c in range(3):
        assert t.match_prefix([10 + c] * 20 + [5, 5, 7]).state == 1 + 2 * c     # h = 2 + 2 * 20
    _put(t, [20] * 20, 9)                   # h = 2 + 20
    _put(t, [20] * 20 + [5, 5], 10)         # 3 < 2 * 0 + 4: 9 keeps its 20, h(10) = 2 + 2
    assert _victims(t, 1) == [10]           # L = 4
    assert t.match_prefix([13] * 20 + [5, 5, 7]).state == 7      # the fourth: h(7) = 4 + 2 * 20
    _put(t, [21] * 20, 11)                  # h = 4 + 20
    _put(t, [21] * 20 + [5, 5], 12)         # 11 hands 12 its 20 and keeps 2: h(11) = 6, h(12) = 24
    assert _victims(t, 1) == [11]           # its node stays above 12 (an upper ghost); L = 6
    assert t.match_prefix([21] * 20 + [8]).state is None         # parts at the prompt's end
    assert t.policy_stats()["ghost_hits"] == 5
    _put(t, [22] * 20, 13)                  # h = 6 + 20
    _put(t, [22] * 20 + [5, 5], 14)         # 4 < 2 * 1 + 4: 13 keeps its 20, h(14) = 6 + 2
    assert _victims(t, 1) == [14]


def test_ghosts_outside_a_supersession_leave_the_prompt_its_value():
    """One-shot states evicted and asked for again (no state above or below
    them) say nothing about which state of a supersession to keep: the
    answer's state still goes first."""
    t = _tree()
    for c in range(4):
        _put(t, [11 + c] * 4, 1 + c)
    assert _victims(t, 4) == [1, 2, 3, 4]
    for c in range(4):
        t.match_prefix([11 + c] * 5)
    assert t.policy_stats()["ghost_hits"] == 4
    _put(t, [20] * 20, 5)
    _put(t, [20] * 20 + [5, 5], 6)
    assert _victims(t, 1) == [6]


def test_the_pair_counts_fade():
    """The ghost hits on lower and on upper states of a supersession are
    halved together whenever they reach 256: after 200 lower ones the rule
    hands unused states' values over; upper ones follow, and the counts are
    halved at the 56th (100 and 28), so the rule stops at the 77th
    (100 < 2 * 49 + 4), not at the 99th."""
    t = _tree()
    nxt = iter(range(1000, 10 ** 6))

    def lower_hit():                        # the answer's state evicted, a follow-up goes on past it
        p = [next(nxt)] * 20
        _put(t, p, 1)
        m = t.match_prefix(p + [0])
        t.inc_lock_ref(m.node)              # the prompt's state held: the answer's goes
        _put(t, p + [5, 5], 2)
        assert _victims(t, 1) == [2]
        t.dec_lock_ref(m.node)
        t.match_prefix(p + [5, 5, 7])
        assert _victims(t, 1) == [1]

    def upper_hit():                        # a 2-token state below which 40 more were cached
        p = [next(nxt)] * 2
        _put(t, p, 1)
        _put(t, p + [6] * 40, 2)
        assert _victims(t, 1) == [1]
        t.match_prefix(p + [9])             # parts at its end
        assert _victims(t, 1) == [2]

    def hands_over():
        p = [next(nxt)] * 20
        _put(t, p, 1)
        _put(t, p + [5, 5], 2)
        first = _victims(t, 2)[0]
        return first == 1

    for _ in range(200):
        lower_hit()
    assert hands_over()
    first_off = None
    for k in range(1, 101):
        upper_hit()
        if first_off is None and not hands_over():
            first_off = k
    assert first_off == 77
    assert t.policy_stats()["ghost_hits"] == 300


# End-relative placement (docs/adaptive.md, "Snapshot placement"): chunk 4, so a
# prompt of 46 tokens leaves its end snapshot at 44.

def _placing_tree():
    return mambaradix.RadixTree(page_size=1, chunk_size=4, lru_policy="adaptive")


def _prompt(base, n=46):
    return list(range(base, base + n))


def _part_above_the_end(t, bases, slot=1):
    """For each base, a prompt's end snapshot, then its next prompt parting 4
    tokens above it (at 40, sharing 40 tokens of the branch)."""
    for b in bases:
        p = _prompt(b)
        _put(t, p[:44], slot)
        slot += 1
        m = t.match_prefix(p[:40] + _prompt(b + 500, 20))
        assert (m.kv_matched_len, m.branching_seqlen) == (40, 40)   # SGLang's own junction: nothing predicted
    return slot


def test_the_end_snapshot_moves_up_once_two_prompts_parted_above_theirs():
    t = _placing_tree()
    _part_above_the_end(t, [1000])
    assert t.match_prefix(_prompt(3000)).branching_seqlen is None    # one parting: not enough
    _part_above_the_end(t, [2000], slot=2)
    # N(1) = 2 partings 4 tokens (one step) above a state: 2 * (11 - 1) = 20 beats 2 * (11 - 2) = 18 for two steps
    assert t.match_prefix(_prompt(4000)).branching_seqlen == 40
    assert t.policy_stats()["end_placements"] == 1 == t.policy_stats()["placements"]


def test_a_prompt_matched_again_while_it_waits_counts_once():
    """A scheduler matches a waiting request again at each try: its parting is
    one observation (the first of its branch), not one a match."""
    t = _placing_tree()
    p = _prompt(1000)
    _put(t, p[:44], 1)
    for _ in range(3):
        assert t.match_prefix(p[:40] + _prompt(1500, 20)).kv_matched_len == 40
    assert t.match_prefix(_prompt(4000)).branching_seqlen is None
    _part_above_the_end(t, [2000], slot=2)
    assert t.match_prefix(_prompt(5000)).branching_seqlen == 40


def test_continuations_past_the_end_keep_the_end_snapshot():
    """Five branches continued past their whole path (a chat's next turns):
    moving the end snapshot one step costs 4 * 5 * 1 = 20, what it would
    spare the two partings, so it stays; with four it moves."""
    for continued, want in ((5, None), (4, 40)):
        t = _placing_tree()
        slot = _part_above_the_end(t, [1000, 2000])
        for i in range(continued):
            p = _prompt(6000 + 100 * i)
            _put(t, p[:44], slot)
            slot += 1
            assert t.match_prefix(p[:44] + [1, 2, 3, 4]).branching_seqlen is None
        assert t.match_prefix(_prompt(4000)).branching_seqlen == want


def test_partings_close_to_a_branch_top_leave_the_end_snapshot():
    """Requests under a 32-token system prompt part 4 tokens into another
    request's own part, 8 above its end snapshot: they shared less of that
    branch than was left to its state, so they say nothing about where the
    next prompt's end snapshot should be."""
    t = _placing_tree()
    system = _prompt(100, 32)
    _put(t, system, 1)
    for i, b in enumerate((2000, 3000)):
        p = system + _prompt(b, 14)
        _put(t, p[:44], 2 + i)
        m = t.match_prefix(p[:36] + _prompt(b + 500, 20))
        assert (m.kv_matched_len, m.branching_seqlen) == (36, 36)
    assert t.match_prefix(_prompt(4000)).branching_seqlen is None
    assert t.policy_stats()["end_placements"] == 0


def test_the_partings_fade():
    """Halved with the placement evidence every 4096 observations: two
    partings become one, too few."""
    t = _placing_tree()
    _part_above_the_end(t, [1000, 2000])
    for _ in range(4096):
        t.match_prefix([7, 8])           # a match whose key goes on: an observation
    assert t.match_prefix(_prompt(4000)).branching_seqlen is None
