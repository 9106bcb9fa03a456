"""``python -m mambaradix sglang-replay``: replay a trace through SGLang 0.5.23's own scheduler on CPU.

Exit status: 0 when the replay ran and every restored toy state was exact; 1 when a toy state differed
(the report is printed first) or on an internal error; 2 for bad input (a bad option, a malformed trace,
a configuration SGLang refuses, SGLang 0.5.23 not importable): one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import warnings
from typing import Iterator, NoReturn, Optional, Sequence

from ..sim import cli as sim_cli
from ..sim import workloads as wl
from . import env
from .replay import STRATEGIES, TREE_CORES, ReplayConfig, ReplayError, ReplayResult

PROG = "python -m mambaradix sglang-replay"
#: The simulator's option groups that describe a workload; sglang-replay takes them as they are there.
WORKLOAD_GROUPS = ("workload", "generated shared prefix", "multi-turn chat", "agentic branching",
                   "agent sessions", "RAG over", "multi-tenant chat", "long-document QA")
#: ReplayConfig field -> the option that sets it (for messages).
OPTIONS = {"tree_core": "--tree-core", "state_slots": "--state-slots", "kv_tokens": "--kv-tokens",
           "page_size": "--page-size", "max_running": "--max-running", "mamba_strategy": "--mamba-strategy",
           "track_interval": "--track-interval", "chunked_prefill_size": "--chunked-prefill-size",
           "overlap": "--disable-overlap-schedule", "trace": "--trace", "state_policy": "--state-policy",
           "utility_order": "--utility-order", "end_of_turn_states": "--end-of-turn-states",
           "path_state_budget": "--path-state-budget"}


class UserError(Exception):
    """Reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Replay a trace through SGLang 0.5.23's own Scheduler, in this process, on CPU: a small "
                    "Qwen3-Next-like model with a teacher-forced stand-in forward and toy recurrent states. "
                    "Reports SGLang's own cached_tokens per request, the token hit rate, the scheduler's CPU "
                    "time per request and toy-state mismatches (docs/sglang-replay.md).",
        epilog="Examples:\n"
               f"  {PROG} --trace conv.jsonl --tree-core mambaradix --json\n"
               f"  {PROG} --workload multiturn --num-clients 8 --num-rounds 4 --state-slots 24\n"
               f"  {PROG} --workload mooncake --limit 200 --kv-tokens 400000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sim_parser = sim_cli.build_parser()
    for group in sim_parser._action_groups:
        if (group.title or "").startswith(WORKLOAD_GROUPS):
            mine = p.add_argument_group(group.title)
            for action in group._group_actions:
                mine._add_action(action)
    c = p.add_argument_group("SGLang's scheduler")
    d = ReplayConfig()
    c.add_argument("--tree-core", choices=tuple(TREE_CORES), default=d.tree_core,
                   help="SGLang's TreeCore backend: python, rust (SGLang's default) or mambaradix "
                        "(default: %(default)s)")
    c.add_argument("--state-slots", type=sim_cli._int_opt(1), default=d.state_slots, metavar="N",
                   help="Mamba state slots (--max-mamba-cache-size; default: %(default)s)")
    c.add_argument("--kv-tokens", type=sim_cli._int_opt(1), default=d.kv_tokens, metavar="N",
                   help="KV pool size in tokens (--max-total-tokens; default: %(default)s)")
    c.add_argument("--page-size", type=sim_cli._int_opt(1), default=d.page_size, metavar="P",
                   help="KV page size (default: %(default)s)")
    c.add_argument("--max-running", type=sim_cli._int_opt(1), metavar="N",
                   help="--max-running-requests (default: state slots // 5, 1 to 64, as the simulator)")
    c.add_argument("--mamba-strategy", choices=STRATEGIES, default=d.mamba_strategy,
                   help="--mamba-radix-cache-strategy (default: %(default)s)")
    c.add_argument("--track-interval", type=sim_cli._int_opt(1), default=d.track_interval, metavar="N",
                   help="--mamba-track-interval: decode snapshot interval, a multiple of the page size "
                        "(default: %(default)s)")
    c.add_argument("--chunked-prefill-size", type=sim_cli._int_opt(0), default=d.chunked_prefill_size, metavar="N",
                   help="prompt tokens prefilled per chunk (0: off; default: %(default)s)")
    c.add_argument("--disable-overlap-schedule", action="store_true",
                   help="SGLang's normal loop instead of its overlap scheduler (default: overlap, except "
                        "no_buffer, which SGLang runs without it)")
    t = p.add_argument_group("the mambaradix TreeCore's state policies (--tree-core mambaradix; default: its "
                             "MAMBARADIX_* settings from the environment, as in a server)")
    t.add_argument("--state-policy", metavar="NAME",
                   help="the tree's state policy (MAMBARADIX_STATE_POLICY), a name of its policy table: utility "
                        "(FLOPs saved per byte + recency, tuned online), consumed (SGLang's lru), ...")
    t.add_argument("--utility-order", choices=("mru", "lru"),
                   help="utility policy: initial recency order (MAMBARADIX_UTILITY_ORDER; default mru)")
    t.add_argument("--end-of-turn-states", action="store_true", default=None,
                   help="a finished request leaves the state at its exact end in the tree "
                        "(MAMBARADIX_END_OF_TURN_STATES)")
    t.add_argument("--path-state-budget", type=sim_cli._int_opt(0), metavar="N",
                   help="per-path state budget: a path keeps at most N states (MAMBARADIX_PATH_STATE_BUDGET; "
                        "0: none)")
    c.add_argument("--sglang-path", metavar="DIR",
                   help=f"a pip install --target directory holding SGLang {env.WANT} (default: "
                        f"${env.ENV_VAR}, else the environment's sglang)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true",
                   help='print {"config", "metrics", "requests"} as JSON instead of tables')
    return p


def _config(args: argparse.Namespace) -> ReplayConfig:
    return ReplayConfig(
        tree_core=args.tree_core, state_slots=args.state_slots, kv_tokens=args.kv_tokens,
        page_size=args.page_size, max_running=args.max_running, mamba_strategy=args.mamba_strategy,
        track_interval=args.track_interval, chunked_prefill_size=args.chunked_prefill_size,
        overlap=False if args.disable_overlap_schedule else None, state_policy=args.state_policy,
        utility_order=args.utility_order, end_of_turn_states=args.end_of_turn_states,
        path_state_budget=args.path_state_budget).resolved()


def _message(e: ReplayError) -> str:
    option = OPTIONS.get(e.option)
    return f"{option}: {e.reason}" if option else e.reason


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """SGLang's logging below ERROR, warnings and anything it prints go to stderr or nowhere, so stdout
    holds the report alone."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def format_report(result: ReplayResult, workload: dict) -> str:
    c, m = result.config, result.metrics()
    lines = [
        f"{workload['name']}: {m['requests']:,} requests, {result.prompt_tokens:,} prompt tokens",
        f"SGLang {c['sglang']} Scheduler ({'overlap' if c['overlap'] else 'normal'} loop, "
        f"{c['schedule_policy']}), tree core {c['tree_core']} ({c['tree_core_class']}), "
        f"{c['mamba_strategy']}, {c['state_slots']:,} state slots, {c['kv_tokens']:,} KV tokens, "
        f"page {c['page_size']}, max running {c['max_running']}, track interval {c['track_interval']}, "
        f"chunked prefill {c['chunked_prefill_size'] or 'off'}",
        "",
        f"  token hit rate             {m['token_hit_rate']:7.1%}   ({m['cached_tokens_total']:,} of "
        f"{result.prompt_tokens:,} prompt tokens cached, SGLang's cached_tokens)",
        f"  requests                   {m['requests']:7,}",
        f"  scheduler CPU / request    {m['scheduler_us_per_request']:7,.0f} us (the stand-in forward's "
        f"{result.forward_seconds:.2f} s excluded)",
        f"    of which the tree cache  {m['tree_cache_us_per_request']:7,.0f} us (inside its methods)",
        f"  toy-state mismatches       {m['toy_state_mismatches']:7,}",
        "",
        f"  {'rid':<24} {'prompt':>8} {'cached':>8} {'hit':>7}",
    ]
    shown = result.requests[:20]
    for r in shown:
        hit = r["cached_tokens"] / r["prompt_tokens"] if r["prompt_tokens"] else 0.0
        lines.append(f"  {r['rid']:<24} {r['prompt_tokens']:>8,} {r['cached_tokens']:>8,} {hit:>7.1%}")
    if len(result.requests) > len(shown):
        lines.append(f"  (the first {len(shown)} of {len(result.requests):,} requests; --json lists all)")
    if c["tree_core_class"] != TREE_CORES[c["tree_core"]][1]:
        lines.append(f"note: SGLang built {c['tree_core_class']} instead of the {c['tree_core']} core "
                     f"(a fallback it logs)")
    return "\n".join(lines)


def build_workload(args: argparse.Namespace):
    """The requests and their description, built by the simulator's workload options.  No per-request KV
    check here: the replay checks the KV pool against SGLang's own admission."""
    if not hasattr(args, "max_workload_mem"):
        args.max_workload_mem = wl.DEFAULT_MAX_BYTES
    return sim_cli._build_workload(args, None)


def run_cli(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, replay, print; returns the exit status (raises UserError for bad input)."""
    from .replay import replay

    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        config = _config(args)
    except ReplayError as e:
        raise UserError(_message(e)) from None
    try:
        requests, workload = build_workload(args)
    except (sim_cli.UserError, wl.WorkloadError, OSError) as e:
        text = getattr(e, "strerror", None) or str(e)
        raise UserError(f"--trace: {text}" if args.trace and isinstance(e, (OSError, wl.WorkloadError))
                        else text) from None
    try:
        with _quiet():
            result = replay(requests, config, sglang_path=args.sglang_path)
    except env.SGLangUnavailable as e:
        raise UserError(str(e)) from None
    except ReplayError as e:
        raise UserError(_message(e)) from None
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=1)
        print()
    else:
        print(format_report(result, workload))
    if result.toy_state_mismatches:
        rid, prefix = result.mismatch_examples[0]
        print(f"mambaradix sglang-replay: {result.toy_state_mismatches} restored toy state(s) differ from the "
              f"recomputation (first: request {rid!r}, {prefix} matched tokens)", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command: run_cli, with bad input reported as one line and exit status 2."""
    try:
        return run_cli(argv)
    except (UserError, KeyboardInterrupt) as e:
        print(f"mambaradix sglang-replay: {'error: ' + str(e) if isinstance(e, UserError) else 'interrupted'}",
              file=sys.stderr)
        return 2 if isinstance(e, UserError) else 130
