"""The quantization part of ``sam-report``: per SAM variant, the accuracy drop and the loss rise
after rounding the weights to each bit width (``quant_drop_<b>bit``, ``quant_loss_rise_<b>bit``),
beside the second-order prediction of that rise from the Hessian diagonal
(``quant_loss_rise_pred_<b>bit`` = Σ H_ii s_i²/24), and how well the prediction orders the jobs
(Kendall's τ between predicted and measured rise over every job that has both).

The numbers are eval.json's when sam-eval measured the job, else the training's
(``measure_ranking.job_values``). Present when some job carries a quantization measure
(``metrics=full``, or ``metrics.quantization.enabled=true``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..runfiles import finite
from .measure_ranking import kendall_tau, points_of
from .sections import SECTIONS
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from pathlib import Path

    from .sweep import Report

BITS_KEY = re.compile(r"^quant_drop_(\d+)bit$")


def quantization_rows(report: Report) -> dict | None:
    """{"bits": [widths, descending], "rows": {variant: {key: stats}}, "tau": {bits: (τ, n)}};
    None when no completed job carries a quantization drop."""
    values = [(p.variant, p.values) for p in points_of(report)]  # the jobs' numbers, read once
    values = [(variant, v) for variant, v in values if any(map(BITS_KEY.match, v))]  # quantized
    bits = sorted(
        {int(m.group(1)) for _, v in values for k in v if (m := BITS_KEY.match(k))}, reverse=True
    )
    if not bits:
        return None
    keys = ["test_acc"] + [
        f"quant_{kind}_{b}bit" for b in bits for kind in ("drop", "loss_rise", "loss_rise_pred")
    ]
    by_variant: dict = {}
    for variant, v in values:
        by_variant.setdefault(variant, []).append(v)
    rows = {
        variant: {k: stats([v.get(k) for v in vs]) for k in keys}
        for variant, vs in sorted(by_variant.items())
    }
    tau = {}
    for b in bits:
        pairs = [
            (v[f"quant_loss_rise_pred_{b}bit"], v[f"quant_loss_rise_{b}bit"])
            for _, v in values
            if finite(v.get(f"quant_loss_rise_pred_{b}bit"))
            and finite(v.get(f"quant_loss_rise_{b}bit"))
        ]
        if len(pairs) >= 3:
            tau[b] = (kendall_tau([p for p, _ in pairs], [m for _, m in pairs]), len(pairs))
    return {"bits": bits, "rows": rows, "tau": tau}


@SECTIONS.register("quantization", "accuracy and loss after rounding the weights", order=47)
def quantization_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's quantization section: accuracy and loss after rounding the weights, per
    variant and bit width."""
    found = quantization_rows(report)
    if found is None:
        return []
    head = ["variant", "test_acc"]
    for b in found["bits"]:
        head += [f"{b}-bit drop", f"{b}-bit loss rise", f"{b}-bit predicted rise"]
    head.append("n")
    out = ["## Quantization", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for variant, row in found["rows"].items():
        cells = [variant, stats_cell(row["test_acc"])]
        for b in found["bits"]:
            cells += [
                stats_cell(row[f"quant_{k}_{b}bit"])
                for k in ("drop", "loss_rise", "loss_rise_pred")
            ]
        out.append("| " + " | ".join([*cells, str(row["test_acc"]["n"])]) + " |")
    out += [
        "",
        "Mean ± std over each variant's quantized jobs. The drop is test_acc minus the accuracy "
        "of the weights rounded per output channel to b bits (symmetric, to nearest); the loss "
        "rise is the test loss's; the predicted rise is Σ H_ii s_i²/24 from the Hessian "
        "diagonal, s_i the rounding step (the rise of a uniform rounding error under a "
        "quadratic model).",
    ]
    for b, (tau, n) in sorted(found["tau"].items(), reverse=True):
        out.append(
            f"- {b} bits: Kendall's τ between predicted and measured loss rise {tau:+.3f} "
            f"over {n} jobs."
        )
    return out + [""]
