"""One benchmark point in this (fresh) process, started by :func:`benchmarks.harness.launch`:

    python -m benchmarks.worker MODULE:FUNCTION --point JSON [--memory_cap_gib G] [--plugin MODULE ...]

Caps the address space first (before torch is imported), imports the plugins (they register attention types
the point may name), calls the point function with the point's settings as attributes and prints its record
as JSON on the last line of stdout.
"""

from __future__ import annotations

import argparse
import importlib
import json

from benchmarks.harness import cap_address_space
from benchmarks.plugins import load_plugins


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("function", help="MODULE:FUNCTION, a point function")
    parser.add_argument("--point", required=True, help="the point's settings as a JSON object")
    parser.add_argument("--memory_cap_gib", type=float, default=0.0)
    parser.add_argument("--plugin", action="append", default=[])
    args = parser.parse_args(argv)
    cap_address_space(args.memory_cap_gib)
    load_plugins(args.plugin)
    module, name = args.function.split(":")
    function = getattr(importlib.import_module(module), name)
    print(json.dumps(function(argparse.Namespace(**json.loads(args.point)))))


if __name__ == "__main__":
    main()
