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
#: batch, retraction, the overlap lag, track points, lazy pre-allocation
SHARED = ("_get_next_batch", "_get_new_prefill_batch", "_locked_short", "_num_allocatable",
          "_rem_total_tokens", "_update_running_batch", "_check_decode_mem", "_evict_tokens",
          "_retract", "_process", "_process_extend", "_decode_result", "_track_prefill",
          "_other_idx", "_keep_idx", "_lazy_prealloc", "idle")


def test_both_backends_are_the_scheduler():
    assert issubclass(SchedulerDriver, Scheduler)
    assert issubclass(_Replay, Scheduler)


def test_no_backend_redefines_a_decision():
    for name in SHARED:
        assert name in vars(Scheduler), name
        assert name not in vars(_Replay), f"the simulator redefines Scheduler.{name}"
        # the driver asks the pool for the ping-pong index (SGLang's name for the same rule)
        if name != "_other_idx":
            assert name not in vars(SchedulerDriver), f"the driver redefines Scheduler.{name}"


def test_the_step_is_the_schedulers():
    # the driver wraps step() (step counter, on_step hook) around the loop's
    assert "step" not in vars(_Replay)
    src = SchedulerDriver.step.__code__.co_names
    assert "super" in src and "step" in src
