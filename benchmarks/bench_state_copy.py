#!/usr/bin/env python3
"""Benchmark of the state-pool kernels: copy_slots, clear_slots, track_decode.

Each is timed against
  (a) SGLang's way in torch: one advanced-indexing op per state tensor
      (t[:, dst] = t[:, src], t[:, idx] = 0), and
  (b) the ceiling: a plain device-to-device copy (copy_) or fill (zero_) of
      one large buffer.
Bandwidth counts bytes read plus bytes written (a copy of B slots moves
2 * B * bytes_per_slot; a clear writes B * bytes_per_slot).

Default shapes are Qwen3-Next at TP=1: 36 layers, conv [8192, 3] bf16 and
SSM [32, 128, 128] fp32 per layer (77,266,944 bytes per slot), 256 slots
(about 20 GB).  `--device cpu --small` runs small shapes on the host.

    python3 benchmarks/bench_state_copy.py                      # GPU, full size
    python3 benchmarks/bench_state_copy.py --device cpu --small

GPU timings use CUDA events on one stream: warm-up, then `--reps` timed
loops of `--iters` calls each, median per call.  Index plans rotate over
several random draws so no two consecutive calls touch the same slots.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# Use the checkout this script lives in (built in place), not an installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("this benchmark needs torch")

import mambaradix


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--small", action="store_true", help="small shapes (4 layers, tiny states)")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--slots", type=int, default=None)
    p.add_argument("--batches", default="1,4,16,64")
    p.add_argument("--ops", default="copy,clear,track")
    p.add_argument("--iters", type=int, default=20, help="calls per timed loop")
    p.add_argument("--reps", type=int, default=7, help="timed loops (the median is reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed loops first")
    p.add_argument("--plans", type=int, default=4, help="random index plans to rotate over")
    p.add_argument("--ceiling-bytes", type=float, default=4e9, help="size of the ceiling copy (bytes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows as JSON here")
    return p.parse_args()


def shapes(args):
    if args.small:
        layers, slots = 4, 32
        conv = [((64, 3), torch.bfloat16)]
        ssm = ((2, 16, 16), torch.float32)
    else:
        layers, slots = 36, 256
        conv = [((8192, 3), torch.bfloat16)]
        ssm = ((32, 128, 128), torch.float32)
    return (args.layers or layers), (args.slots or slots), conv, ssm


class Timer:
    """Median seconds per call of fn(i) over rotating plans."""

    def __init__(self, device, args):
        self.cuda = device == "cuda"
        self.args = args
        if self.cuda:
            self.stream = torch.cuda.Stream()

    def __call__(self, fn):
        a = self.args
        per_call = []
        ctx = torch.cuda.stream(self.stream) if self.cuda else _nullctx()
        with ctx:
            k = 0
            for rep in range(a.warmup + a.reps):
                if self.cuda:
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                else:
                    t0 = time.perf_counter()
                for _ in range(a.iters):
                    fn(k)
                    k += 1
                if self.cuda:
                    end.record()
                    end.synchronize()
                    dt = start.elapsed_time(end) / 1e3
                else:
                    dt = time.perf_counter() - t0
                if rep >= a.warmup:
                    per_call.append(dt / a.iters)
        return statistics.median(per_call)

    def graph(self, fn):
        """Median seconds per call with `iters` calls captured in one CUDA
        graph (no Python or launch overhead between calls); None when the
        calls cannot be captured or on the CPU."""
        if not self.cuda:
            return None
        a = self.args
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.stream):
                for k in range(a.iters):
                    fn(k)
        except Exception as e:  # noqa: BLE001
            print(f"# graph capture failed ({type(e).__name__}: {e}); eager timing only", file=sys.stderr)
            torch.cuda.synchronize()
            return None
        per_call = []
        with torch.cuda.stream(self.stream):
            for rep in range(a.warmup + a.reps):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                if rep >= a.warmup:
                    per_call.append(start.elapsed_time(end) / 1e3 / a.iters)
        del g
        return statistics.median(per_call)

    @property
    def stream_handle(self):
        return self.stream.cuda_stream if self.cuda else None


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    args = parse_args()
    dev = args.device
    if dev == "cuda" and (not torch.cuda.is_available() or mambaradix.cuda_device_count() == 0):
        sys.exit("no CUDA device (use --device cpu --small)")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    layers, slots, conv_spec, (ssm_shape, ssm_dtype) = shapes(args)
    batches = [int(b) for b in args.batches.split(",")]
    batches = [b for b in batches if 2 * b <= slots]

    # The pool: torch tensors (so SGLang's torch way runs on the very same
    # memory), adopted by mambaradix through DLPack.  Random contents.
    conv = [torch.empty((layers, slots + 1) + s, dtype=dt, device=dev) for s, dt in conv_spec]
    temporal = torch.empty((layers, slots + 1) + ssm_shape, dtype=ssm_dtype, device=dev)
    for t in conv + [temporal]:
        t.view(torch.uint8).random_(0, 256) if t.dtype != torch.float32 else t.uniform_(-1, 1)
    tensors = conv + [temporal]
    pool = mambaradix.StatePool(conv, temporal)
    bps = pool.bytes_per_slot
    timer = Timer(dev, args)
    sh = timer.stream_handle
    unit, scale = ("TB/s", 1e12) if dev == "cuda" else ("GB/s", 1e9)

    # Ceilings: one large device-to-device copy and one large fill.
    n = int(min(args.ceiling_bytes, 2 * bps * max(batches)) // 16 * 16)
    n = max(n, 1 << 20)
    big_a = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 256)
    big_b = torch.empty_like(big_a)
    t_copy = timer(lambda i: big_b.copy_(big_a))
    t_fill = timer(lambda i: big_b.zero_())
    ceil_copy = 2 * n / t_copy
    ceil_fill = n / t_fill
    del big_a, big_b
    if dev == "cuda":
        torch.cuda.empty_cache()

    print(f"# device={dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'host'}), layers={layers}, "
          f"slots={slots}, bytes_per_slot={bps:,}, pool={bps * (slots + 1) / 1e9:.2f} GB")
    print(f"# ceiling: copy {ceil_copy / scale:.3f} {unit} ({n / 1e9:.2f} GB buffer), "
          f"fill {ceil_fill / scale:.3f} {unit}")

    rows = []
    ops = args.ops.split(",")
    for B in batches:
        plans = []
        for _ in range(args.plans):
            perm = rng.permutation(np.arange(1, slots + 1))
            src, dst = perm[:B], perm[B:2 * B]
            plans.append((torch.from_numpy(src).to(dev), torch.from_numpy(dst).to(dev)))
        mask = torch.ones(B, dtype=torch.bool, device=dev)
        P = len(plans)

        def torch_copy(i):
            s, d = plans[i % P]
            for t in tensors:
                t[:, d] = t[:, s]

        def torch_clear(i):
            _, d = plans[i % P]
            for t in tensors:
                t[:, d] = 0

        cases = {
            "copy": (lambda i: pool.copy_slots(plans[i % P][0], plans[i % P][1], stream=sh), torch_copy,
                     2 * B * bps, ceil_copy),
            "clear": (lambda i: pool.clear_slots(plans[i % P][1], stream=sh), torch_clear, B * bps, ceil_fill),
            "track": (lambda i: pool.track_decode(plans[i % P][0], plans[i % P][1], mask, stream=sh),
                      torch_copy, 2 * B * bps, ceil_copy),
        }
        for op in ops:
            ours_fn, torch_fn, nbytes, ceil = cases[op]
            e_ours = timer(ours_fn)
            e_torch = timer(torch_fn)
            g_ours = timer.graph(ours_fn)
            g_torch = timer.graph(torch_fn)
            # Kernel time: graph replay when both could be captured.
            graph = g_ours is not None and g_torch is not None
            t_ours, t_torch = (g_ours, g_torch) if graph else (e_ours, e_torch)
            # Correctness spot check on the last plan: destinations equal
            # sources (or zero) after our kernel.
            ours_fn(0)
            if dev == "cuda":
                torch.cuda.synchronize()
            s, d = plans[0]
            for t in tensors:
                want = torch.zeros_like(t[:, d]) if op == "clear" else t[:, s]
                assert torch.equal(t[:, d].view(torch.uint8), want.view(torch.uint8)), (op, B)
            bw = nbytes / t_ours
            row = {
                "op": op, "B": B, "bytes": nbytes, "timing": "graph" if graph else "eager",
                "ours_us": t_ours * 1e6, "torch_us": t_torch * 1e6,
                "ours_eager_us": e_ours * 1e6, "torch_eager_us": e_torch * 1e6,
                "ours_bw": bw / scale, "torch_bw": nbytes / t_torch / scale, "ceiling_bw": ceil / scale,
                "pct_ceiling": 100 * bw / ceil, "speedup": t_torch / t_ours, "unit": unit,
            }
            if dev == "cuda":
                target_pct = 75 if B == 1 else 90
                row["meets_targets"] = bool(row["pct_ceiling"] >= target_pct and row["speedup"] >= 4.5)
            rows.append(row)

    print("# ours/torch us: per call, from CUDA-graph replay when capturable (timing=graph), else eager;")
    print("# eager us: per call from Python, launch overhead included")
    hdr = (f"{'op':<6} {'B':>3} {'MB moved':>9} {'ours us':>9} {'torch us':>9} {'ours ' + unit:>10} "
           f"{'% ceil':>7} {'x torch':>8} {'eager us':>9} {'torch eager':>11} {'timing':>6}"
           + (f" {'target':>7}" if dev == "cuda" else ""))
    print(hdr)
    for r in rows:
        line = (f"{r['op']:<6} {r['B']:>3} {r['bytes'] / 1e6:>9.1f} {r['ours_us']:>9.1f} {r['torch_us']:>9.1f} "
                f"{r['ours_bw']:>10.3f} {r['pct_ceiling']:>6.1f}% {r['speedup']:>7.2f}x "
                f"{r['ours_eager_us']:>9.1f} {r['torch_eager_us']:>11.1f} {r['timing']:>6}")
        if "meets_targets" in r:
            line += f" {'ok' if r['meets_targets'] else 'MISS':>7}"
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "layers": layers, "slots": slots, "bytes_per_slot": bps,
                       "ceiling_copy": ceil_copy / scale, "ceiling_fill": ceil_fill / scale, "unit": unit,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
