"""``python -m mambaradix COMMAND``: the package's command line.

Commands:
  sim    replay a workload through the cache and report hit rates (the default
         workload runs offline in seconds); ``python -m mambaradix sim --help``.
  sglang-replay
         replay a trace through SGLang 0.5.23's own scheduler on CPU;
         ``python -m mambaradix sglang-replay --help``.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

USAGE = """usage: python -m mambaradix COMMAND [ARGS...]

commands:
  sim      replay a workload through the cache and report hit rates, costs and
           why tokens are lost (try: python -m mambaradix sim --help)
  sglang-replay
           replay a trace through SGLang 0.5.23's own scheduler on CPU (try:
           python -m mambaradix sglang-replay --help)
  version  print the package version
"""


def _sim(argv: Sequence[str]) -> int:
    from .sim.cli import main as sim_main

    return sim_main(argv)


def _sglang_replay(argv: Sequence[str]) -> int:
    from .sglang_replay.cli import main as replay_main

    return replay_main(argv)


def _version(argv: Sequence[str]) -> int:
    from . import __version__

    if argv:
        print("usage: python -m mambaradix version", file=sys.stderr)
        print(f"mambaradix version: error: takes no arguments, got {' '.join(argv)}",
              file=sys.stderr)
        return 2
    print(__version__)
    return 0


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {"sim": _sim, "sglang-replay": _sglang_replay,
                                                       "version": _version}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "--version":
        return _version(rest)
    if command not in COMMANDS:
        print(USAGE, end="", file=sys.stderr)
        print(f"mambaradix: error: unknown command {command!r}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
