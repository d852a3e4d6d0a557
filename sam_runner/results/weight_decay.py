"""The weight-decay part of ``sam-report`` (the ``ouidecay`` presets): what OUIDecay did to each
layer, beside the groups with constant decay. A table of each layer's final coefficient as a
multiple of ``base_optimizer.weight_decay`` (``summary.json``'s ``weight_decay_layers``) and the
last logged OUI, and ``weight_decay.png``: the OUI by epoch per group, and the final multiples
by layer per OUIDecay group.

Present when some completed job rescaled its decay (``weight_decay=ouidecay``); the groups with
constant decay appear beside them with their OUI where they logged it (``metrics.oui=true``, as
the presets set), their coefficients being 1 × λ by definition.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..runfiles import finite
from .sections import SECTIONS, figure
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from .sweep import Report

STEM = "weight_decay"


def _job(run) -> dict:
    """One job's final multiples {layer: λ_l / λ}, its OUI by epoch and its last OUI."""
    base = run.get("base_optimizer.weight_decay")
    layers = (run.summary or {}).get("weight_decay_layers") or {}
    # six digits: the coefficients are float32, and their last bits are no difference to show
    if not (finite(base) and base):
        layers = {}
    multiples = {k: float(f"{v / base:.6g}") for k, v in layers.items() if finite(v)}
    oui = {r["epoch"]: r["oui"] for r in run.rows() if "epoch" in r and finite(r.get("oui"))}
    return {"multiples": multiples, "oui": oui, "last_oui": oui[max(oui)] if oui else None}


def weight_decay_groups(report: Report) -> list[dict] | None:
    """Per group (report.md's order) with a rescaled decay or a logged OUI: {"label", "layers":
    {layer: stats of the multiple}, "oui": {epoch: [OUI of each job]}, "last_oui": stats, "n"};
    None when no job rescaled its decay (found from the summaries alone: no metrics file read)."""
    runs = {j.path: j.run for j in report.completed()}
    if not any((r.summary or {}).get("weight_decay_layers") for r in runs.values()):
        return None
    out = []
    for g in report.groups:
        jobs = [_job(runs[d]) for d in g["dirs"] if d in runs]
        jobs = [j for j in jobs if j["multiples"] or j["oui"]]
        if not jobs:
            continue
        names = list(dict.fromkeys(k for j in jobs for k in j["multiples"]))
        oui: dict = {}
        for j in jobs:
            for epoch, value in j["oui"].items():
                oui.setdefault(epoch, []).append(value)
        out.append(
            {
                "label": g["label"],
                "layers": {k: stats([j["multiples"].get(k) for j in jobs]) for k in names},
                "oui": oui,
                "last_oui": stats([j["last_oui"] for j in jobs]),
                "n": len(jobs),
            }
        )
    return out


def write_weight_decay(report: Report, out_dir: Path) -> list[Path]:
    """The figure of each layer's decay multiple and the OUI, when a job rescaled its decay."""
    groups = weight_decay_groups(report)
    if groups is None:
        return []
    from ..plots.cache import save_plot
    from ..plots.weight_decay import plot_weight_decay

    return [save_plot(out_dir, STEM, report.plot_format, plot_weight_decay, groups)]


@SECTIONS.register(
    "weight_decay", "each layer's weight decay under OUIDecay, and the OUI", order=47,
    files=write_weight_decay,
)  # fmt: skip
def weight_decay_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's weight-decay section: each layer's decay under OUIDecay, and the OUI."""
    groups = weight_decay_groups(report)
    if groups is None:
        return []
    layers = list(dict.fromkeys(k for g in groups for k in g["layers"]))
    head = ["group", *(f"`{k}`" for k in layers), "OUI at the end", "n"]
    out = ["## Weight decay by layer", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        cells = [
            "×" + stats_cell(g["layers"][k]) if k in g["layers"] else "×1 (constant)"
            for k in layers
        ]
        label = g["label"].replace("|", "\\|")
        out.append(f"| {label} | " + " | ".join([*cells, stats_cell(g["last_oui"]), str(g["n"])]))
        out[-1] += " |"
    return out + [
        "",
        figure(f"{STEM}.{report.plot_format}"),
        "",
        "Each layer's weight-decay coefficient at the end of training as a multiple of "
        "base_optimizer.weight_decay (mean ± std over seeds; OUIDecay keeps each between "
        "weight_decay.scale_min and scale_max, set from the layer's OUI relative to the other "
        "layers), and the OUI (the Overfitting-Underfitting Indicator, mean over the conv and "
        "linear layers) of the last evaluation. Groups with constant decay keep 1 × λ in every "
        "layer; their OUI is logged with metrics.oui=true. docs/weight_decay.md defines both.",
        "",
    ]
