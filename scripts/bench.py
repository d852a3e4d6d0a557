"""Speed and memory figures for the README: ratios measured side by side in one process,
several repeats, medians. Each area of the code has a section module (scripts/bench_*.py)
exposing ``run(args) -> dict`` of flat keys; this driver runs the ones asked for.

    python scripts/bench.py                 # every section, a table on stdout
    python scripts/bench.py --only optim    # one section
    python scripts/bench.py --json out.json # also a flat JSON object
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
SECTIONS = [
    "core",
    "optim",
    "sampa",
    "metrics",
    "scale",
    "results",
    "eos",
    "landscape",
    "eval",
    "augment",
    "costs",
    "folder",
    "threads",
    "objectives",
    "search",
    "cheaper",
    "federated",
    "lm",
    "plan",
    "memory",
    "circuits",
    "hf",
    "fsdp",
    "compile",
    "host",
]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", nargs="*", choices=SECTIONS, help="sections to run (default: all)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per measurement (median taken)")
    ap.add_argument(
        "--quick", action="store_true", help="fewer repeats and smaller budgets (a smoke run)"
    )
    ap.add_argument("--json", type=Path, help="write the figures as one flat JSON object")
    args = ap.parse_args(argv)
    results = {}
    for name in args.only or SECTIONS:
        try:
            module = importlib.import_module(f"bench_{name}")
        except ModuleNotFoundError:
            print(f"[{name}] no section module scripts/bench_{name}.py yet", file=sys.stderr)
            continue
        print(f"[{name}] running ...", file=sys.stderr, flush=True)
        section = module.run(args)
        results.update(section)
        # each section's figures as soon as it ends: a long run that is stopped keeps what it
        # measured
        width = max((len(k) for k in section), default=10)
        for k, v in section.items():
            print(
                f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}",
                flush=True,
            )
        if args.json:
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
