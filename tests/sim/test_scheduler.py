"""The driver and the simulator's state-free replay run one scheduler loop.

Behaviour is tested elsewhere against independent references (SGLang's own
cache and decision functions in test_driver.py / test_sglang_decisions.py,
the toy model's recomputation in test_sim_engine.py, which also checks that
the two backends agree request by request).  This file checks the structure
that makes that agreement hold by construction: every decision of the loop
lives in mambaradix.scheduler.Scheduler, and neither backend redefines one.
"""

from mambaradix.driver import SchedulerDriver
from mambaradix.scheduler import Scheduler
from mambaradix.sim.engine import _Replay

#: the loop and its decisions: admission budget, chunked prefill, the running
#: batch, retraction, the overlap lag, what a decode result does
SHARED = ("_get_next_batch", "_get_new_prefill_batch", "_locked_short", "_num_allocatable",
          "_rem_total_tokens", "_update_running_batch", "_check_decode_mem", "_evict_tokens",
          "_retract", "_process", "_process_extend", "_decode_result", "idle")

#: the tracking transitions (track points, ping-pong flips, the lazy buffer's
#: second slot) are the C lifecycle's: no Python copy of them, in the loop or
#: in a backend
TRANSITIONS = ("_track_prefill", "_other_idx", "_keep_idx", "_lazy_prealloc", "_track_slot",
               "_set_track_slot", "_alloc_track_slot", "_free_track_slot")


def test_both_backends_are_the_scheduler():
    assert issubclass(SchedulerDriver, Scheduler)
    assert issubclass(_Replay, Scheduler)


def test_no_backend_redefines_a_decision():
    for name in SHARED:
        assert name in vars(Scheduler), name
        assert name not in vars(_Replay), f"the simulator redefines Scheduler.{name}"
        assert name not in vars(SchedulerDriver), f"the driver redefines Scheduler.{name}"


def test_no_tracking_transition_is_written_in_python():
    for cls in (Scheduler, SchedulerDriver, _Replay):
        for name in TRANSITIONS:
            assert not hasattr(cls, name), f"{cls.__name__}.{name}"
    # each backend's tracking goes through the lifecycle's calls
    for cls, calls in ((SchedulerDriver, ("prepare_extend", "decode_prepare", "decode_finish")),
                       (_Replay, ("prepare_extend", "decode_prepare", "decode_finish"))):
        names = set()
        for f in vars(cls).values():
            names.update(getattr(getattr(f, "__code__", None), "co_names", ()))
        for c in calls:
            assert c in names, f"{cls.__name__} does not call Lifecycle.{c}"


def test_the_step_is_the_schedulers():
    # the driver wraps step() (step counter, on_step hook) around the loop's
    assert "step" not in vars(_Replay)
    src = SchedulerDriver.step.__code__.co_names
    assert "super" in src and "step" in src
