"""How many Lanczos steps the spectral density needs: the measurement behind
``metrics.density.num_steps`` (docs/metrics.md#density).

For each subset size it runs ``--runs`` SLQ runs of ``--reference`` steps (the seeded Rademacher
start vectors of ``spectral_density``) on the Hessian of the first N samples of a job's
measurement subset. A run of S steps is the first S steps of a longer one (full
reorthogonalisation), so every S ≤ reference is read off the same tridiagonals. For each S it
prints how far the smoothed density (``smoothed_density``, σ = resolution × the spectral range)
is from the reference run's: the L1 distance over the whole density (its mass is 1) and, over
the outliers (λ above a tenth of the range), the L1 distance relative to their mass. Beside them
the spread of single runs around the mean of the runs, the statistical error SLQ has anyway.

    python scripts/slq_steps.py --job outputs/default --sizes 1024,4096 --save slq.json
    python scripts/slq_steps.py --load slq.json          # the table again, from the saved runs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

STEPS = (10, 15, 18, 20, 21, 22, 23, 24, 25, 30, 40, 50, 60, 80, 100, 120)


def tridiagonals(job: Path, sizes, runs: int, reference: int) -> dict:
    """{size: [{alphas, betas} per run]} on the first ``size`` samples of the job's subset."""
    from sam_runner.losses import mean_loss
    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.metrics.measures import leading_batches
    from sam_runner.metrics.solvers import lanczos
    from sam_runner.rebuild import load_run

    run = load_run(job, torch.device("cpu"), "last", "slq_steps", strict=True)
    model, seed = run.model.eval(), int(run.cfg.seed)
    x, y = run.data.train_subset(4096, seed)  # the default metrics.hessian subset
    batches = [(x[i : i + 512], y[i : i + 512]) for i in range(0, len(y), 512)]
    out = {}
    for n in sizes:
        with HessianOperator(model, mean_loss("cross_entropy"), leading_batches(batches, n)) as op:
            g = torch.Generator().manual_seed(seed)
            starts = [(torch.randint(0, 2, (op.numel,), generator=g) * 2 - 1) for _ in range(runs)]
            out[str(n)] = [
                _abt(lanczos(op, op.numel, 1, 1e-3, reference, v.double(), g, stop=False))
                for v in starts
            ]
    return out


def _abt(r) -> dict:
    return {"alphas": r.alphas, "betas": r.betas}


def density_at(runs, steps: int) -> dict:
    """``spectral_density``'s dictionary for the first ``steps`` steps of each run."""
    from sam_runner.metrics.solvers import tridiagonal

    nodes, weights = [], []
    for r in runs:
        evals, evecs = torch.linalg.eigh(tridiagonal(r["alphas"][:steps], r["betas"]))
        nodes.append(evals.tolist())
        weights.append((evecs[0] ** 2).tolist())
    return {"nodes": nodes, "weights": weights}


def table(runs, resolution: float) -> list[str]:
    from sam_runner.metrics.solvers import smoothed_density

    reference = len(runs[0]["alphas"])
    ref = density_at(runs, reference)
    lo, hi = min(min(n) for n in ref["nodes"]), max(max(n) for n in ref["nodes"])
    sigma = resolution * (hi - lo)
    grid = torch.linspace(lo - 4 * sigma, hi + 4 * sigma, 4000, dtype=torch.float64)
    dx, tail = float(grid[1] - grid[0]), grid > lo + 0.1 * (hi - lo)
    p_ref = smoothed_density(ref, grid, sigma)
    tail_mass = float(p_ref[tail].sum()) * dx

    def distances(p):
        d = (p - p_ref).abs()
        return float(d.sum()) * dx, float(d[tail].sum()) * dx / tail_mass

    singles = [distances(smoothed_density(density_at([r], reference), grid, sigma)) for r in runs]
    rows = [
        f"range [{lo:.3f}, {hi:.3f}], σ = {sigma:.3f}; single runs around their mean: "
        f"L1 {sum(s[0] for s in singles) / len(runs):.4f}, outliers "
        f"{sum(s[1] for s in singles) / len(runs):.3f} (of the mean of {len(runs)}: /√{len(runs)})"
    ]
    for steps in (s for s in STEPS if s < reference):
        whole, outliers = distances(smoothed_density(density_at(runs, steps), grid, sigma))
        rows.append(f"  {steps:>4} steps: L1 {whole:.2e}, outliers {outliers:.2e}")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--job", type=Path, help="a run folder (sam-run's)")
    ap.add_argument("--sizes", default="1024,4096", help="subset sizes, comma-separated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reference", type=int, default=160, help="steps of the reference runs")
    ap.add_argument("--resolutions", default="0.002,0.001", help="σ as fractions of the range")
    ap.add_argument("--save", type=Path)
    ap.add_argument("--load", type=Path)
    args = ap.parse_args(argv)
    if args.load:
        data = json.loads(args.load.read_text())
    else:
        sizes = [int(s) for s in args.sizes.split(",")]
        data = tridiagonals(args.job, sizes, args.runs, args.reference)
        if args.save:
            args.save.write_text(json.dumps(data))
    for size, runs in data.items():
        for resolution in (float(r) for r in args.resolutions.split(",")):
            print(f"{size} samples, resolution {resolution}:")
            print("\n".join(table(runs, resolution)))


if __name__ == "__main__":
    main()
