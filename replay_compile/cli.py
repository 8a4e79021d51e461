"""The ``replayssm`` command: ``demo``, ``bench {kernels,model,spec,accuracy}``, ``inspect FILE:FN``.

Each subcommand lives in its own module and is imported only when asked for, so ``replayssm demo``
does not pay for the benchmark code. A subcommand module exposes ``main(argv: list[str]) -> int``.
"""
from __future__ import annotations

import importlib
import sys

_COMMANDS = {
    "demo": "replay_compile.demo",
    "inspect": "replay_compile.inspect_cli",
    "bench kernels": "replay_compile.bench.kernels",
    "bench model": "replay_compile.bench.model",
    "bench spec": "replay_compile.bench.spec",
    "bench accuracy": "replay_compile.bench.accuracy",
}

_USAGE = """usage: replayssm COMMAND [ARGS...]

commands:
  demo                 decode a tiny model in replay form next to the standard recurrence
  inspect FILE:FN      show which recurrences the replayssm backend rewrites in FN
  bench kernels        kernel benchmark (GPU): replay vs standard vs fla vs torch
  bench model          decode-step benchmark of hybrid model layers (GPU)
  bench spec           speculative decoding: replay verify/commit vs state snapshots
  bench accuracy       split-precision error against a float64 reference over long decodes

Run `replayssm COMMAND --help` for a command's options."""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0
    name = " ".join(argv[:2]) if argv[0] == "bench" else argv[0]
    if name not in _COMMANDS:
        print(f"replayssm: unknown command {' '.join(argv[:2])!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    rest = argv[2:] if argv[0] == "bench" else argv[1:]
    return importlib.import_module(_COMMANDS[name]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
