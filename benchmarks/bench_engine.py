"""Replay the Mooncake conversation trace state-free and report where the time goes.

    python benchmarks/bench_engine.py [--trace PATH] [--mode pp2] [--limit N]

Each hash id of the trace stands for a 512-token block; it is expanded into 512
deterministic pseudo tokens (a splitmix64 of ``id * 512 + position``), the
last block cut to ``input_length``.  Arrivals are the trace's timestamps.
Prints the wall time of the expansion, of the Python driver and of the C
cache (time spent in tree calls), the process CPU time of the expansion and of
the replay (a better measure on a shared machine), and the headline metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from mambaradix.sim import engine
from mambaradix.sim.types import SimConfig, SimRequest

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _block_tokens(ids: np.ndarray) -> np.ndarray:
    """[n, 512] int32 tokens of blocks ``ids`` (splitmix64, mod 2**31 - 1)."""
    x = (ids.astype(np.uint64)[:, None] * np.uint64(512)
         + np.arange(512, dtype=np.uint64)[None, :] + np.uint64(0x9E3779B97F4A7C15))
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(2**31 - 1)).astype(np.int32)


def load_mooncake(path: str, limit: int | None = None) -> list[SimRequest]:
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if limit is not None and len(rows) >= limit:
                break
    all_ids = np.unique(np.concatenate([np.asarray(r["hash_ids"], dtype=np.int64)
                                        for r in rows]))
    table = _block_tokens(all_ids)                       # one row per distinct block
    reqs = []
    for i, r in enumerate(rows):
        pos = np.searchsorted(all_ids, np.asarray(r["hash_ids"], dtype=np.int64))
        toks = table[pos].reshape(-1)[:int(r["input_length"])]
        reqs.append(SimRequest(f"m{i}", np.ascontiguousarray(toks),
                               max(1, int(r["output_length"])),
                               arrival=float(r["timestamp"]) / 1000.0))
    return reqs


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    default = os.path.join(here, "..", "..", "..", "shared", "data",
                           "mooncake_conversation_trace.jsonl")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default=os.environ.get("MOONCAKE_TRACE", default))
    ap.add_argument("--mode", default="pp2")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--kv-tokens", type=int, default=1 << 20)
    ap.add_argument("--state-slots", type=int, default=256)
    ap.add_argument("--max-running", type=int, default=48)
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    reqs = load_mooncake(args.trace, args.limit)
    t_expand, c_expand = time.perf_counter() - t0, time.process_time() - c0
    cfg = SimConfig(mode=args.mode, kv_tokens=args.kv_tokens, state_slots=args.state_slots,
                    max_running=args.max_running)
    c1 = time.process_time()
    m = engine.run(reqs, cfg)
    c_replay = time.process_time() - c1
    w = m.wall_seconds
    print(f"requests {m.requests}, prompt tokens {m.prompt_tokens:,}")
    print(f"wall: expansion {t_expand:.2f}s, driver {w['driver']:.2f}s, cache {w['cache']:.2f}s,"
          f" replay total {w['total']:.2f}s")
    print(f"CPU time (this process, robust to other load): expansion {c_expand:.2f}s, "
          f"replay {c_replay:.2f}s")
    print(f"token hit rate {m.token_hit_rate:.4f} (KV matched {m.kv_hit_rate:.4f}),"
          f" state hit rate {m.state_hit_rate:.4f}")
    print(f"lost: no state {m.lost_no_state:,}, alignment {m.lost_alignment:,}, eviction "
          f"{m.lost_eviction:,}, match cap {m.lost_match_cap:,}; never seen "
          f"{m.never_seen_tokens:,}")
    print(f"evictions: full {m.full_evictions}, states {m.state_evictions}, KV tokens "
          f"{m.kv_tokens_evicted:,}; peak slots {m.peak_state_slots}, peak KV "
          f"{m.peak_kv_tokens:,}")


if __name__ == "__main__":
    main()
