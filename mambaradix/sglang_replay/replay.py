"""A trace through SGLang 0.5.23's own ``Scheduler``, in this process, on CPU.

:func:`replay` builds the scheduler for a small Qwen3-Next-like model (written to a scratch folder, dummy
weights) and runs SGLang's own event loop (``run_event_loop``: the normal or the overlap loop): request
intake, ``get_next_batch_to_run`` (PrefillAdder, chunked prefill, ``prepare_for_extend`` /
``prepare_for_decode`` with Mamba tracking, retraction), ``run_batch`` and ``process_batch_result``
(``cache_unfinished_req`` / ``cache_finished_req`` on ``UnifiedRadixCache``) are SGLang's.  What runs on a
device, and the sockets to processes the replay does not run, are stood in (:data:`STAND_INS`).

The forward is teacher-forced: after ``n`` tokens a request's next token is position ``n`` of its
sequence (prompt, recorded outputs).  Toy recurrent states: a state is a 64-bit polynomial hash of the
tokens consumed (:func:`toy_hash`), written into the first elements of the Mamba pool's temporal tensor
(every layer) at the working slots and track slots the forward batch names, advanced from what the slot
holds, as a model would.  At every extend the working slot (after SGLang's copy-on-write / clear) must
hold the hash of exactly the matched prefix, recomputed from the request's tokens; each difference is a
``toy_state_mismatch``.

A virtual clock orders arrivals as the simulator's does (``mambaradix.sim.types.SimConfig``'s
``decode_step_seconds`` per decode step, ``prefill_token_seconds`` per prompt token of an extend): a
request reaches SGLang's receiver once the clock reaches its ``arrival``.  docs/sglang-replay.md has the
details.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import tempfile
import time
from array import array
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..sim.types import SimConfig, SimRequest, default_max_running
from . import env

__all__ = ["ReplayConfig", "ReplayError", "ReplayResult", "STAND_INS", "TREE_CORES", "STRATEGIES",
           "replay", "toy_hash"]

#: --tree-core -> SGLang's TreeCore backend name and the class it builds.
TREE_CORES = {"python": ("python", "UnifiedTreeCore"), "rust": ("rust", "RustUnifiedTreeCore"),
              "mambaradix": ("mambaradix", "MambaradixTreeCore")}
STRATEGIES = ("extra_buffer", "extra_buffer_lazy", "no_buffer")

#: What is replaced, and why: the device work only (docs/sglang-replay.md).
STAND_INS = {
    "mamba_hook._platform_supports_mamba_cache_extra_buffer":
        "a platform gate that lists only GPU platforms for extra_buffer (the state snapshots are device "
        "kernels; here the stand-in forward takes them)",
    "ModelRunner.init_attention_backends": "the GDN / attention backends need sgl_kernel's CPU ops",
    "ModelRunner.init_cuda_graphs": "graph capture, and the eager runner's warm-up forward",
    "torch.Tensor.pin_memory": "prepare_for_decode pins the Mamba track mask; CPU torch without a driver "
                               "refuses",
    "Scheduler.model_worker.forward_batch_generation": "the forward: teacher forcing and toy states",
    "Scheduler.request_receiver.recv_from_tokenizer": "the socket from a tokenizer process the replay does "
                                                      "not run: the trace's requests, on the replay's clock",
    "Scheduler.output_streamer.send_to_detokenizer.socket": "the socket to a detokenizer process the replay "
                                                            "does not run: what is sent is kept",
}

_MASK = (1 << 64) - 1
_P = np.uint64(0x100000001B3)        # the hash's multiplier (FNV-1's prime)
_LIMBS = 8                           # a state is stored as 8 bytes, one per element (exact in any dtype)
_STUCK_ROUNDS = 64                   # rounds in which nothing runs and nothing can change


class ReplayError(ValueError):
    """A configuration or trace the replay cannot run; ``option`` names the setting at fault (a
    :class:`ReplayConfig` field, "trace", or "config" for a combination SGLang refuses)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.reason = message


#: ReplayConfig's fields that set the mambaradix TreeCore's state policies.
POLICY_FIELDS = ("state_policy", "utility_order", "end_of_turn_states", "path_state_budget")


@dataclasses.dataclass
class ReplayConfig:
    """The scheduler's configuration.  ``max_running`` None: ``state_slots // 5`` (1 to 64), the
    simulator's default; ``chunked_prefill_size`` 0: off; ``overlap``: SGLang's overlap scheduler, else
    its normal loop; None: overlap, except for ``no_buffer``, which SGLang runs without it (as its
    ``auto`` strategy does)."""

    tree_core: str = "rust"
    state_slots: int = 256
    kv_tokens: int = 1 << 20
    page_size: int = 1
    max_running: Optional[int] = None
    mamba_strategy: str = "extra_buffer"
    track_interval: int = 256
    chunked_prefill_size: int = 8192
    overlap: Optional[bool] = None
    # the mambaradix TreeCore's state policies (mambaradix.sglang.plugin.SETTINGS); None: its settings as
    # the environment gives them, as in a server
    state_policy: Optional[str] = None
    utility_order: Optional[str] = None
    end_of_turn_states: Optional[bool] = None
    path_state_budget: Optional[int] = None

    def tree_settings(self) -> dict:
        """The state-policy fields that are set, as mambaradix.sglang.unified.register()'s keywords."""
        return {k: getattr(self, k) for k in POLICY_FIELDS if getattr(self, k) is not None}

    def resolved(self) -> "ReplayConfig":
        """Checked, with its defaults filled in; raises :class:`ReplayError` naming the field."""
        for name in ("state_slots", "kv_tokens", "page_size", "track_interval", "max_running",
                     "chunked_prefill_size"):
            v = getattr(self, name)
            if v is None and name == "max_running":
                continue
            lo = 0 if name == "chunked_prefill_size" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ReplayError(name, f"must be an integer >= {lo}, got {v!r}")
        if not isinstance(self.tree_core, str) or self.tree_core not in TREE_CORES:
            raise ReplayError("tree_core", f"must be one of {', '.join(TREE_CORES)}, got {self.tree_core!r}")
        if not isinstance(self.mamba_strategy, str) or self.mamba_strategy not in STRATEGIES:
            raise ReplayError("mamba_strategy", f"must be one of {', '.join(STRATEGIES)}, "
                                                f"got {self.mamba_strategy!r}")
        if self.mamba_strategy != "no_buffer" and self.track_interval % self.page_size:
            raise ReplayError("track_interval", f"must be a multiple of the page size {self.page_size} (as SGLang "
                                                f"asserts), got {self.track_interval}")
        given = self.tree_settings()
        if given and self.tree_core != "mambaradix":
            raise ReplayError(next(iter(given)), f"is a setting of the mambaradix TreeCore; SGLang's "
                                                 f"{self.tree_core} core has no such option")
        if self.overlap is not None and not isinstance(self.overlap, bool):
            raise ReplayError("overlap", f"must be True, False or None, got {self.overlap!r}")
        overlap = self.mamba_strategy != "no_buffer" if self.overlap is None else self.overlap
        if self.mamba_strategy == "no_buffer" and overlap:
            raise ReplayError("mamba_strategy", "no_buffer runs without the overlap scheduler (SGLang refuses "
                                                "the pair)")
        if self.mamba_strategy == "no_buffer" and self.page_size != 1:
            raise ReplayError("page_size", f"no_buffer needs page size 1 (as in SGLang), got {self.page_size}")
        if self.mamba_strategy == "extra_buffer_lazy" and not overlap:
            raise ReplayError("overlap", "extra_buffer_lazy needs SGLang's overlap scheduler")
        max_running = default_max_running(self.state_slots) if self.max_running is None else self.max_running
        return dataclasses.replace(self, max_running=max_running, overlap=overlap)


@dataclasses.dataclass
class ReplayResult:
    """What a replay measured.  ``requests``: one dict per request, in trace order (rid, prompt_tokens,
    cached_tokens: SGLang's own ``req.cached_tokens``, as its output reports it)."""

    config: dict
    requests: list
    scheduler_seconds: float          # process CPU time of the loop, the stand-in forward's excluded
    forward_seconds: float            # process CPU time of the stand-in forward
    tree_cache_seconds: float         # of scheduler_seconds, the CPU time inside the tree cache's methods
    toy_state_mismatches: int
    mismatch_examples: list           # (rid, matched prefix length) of the first few

    @property
    def prompt_tokens(self) -> int:
        return sum(r["prompt_tokens"] for r in self.requests)

    @property
    def cached_tokens_total(self) -> int:
        return sum(r["cached_tokens"] for r in self.requests)

    @property
    def token_hit_rate(self) -> float:
        return self.cached_tokens_total / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def scheduler_us_per_request(self) -> float:
        return self.scheduler_seconds * 1e6 / len(self.requests) if self.requests else 0.0

    @property
    def tree_cache_us_per_request(self) -> float:
        return self.tree_cache_seconds * 1e6 / len(self.requests) if self.requests else 0.0

    def metrics(self) -> dict:
        return {"token_hit_rate": self.token_hit_rate, "requests": len(self.requests),
                "cached_tokens_total": self.cached_tokens_total,
                "scheduler_us_per_request": self.scheduler_us_per_request,
                "tree_cache_us_per_request": self.tree_cache_us_per_request,
                "toy_state_mismatches": self.toy_state_mismatches}

    def to_json(self) -> dict:
        """``{"config", "metrics", "requests"}``: what ``sglang-replay --json`` prints."""
        return {"config": self.config, "metrics": self.metrics(),
                "requests": [{k: r[k] for k in ("rid", "prompt_tokens", "cached_tokens")}
                             for r in self.requests]}


# --------------------------------------------------------------------------- toy states

def _powers(n: int) -> np.ndarray:
    pw = np.full(n + 1, _P, dtype=np.uint64)
    pw[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(pw, dtype=np.uint64)


class _Hasher:
    """toy_hash over growing lengths: powers of the multiplier computed once, extended on demand."""

    def __init__(self) -> None:
        self.pw = _powers(1024)

    def _pw(self, n: int) -> np.ndarray:
        if n >= len(self.pw):
            self.pw = _powers(max(n, 2 * len(self.pw)))
        return self.pw

    def of(self, tokens: np.ndarray) -> int:
        n = len(tokens)
        if n == 0:
            return 0
        pw = self._pw(n)
        with np.errstate(over="ignore"):
            return int(np.sum((tokens.astype(np.uint64) + np.uint64(1)) * pw[n - 1::-1], dtype=np.uint64))

    def advance(self, state: int, tokens: np.ndarray) -> int:
        return (state * int(self._pw(len(tokens))[len(tokens)]) + self.of(tokens)) & _MASK


def toy_hash(tokens: Sequence[int]) -> int:
    """The toy state after consuming ``tokens``: ``sum((t_i + 1) * P**(n-1-i)) mod 2**64`` with
    ``P = 0x100000001B3``; 0 for no tokens (a cleared slot), and ``h(a + b) = h(a) * P**len(b) + h(b)``,
    so a state is advanced from what a slot holds.  A state from other tokens or another position differs
    (but for 2**-64 collisions)."""
    return _Hasher().of(np.asarray(tokens, dtype=np.int64))


class _ToyStates:
    """Reads and writes toy states in SGLang's Mamba pool (its temporal tensor, every layer)."""

    def __init__(self, pool: Any) -> None:
        import torch

        self.torch = torch
        self.pool = pool
        self.temporal = pool.mamba_pool.mamba_cache.temporal
        self.layers = self.temporal.shape[0]
        self.shifts = torch.arange(_LIMBS, dtype=torch.int64) * 8

    def slots(self, idx: Any) -> list:
        return [int(x) for x in self.pool.translate_mamba_indices(idx).tolist()]

    def read(self, slot: int) -> Optional[int]:
        """The state a slot holds, or None when its layers disagree."""
        limbs = self.temporal[:, slot].reshape(self.layers, -1)[:, :_LIMBS].to(self.torch.int64)
        if not bool((limbs == limbs[0]).all()):
            return None
        return int(((limbs[0] & 0xFF) << self.shifts).sum().item()) & _MASK

    def write(self, slot: int, state: int) -> None:
        limbs = self.torch.tensor([(state >> (8 * j)) & 0xFF for j in range(_LIMBS)],
                                  dtype=self.temporal.dtype)
        self.temporal[:, slot].reshape(self.layers, -1)[:, :_LIMBS] = limbs


# --------------------------------------------------------------------------- the model

def model_config(vocab_size: int, context_length: int) -> dict:
    """A Qwen3-Next-like config small enough for a CPU: 4 layers (3 linear attention, 1 full), hidden 64,
    a few experts; no weights (dummy load)."""
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "vocab_size": vocab_size, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "full_attention_interval": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 2,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "decoder_sparse_step": 1,
        "max_position_embeddings": context_length, "rms_norm_eps": 1e-6,
        "bos_token_id": vocab_size - 1, "eos_token_id": vocab_size - 1, "tie_word_embeddings": False,
    }


# --------------------------------------------------------------------------- stand-ins

class _Patches:
    """Attribute replacements, undone in reverse order."""

    def __init__(self) -> None:
        self.saved: list = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        self.saved.append((obj, name, obj.__dict__.get(name, _MISSING) if isinstance(obj, type)
                           else getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    def undo(self) -> None:
        while self.saved:
            obj, name, old = self.saved.pop()
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


_MISSING = object()


class _CacheClock:
    """Process CPU time spent inside the tree cache's own methods, as the scheduler (and the allocators
    it evicts for) call them: each public method of the cache's class is timed where it is entered from
    outside, and calls it makes into the cache again are part of that outer call."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0

    def timed(self, fn: Callable) -> Callable:
        clock = time.process_time

        def call(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            self.depth = 1
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += clock() - t0
                self.depth = 0
        return call

    def attach(self, cache: Any, patches: "_Patches") -> None:
        names = {name for klass in type(cache).__mro__[:-1] for name, v in vars(klass).items()
                 if not name.startswith("_") and inspect.isfunction(v)}
        for name in sorted(names):
            patches.set(cache, name, self.timed(getattr(cache, name)))


def _no_attention_backends(runner: Any) -> None:
    runner.attn_backend = None
    runner.decode_attn_backend = None
    runner.decode_attn_backend_group = []
    runner.prefill_attention_backend_str = runner.decode_attention_backend_str = "sglang-replay"


def _no_graphs(runner: Any, capture_decode_cuda_graph: bool = True) -> None:
    runner.eager_runner = None
    runner.prefill_cuda_graph_runner = runner.decode_cuda_graph_runner = None
    runner.decode_cuda_graph_captured = False
    runner.decode_cuda_graph_capture_bs = []
    runner.graph_memory_usage = {}
    runner.graph_time_usage = {}


def _device_stand_ins(patches: _Patches) -> None:
    import torch
    from sglang.srt.arg_groups import mamba_hook
    from sglang.srt.model_executor.model_runner import ModelRunner

    patches.set(mamba_hook, "_platform_supports_mamba_cache_extra_buffer", lambda: True)
    patches.set(ModelRunner, "init_attention_backends", _no_attention_backends)
    patches.set(ModelRunner, "init_cuda_graphs", _no_graphs)
    patches.set(torch.Tensor, "pin_memory", lambda self, *a, **k: self)


class _Outbox:
    """Stands in for the ZMQ socket to the detokenizer (a process the replay does not run): keeps what
    SGLang's output path sends, to be read after the run."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, data: Any, flags: int = 0, **kwargs: Any) -> None:
        self.sent.append(data)

    def send_pyobj(self, obj: Any, flags: int = 0, **kwargs: Any) -> None:
        self.sent.append(obj)

    def outputs(self) -> tuple[dict, dict]:
        """(rid -> (finish reason, cached_tokens), rid -> output token ids) from what was sent."""
        from sglang.srt.managers.io_struct import msgpack_decode

        finished: dict = {}
        tokens: dict = {}
        for item in self.sent:
            out = msgpack_decode(item) if isinstance(item, (bytes, bytearray, memoryview)) else item
            reasons = getattr(out, "finished_reasons", None)
            ids = getattr(out, "output_ids", None)
            for i, rid in enumerate(getattr(out, "rids", None) or []):
                if ids is not None and ids[i] is not None:
                    tokens.setdefault(rid, []).extend(int(t) for t in ids[i])
                if reasons is not None and reasons[i] is not None:
                    finished[rid] = (reasons[i], int(out.cached_tokens[i]))
        return finished, tokens


class _Inbox:
    """Stands in for the ZMQ socket from the tokenizer: SGLang's own receiver polls it (until it raises
    ``zmq.Again``) once per scheduler iteration; the first poll of an iteration runs ``on_poll``, which
    advances the replay's clock and queues the requests that have arrived (encoded as the tokenizer sends
    them, before the run)."""

    def __init__(self, on_poll: Callable[[], None]) -> None:
        self.on_poll = on_poll
        self.queue: list = []
        self.fresh = True

    def _next(self) -> Any:
        import zmq

        if self.fresh:
            self.fresh = False
            self.on_poll()
        if not self.queue:
            self.fresh = True
            raise zmq.Again()
        return self.queue.pop(0)

    def recv(self, flags: int = 0, **kwargs: Any) -> Any:
        return self._next()

    def recv_pyobj(self, flags: int = 0, **kwargs: Any) -> Any:
        return self._next()


# --------------------------------------------------------------------------- the replay

class _Replay:
    def __init__(self, requests: Sequence[SimRequest], config: ReplayConfig,
                 corrupt_track_write: Optional[int]) -> None:
        from ..sim.engine import _pseudo_outputs

        self.config = config
        self.requests = list(requests)
        self.corrupt_track_write = corrupt_track_write
        # Each request's whole sequence, fixed before the run so every core sees the same tokens: its prompt,
        # the outputs it decodes (recorded, or the simulator's pseudo tokens of its rid) and two spare tokens
        # (an overlap step may decode past a finished request, as in the simulator).
        self.seqs: dict = {}
        for i, r in enumerate(self.requests):
            if r.rid in self.seqs:
                raise ReplayError("trace", f"request id {r.rid!r} appears twice (request {i} and an earlier one)")
            outs = (np.asarray(r.output_ids[:r.output_len], dtype=np.int64) if r.output_ids is not None
                    else _pseudo_outputs(r.rid, int(r.output_len)).astype(np.int64))
            if len(outs) < r.output_len:
                raise ReplayError("trace", f"request {r.rid!r}: output_ids shorter than output_len")
            spare = _pseudo_outputs(r.rid + "#spare", 2).astype(np.int64)
            self.seqs[r.rid] = np.concatenate([np.asarray(r.input_ids, dtype=np.int64), outs, spare])
            need = len(self.seqs[r.rid]) - 2 + config.page_size
            if need > config.kv_tokens:
                raise ReplayError("kv_tokens", f"{config.kv_tokens} KV tokens cannot hold request {r.rid!r} "
                                               f"({len(r.input_ids)} prompt + {r.output_len} output tokens and a "
                                               f"page)")
        top = max(int(seq.max()) for seq in self.seqs.values())
        self.vocab_size = max(1024, top + 2)               # the last id is EOS, which no request decodes
        longest = max(len(seq) for seq in self.seqs.values())
        self.context_length = max(4096, -(-longest // 1024) * 1024)
        self.hasher = _Hasher()
        self.mismatches = 0
        self.examples: list = []
        self.track_writes = 0
        self.forward_seconds = 0.0
        self.cache_clock = _CacheClock()
        self.context: Optional[dict] = None

    # ----------------------------------------------------------- building SGLang's scheduler
    def _server_args(self, model_dir: str) -> Any:
        from sglang.srt.server_args import ServerArgs

        c = self.config
        sa = ServerArgs(
            model_path=model_dir, load_format="dummy", device="cpu", dtype="bfloat16",
            mamba_ssm_dtype="float32", skip_tokenizer_init=True, disable_overlap_schedule=not c.overlap,
            disable_cuda_graph=True, random_seed=0, max_total_tokens=c.kv_tokens,
            max_mamba_cache_size=c.state_slots, mamba_radix_cache_strategy=c.mamba_strategy,
            mamba_track_interval=c.track_interval, page_size=c.page_size,
            max_running_requests=c.max_running,
            chunked_prefill_size=c.chunked_prefill_size if c.chunked_prefill_size else -1)
        try:
            sa.resolve_once()
        except (AssertionError, ValueError) as e:
            raise ReplayError("config", f"SGLang refuses it: {e}") from None
        return sa

    def _build(self, model_dir: str, patches: _Patches) -> Any:
        from sglang.srt import runtime_context as rc
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.server_args import PortArgs

        backend, _ = TREE_CORES[self.config.tree_core]
        if backend == "mambaradix":
            from ..sglang import plugin, unified

            # the values are read once SGLang is importable (mambaradix.sglang imports it)
            for k, v in self.config.tree_settings().items():
                try:
                    plugin.check(k, v)
                except (TypeError, ValueError) as e:
                    raise ReplayError(k, str(e).removeprefix(f"{k}={v!r}: ")) from None
            unified.register()
        sa = self._server_args(model_dir)
        port_args = PortArgs.init_new(sa)
        self.context = rc.snapshot_context()
        rc.publish(sa, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
        old = os.environ.get("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND")
        os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = backend
        try:
            if backend == "mambaradix":
                with unified.settings(**self.config.tree_settings()):
                    scheduler = Scheduler(sa, port_args)
                    self.tree_settings = {k: v for k, (v, _) in unified.resolved_settings().items()}
            else:
                scheduler = Scheduler(sa, port_args)
                self.tree_settings = None
        except RuntimeError as e:
            ratio = re.search(r"state cache is too small to serve any requests.*mamba_ratio=(\d+)", str(e))
            if ratio is None:
                raise
            raise ReplayError("state_slots", f"{self.config.state_slots} state slots cannot serve one request: "
                                             f"SGLang keeps {ratio.group(1)} per running request in this mode"
                              ) from None
        finally:
            if old is None:
                del os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"]
            else:
                os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = old
        self.outbox = _Outbox()
        patches.set(scheduler.output_streamer.send_to_detokenizer, "socket", self.outbox)
        self.inbox = _Inbox(self._on_poll)
        patches.set(scheduler, "request_receiver",
                    dataclasses.replace(scheduler.request_receiver, recv_from_tokenizer=self.inbox))
        patches.set(scheduler.model_worker, "forward_batch_generation", self._forward)
        self.scheduler = scheduler
        self.runner = scheduler.tp_worker.model_runner
        self.toy = _ToyStates(scheduler.req_to_token_pool)
        self.cache_clock.attach(scheduler.tree_cache, patches)
        return scheduler

    def _teardown(self, scheduler: Any) -> None:
        from sglang.srt import runtime_context as rc
        from sglang.srt.distributed import parallel_state as ps

        if scheduler is not None:
            import zmq

            scheduler.cur_batch_for_debug = None       # its watchdog thread stays idle
            # SGLang's watchdog threads never end and their callbacks hold the scheduler, which would keep
            # every replay's pools alive in this process: the callbacks are cut loose from it
            from sglang.srt.utils.watchdog import WatchdogRaw

            for name in ("watchdog", "soft_watchdog"):
                raw = getattr(scheduler, name, None)
                raw = getattr(raw, "_raw", raw)
                if isinstance(raw, WatchdogRaw):
                    raw.get_counter, raw.is_active, raw.dump_info = int, bool, None
            channels = getattr(scheduler, "ipc_channels", None)
            for f in dataclasses.fields(channels) if dataclasses.is_dataclass(channels) else ():
                sock = getattr(channels, f.name)
                sock = getattr(sock, "socket", sock)
                if isinstance(sock, zmq.Socket):
                    sock.close(linger=0)
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
        if self.context is not None:
            rc.restore_context(self.context)           # what this process had published before

    # ----------------------------------------------------------- the forward stand-in
    def _write_track(self, slot: int, state: int) -> None:
        if self.track_writes == self.corrupt_track_write:
            state ^= 1                                 # the test hook: one wrong state
        self.track_writes += 1
        self.toy.write(slot, state)

    def _forward(self, batch: Any, **kwargs: Any) -> Any:
        import torch
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        t0 = time.process_time()
        fb = ForwardBatch.init_new(batch, self.runner, capture_hidden_mode=None,
                                   return_hidden_states_before_norm=False)
        self.runner._maybe_execute_deferred_mamba_cow_and_clear(fb)
        toy = self.toy
        slots = toy.slots(toy.pool.get_mamba_indices(fb.req_pool_indices))
        mask = fb.mamba_track_mask.tolist() if fb.mamba_track_mask is not None else None
        if mask is not None and fb.mamba_track_indices is None:
            mask = None
        track = toy.slots(fb.mamba_track_indices) if fb.mamba_track_indices is not None else None
        tokens = fb.input_ids.to(torch.int64).numpy()
        ends = []                                      # tokens consumed after this forward, per request
        if fb.forward_mode.is_extend():
            aligned = fb.mamba_track_aligned_lens() if mask is not None and any(mask) else None
            aligned = aligned.tolist() if aligned is not None else None
            at = 0
            for i, req in enumerate(batch.reqs):
                prefix, n = int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i])
                ends.append(prefix + n)
                fed = tokens[at:at + n]
                at += n
                state = toy.read(slots[i])
                if state is None or state != self.hasher.of(self.seqs[req.rid][:prefix]):
                    self.mismatches += 1
                    if len(self.examples) < 8:
                        self.examples.append((req.rid, prefix))
                if state is None:
                    state = 0
                if mask is not None and mask[i]:
                    self._write_track(track[i], self.hasher.advance(state, fed[:aligned[i]]))
                toy.write(slots[i], self.hasher.advance(state, fed))
        elif fb.forward_mode.is_decode():
            ends = [int(x) for x in fb.seq_lens.tolist()]
            for i in range(len(batch.reqs)):
                state = self.hasher.advance(toy.read(slots[i]) or 0, tokens[i:i + 1])
                toy.write(slots[i], state)
                if mask is not None and mask[i]:
                    self._write_track(track[i], state)
        else:
            raise RuntimeError(f"sglang-replay: unexpected forward mode {fb.forward_mode!r}")
        # teacher forcing: after n tokens, a request's next token is its sequence's n-th (a prompt token
        # after a partial chunk, which SGLang discards)
        nxt = [int(self.seqs[req.rid][min(n, len(self.seqs[req.rid]) - 1)]) for req, n in zip(batch.reqs, ends)]
        # the virtual clock: a decode step, or an extend's prompt tokens (the simulator's time model)
        step = SimConfig.decode_step_seconds
        self.launched = (self.launched or 0.0) + (
            max(step, len(tokens) * SimConfig.prefill_token_seconds) if fb.forward_mode.is_extend() else step)
        out = GenerationBatchResult(logits_output=LogitsProcessorOutput(next_token_logits=None),
                                    next_token_ids=torch.tensor(nxt, dtype=torch.int64),
                                    can_run_cuda_graph=False)
        self.forward_seconds += time.process_time() - t0
        return out

    # ----------------------------------------------------------- intake on the virtual clock
    def _encoded(self, r: SimRequest) -> Any:
        """Request ``r`` as the tokenizer would send it."""
        from sglang.srt.managers import io_struct
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=int(r.output_len), temperature=0.0)
        sp.normalize(None)
        sp.verify(self.vocab_size)
        req = io_struct.TokenizedGenerateReqInput(
            rid=r.rid, input_text=None, input_ids=array("q", np.asarray(r.input_ids, dtype=np.int64).tolist()),
            input_embeds=None, mm_inputs=None, token_type_ids=None, sampling_params=sp,
            return_logprob=False, logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None,
            stream=False, extra_key=r.extra_key)
        return req if io_struct._USE_PICKLE_IPC else io_struct.msgpack_encode(req)

    def _busy(self) -> bool:
        s = self.scheduler
        return (bool(s.waiting_queue) or not s.running_batch.is_empty() or s.chunked_req is not None
                or bool(getattr(s, "result_queue", None)))

    def _on_poll(self) -> None:
        """The start of a scheduler iteration: the clock moves by what the last iteration ran (or by a
        step / to the next arrival when it ran nothing), the requests it reaches are queued, and the loop
        is told to end once every request has finished and nothing is in flight."""
        s = self.scheduler
        step = SimConfig.decode_step_seconds
        pending = self.next_arrival < len(self.order)
        arrival = float(self.requests[self.order[self.next_arrival]].arrival) if pending else 0.0
        if self.launched is not None:
            self.clock += self.launched
            self.launched, self.stuck = None, 0
        elif self._busy():
            self.clock = max(self.clock + step, arrival) if pending else self.clock + step
            if not pending and s.running_batch.is_empty() and not getattr(s, "result_queue", None):
                self.stuck += 1
                if self.stuck > _STUCK_ROUNDS:
                    waiting = [r.rid for r in s.waiting_queue]
                    raise ReplayError("config", f"SGLang admits none of the {len(waiting)} waiting requests "
                                                f"({', '.join(waiting[:3])}{' ...' if len(waiting) > 3 else ''})"
                                                f" with nothing running: raise the KV pool (--kv-tokens) or "
                                                f"the state pool (--state-slots)")
        elif pending:
            self.clock = max(self.clock, arrival)
        elif s.last_batch is None:
            s.gracefully_exit = True                   # every request is done: the loop ends
            return
        while (self.next_arrival < len(self.order)
               and float(self.requests[self.order[self.next_arrival]].arrival) <= self.clock):
            self.inbox.queue.append(self.encoded[self.order[self.next_arrival]])
            self.next_arrival += 1

    def _run_loop(self, s: Any) -> None:
        """SGLang's own event loop (normal or overlap, as configured) until every request is done."""
        self.order = sorted(range(len(self.requests)), key=lambda i: (float(self.requests[i].arrival), i))
        self.next_arrival, self.clock, self.launched, self.stuck = 0, 0.0, None, 0
        s.run_event_loop()

    def run(self) -> ReplayResult:
        patches = _Patches()
        scheduler = None
        try:
            _device_stand_ins(patches)
            with tempfile.TemporaryDirectory(prefix="mambaradix-replay-") as model_dir:
                with open(os.path.join(model_dir, "config.json"), "w") as f:
                    json.dump(model_config(self.vocab_size, self.context_length), f)
                scheduler = self._build(model_dir, patches)
                self.encoded = [self._encoded(r) for r in self.requests]
                t0 = time.process_time()
                self._run_loop(scheduler)
                loop_seconds = time.process_time() - t0
            return self._result(scheduler, loop_seconds)
        finally:
            patches.undo()
            self._teardown(scheduler)

    def _result(self, s: Any, loop_seconds: float) -> ReplayResult:
        finished, tokens = self.outbox.outputs()
        rows = []
        for r in self.requests:
            if r.rid not in finished:
                raise RuntimeError(f"sglang-replay: request {r.rid!r} did not finish")
            reason, cached = finished[r.rid]
            if reason.get("type") == "abort":
                raise ReplayError("config", f"SGLang refused request {r.rid!r} ({len(r.input_ids)} prompt tokens): "
                                           f"{reason.get('message')}")
            if tokens.get(r.rid, []) != self.seqs[r.rid][len(r.input_ids):-2].tolist():
                raise RuntimeError(f"sglang-replay: request {r.rid!r} decoded other tokens than recorded")
            rows.append({"rid": r.rid, "prompt_tokens": len(r.input_ids), "cached_tokens": cached})
        c = self.config
        core = type(s.tree_cache.tree_core).__name__
        from sglang import __version__ as sglang_version

        config = {
            "sglang": sglang_version, "tree_core": c.tree_core, "tree_core_class": core,
            "state_slots": c.state_slots, "kv_tokens": c.kv_tokens, "page_size": c.page_size,
            "max_running": c.max_running, "mamba_strategy": c.mamba_strategy,
            "track_interval": c.track_interval, "chunked_prefill_size": c.chunked_prefill_size,
            "overlap": c.overlap, "tree_settings": self.tree_settings,
            "sglang_max_running_requests": int(s.max_running_requests),
            "sglang_kv_tokens": int(s.max_total_num_tokens),
            "sglang_state_slots": int(s.req_to_token_pool.mamba_pool.size),
            "schedule_policy": s.schedule_policy, "model": "qwen3_next, 4 layers (3 linear, 1 full), dummy "
                                                          f"weights, vocab {self.vocab_size}",
        }
        return ReplayResult(config=config, requests=rows,
                            scheduler_seconds=max(0.0, loop_seconds - self.forward_seconds),
                            forward_seconds=self.forward_seconds,
                            tree_cache_seconds=self.cache_clock.seconds, toy_state_mismatches=self.mismatches,
                            mismatch_examples=list(self.examples))


def replay(requests: Sequence[SimRequest], config: Optional[ReplayConfig] = None, *,
           sglang_path: Optional[str] = None, corrupt_track_write: Optional[int] = None) -> ReplayResult:
    """Run ``requests`` (simulator requests: ``mambaradix.sim.workloads``) through SGLang 0.5.23's own
    scheduler on CPU and return what it measured.

    ``sglang_path``: a ``pip install --target`` directory holding SGLang 0.5.23 (default:
    ``$MAMBARADIX_SGLANG_0523``, else the environment's ``sglang``); :class:`env.SGLangUnavailable` when
    it cannot be imported.  Bad settings raise :class:`ReplayError` before SGLang is touched.
    ``corrupt_track_write=k`` (tests): the k-th state written into a track slot is wrong, which the
    toy-state check must report."""
    config = (config or ReplayConfig()).resolved()
    if not requests:
        raise ReplayError("trace", "no requests")
    run = _Replay(requests, config, corrupt_track_write)
    env.load(sglang_path)
    return run.run()
