"""A sweep's figures (``sam-report``): a metric against ρ, and test accuracy against λ_max.

Each SAM variant keeps one colour in every figure (style.variant_color). When the sweep
varies more than ρ and the variant (a model, a batch size, a learning rate), each combination
of those other values gets its own panel, titled with them, instead of one legend of long
override strings. A ρ axis spanning a decade or more is logarithmic; with ρ = 0 among the
values it is symlog, linear below the smallest ρ > 0, and the axis label says so. A sweep of
few ρ values has its ticks at those values. Points are the mean over a group's seeds, bars (and
the band of a variant without ρ) ± 1 sample standard deviation: the legend's title says so.
One legend for the figure, under the panels, so that it never takes a panel's width.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..runfiles import finite
from .style import FONT, figure, log_scale, natural_key, variant_color

if TYPE_CHECKING:
    from collections.abc import Iterable

    from matplotlib.figure import Figure

MAX_PANELS = 12  # more combinations than this: one panel, the combination in the legend
MAX_RHO_TICKS = 8  # up to this many ρ values: a tick at each, none between
DODGE_POINTS = 5.0  # the sideways gap between two variants' points at one ρ (typographic points)
BOUND_LABEL = "stability bound (bΓ/(2ρη²))^(1/3)"
SPREAD = "points: mean over seeds; bars, bands: ± 1 sample std (n in report.md)"


def _panels(groups: list[dict]) -> dict[str, list[dict]]:
    """Groups by panel (their sweep values other than the variant and ρ), in stage order (a
    preset in stages), then natural order. Where some panel has a variant with ρ, panels of
    base levels alone are left out: they have nothing to draw against ρ (a pretraining stage)."""
    by_panel: dict[str, list[dict]] = {}
    for g in groups:
        by_panel.setdefault(g.get("panel", ""), []).append(g)
    with_rho = {k: gs for k, gs in by_panel.items() if any(finite(g.get("rho")) for g in gs)}
    order = lambda kv: (min(g.get("stage_index", 0) for g in kv[1]), natural_key(kv[0]))  # noqa: E731
    return dict(sorted((with_rho or by_panel).items(), key=order))


def plot_metric_vs_rho(
    groups: list[dict],
    metric: str,
    ylabel: str,
    logy: bool = False,
    bounds: bool = False,
    title: str = "",
) -> Figure:
    """Mean ± std of ``metric`` per group against ρ: one line per variant in its colour, one
    panel per combination of the sweep's other values. A variant without ρ (``base``) is a
    dotted level with its ±std band. ``bounds``: each group's TLC-SAM stability bounds (its
    ``bounds`` list of (ρ, bound)) dashed in the variant's colour."""
    panels = _panels(groups)
    if len(panels) > MAX_PANELS:  # too many to split: one panel, the values in the line labels
        panels = {
            "": [dict(g, line=f"{g['variant']} {g.get('panel', '')}".strip()) for g in groups]
        }
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = figure(nrows, ncols, size=(4.6 * ncols + 0.6, 3.6 * nrows + 1.2))
    rhos = [g["rho"] for g in groups if finite(g.get("rho"))]
    for ax, (panel, members) in zip(axes.flat, panels.items()):
        drawn = _draw_panel(ax, members, metric, logy, bounds)
        if logy and drawn:
            log_scale(ax, "y", drawn)
        _rho_axis(ax, rhos)
        ax.set_ylabel(ylabel, fontsize=FONT)
        ax.set_title(panel or None, fontsize=FONT)
        if not drawn:
            _say_empty(ax, "no completed job logged this")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    _figure_legend(fig, axes)
    fig.suptitle(title or f"{ylabel} against ρ", fontsize=FONT + 2)
    return fig


def _say_empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="gray")


def _draw_panel(ax, members: list[dict], metric: str, logy: bool, bounds: bool) -> list:
    """The panel's lines, one per variant (or per label), and its bounds; the values drawn."""
    by_line: dict[str, list[dict]] = {}
    for g in members:
        by_line.setdefault(g.get("line", g["variant"]), []).append(g)
    drawn = []
    lines = sorted(by_line.items(), key=lambda kv: (kv[0] != "base", natural_key(kv[0])))
    # lines at the same ρ are set apart sideways by a few points, so that no error bar hides
    # another (the ρ ticks stay at the values); a line alone at its ρ values stays on them
    sharing: dict[float, list[str]] = {}
    for label, gs in lines:
        for rho in sorted({g["rho"] for g in gs if finite(g.get("rho"))}):
            sharing.setdefault(rho, []).append(label)
    for label, gs in lines:
        stats = [(g.get("rho"), g["stats"].get(metric)) for g in gs]
        stats = [
            (r, s) for r, s in stats if s and finite(s["mean"]) and (not logy or s["mean"] > 0)
        ]
        if stats:
            drawn += [s["mean"] for _, s in stats]
            _draw_line(ax, label, stats, variant_color(gs[0]["variant"]), _dodge(label, sharing))
        if bounds:
            drawn += _draw_bounds(
                ax, [p for g in gs for p in g.get("bounds", [])], variant_color(gs[0]["variant"])
            )
    return drawn


def _dodge(label: str, sharing: dict[float, list[str]]) -> float:
    """``label``'s sideways shift in points: its place among the most lines it shares a ρ
    with (0 where it shares none)."""
    mates = max((m for m in sharing.values() if label in m), key=len, default=[label])
    return (mates.index(label) - (len(mates) - 1) / 2) * DODGE_POINTS


def _draw_line(ax, label: str, stats: list, color, dodge: float = 0.0) -> None:
    """Mean ± std against ρ (``dodge``: shifted that many points sideways), or a level across
    the panel when the variant has no ρ."""
    from matplotlib.transforms import offset_copy

    with_rho = sorted(
        ((r, s) for r, s in stats if finite(r)), key=lambda t: t[0]
    )  # never compare dicts
    if with_rho:
        shifted = offset_copy(ax.transData, fig=ax.figure, x=dodge, y=0, units="points")
        ax.errorbar(
            [r for r, _ in with_rho],
            [s["mean"] for _, s in with_rho],
            yerr=[s["std"] if finite(s["std"]) else 0 for _, s in with_rho],
            marker="o",
            capsize=3,
            color=color,
            label=label,
            transform=shifted,
        )
        # drawn through the shifted transform, the points do not reach autoscale: their data
        # (bars included) is added to the axes' limits by hand
        spans = [s["std"] if finite(s["std"]) else 0 for _, s in with_rho]
        ax.update_datalim(
            [(r, s["mean"] + k * e) for (r, s), e in zip(with_rho, spans) for k in (-1, 1)]
        )
        ax.autoscale_view()
        return
    mean = sum(s["mean"] for _, s in stats) / len(stats)
    std = max((s["std"] for _, s in stats if finite(s["std"])), default=0.0)
    ax.axhline(mean, linestyle=":", color=color, label=f"{label} (no ρ)")
    if std > 0:
        ax.axhspan(mean - std, mean + std, color=color, alpha=0.1)


def _draw_bounds(ax, points: list, color) -> list:
    pts = sorted(p for p in points if finite(p[0]) and finite(p[1]) and p[1] > 0)
    if pts:
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            linestyle="--",
            marker="x",
            color=color,
            label=BOUND_LABEL,
        )
    return [p[1] for p in pts]


def _rho_axis(ax, rhos) -> None:
    from matplotlib import ticker

    pos = [r for r in rhos if finite(r) and r > 0]
    label = "ρ (optimizer.rho)"
    if pos and max(pos) / min(pos) >= 10:
        if any(
            r == 0 for r in rhos
        ):  # ρ = 0 has no place on a log axis: linear below the smallest ρ
            ax.set_xscale("symlog", linthresh=min(pos))
            ax.set_xlim(-0.5 * min(pos), 1.5 * max(pos))  # autoscale would run to -linthresh
            label += f", symlog: linear below {min(pos):g}"
        else:
            log_scale(ax, "x", pos)
            label += ", log scale"
    values = sorted({r for r in rhos if finite(r)})
    if 0 < len(values) <= MAX_RHO_TICKS:  # the sweep's own values, not crowded in-between ones
        ax.xaxis.set_major_locator(ticker.FixedLocator(values))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(ticker.NullLocator())
    if len(values) == 1:  # one ρ: a little room on either side
        ax.set_xlim(values[0] * 0.8 - 1e-3, values[0] * 1.2 + 1e-3)
    ax.set_xlabel(label, fontsize=FONT)
    ax.grid(alpha=0.3)


def _figure_legend(fig, axes, title: str = SPREAD) -> None:
    """One legend for the whole figure, under the panels: each line once (the bound once), its
    title saying what the bars are."""
    from matplotlib.lines import Line2D

    entries = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if BOUND_LABEL in entries:  # dashed in each variant's colour: the legend shows the style only
        entries[BOUND_LABEL] = Line2D([], [], linestyle="--", marker="x", color="gray")
        entries[BOUND_LABEL + " (dashed, in the variant's colour)"] = entries.pop(BOUND_LABEL)
    if entries:
        fig.legend(
            list(entries.values()),
            list(entries),
            loc="outside lower center",
            fontsize=FONT,
            title=title,
            title_fontsize=FONT - 1,
            frameon=False,
            ncol=min(len(entries), 3 if len(axes.flat) > 1 else 2),
        )


def plot_acc_vs_lambda(points: Iterable[tuple[str, float, float]]) -> Figure:
    """Test accuracy against λ_max, one point per job (``points``: (variant, λ_max, accuracy)),
    each variant in its colour."""
    fig, axes = figure(size=(6.5, 4.5))
    ax = axes[0, 0]
    by_variant: dict = {}
    for variant, lam, acc in points:
        if finite(lam) and lam > 0 and finite(acc):
            by_variant.setdefault(variant, []).append((lam, acc))
    for variant, pts in sorted(by_variant.items(), key=lambda kv: (kv[0] != "base", kv[0])):
        ax.scatter(
            [p[0] for p in pts],
            [p[1] for p in pts],
            label=variant,
            alpha=0.85,
            color=variant_color(variant),
            edgecolors="black",
            linewidths=0.3,
        )
    if by_variant:
        log_scale(ax, "x", [p[0] for pts in by_variant.values() for p in pts])
        ax.legend(fontsize=FONT, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    else:
        _say_empty(ax, "no completed job logged λ_max")
    ax.set_xlabel("λ_max (top Hessian eigenvalue, log scale)", fontsize=FONT)
    ax.set_ylabel("test accuracy", fontsize=FONT)
    ax.set_title("test accuracy against sharpness, one point per job", fontsize=FONT + 1)
    ax.grid(alpha=0.3)
    return fig


def plot_eos_traces(traces: list[dict]) -> Figure:
    """One λ_max trace per job against the step, coloured by its step size, each with its own
    stability threshold dashed (and the SAM edge dotted, where logged) in the same colour; one
    panel per variant (and per value of the
    sweep's other axes)."""
    from matplotlib import colormaps

    common = set.intersection(*(set(t["job"].overrides) for t in traces))
    panels: dict[str, list[dict]] = {}
    for t in traces:
        job = t["job"]
        panels.setdefault(f"{job.variant} {_non_lr(job.overrides, common)}".strip(), []).append(t)
    lrs = sorted({t["job"].lr for t in traces if finite(t["job"].lr)})
    color = {lr: colormaps["viridis"](i / max(1, len(lrs) - 1) * 0.9) for i, lr in enumerate(lrs)}
    ncols = min(2, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = figure(nrows, ncols, size=(6.0 * ncols + 1.5, 4.0 * nrows + 0.6))
    for ax, (panel, members) in zip(
        axes.flat, sorted(panels.items(), key=lambda kv: natural_key(kv[0]))
    ):
        for t in sorted(members, key=lambda t: t["job"].lr or 0):
            c = color.get(t["job"].lr, "gray")
            ax.plot(
                t["steps"], t["lambda_max"], color=c, linewidth=1.2, label=f"η = {t['job'].lr:g}"
            )
            for key, style in (("threshold", "--"), ("sam_edge", ":")):
                pts = [(s, v) for s, v in zip(t["steps"], t.get(key, ())) if finite(v)]
                if pts:
                    ax.plot(*zip(*pts), color=c, linestyle=style, linewidth=1)
        ax.set_title(panel, fontsize=FONT)
        ax.set_xlabel("step", fontsize=FONT)
        ax.set_ylabel("λ_max", fontsize=FONT)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    _figure_legend(fig, axes, title=None)
    edge = any(finite(v) for t in traces for v in t.get("sam_edge", ()))
    fig.suptitle(
        "λ_max against the step; dashed: each step size's threshold 2/η"
        + ("; dotted: the SAM edge" if edge else ""),
        fontsize=FONT + 2,
    )
    return fig


def _non_lr(overrides: list[str], common: set) -> str:
    """A job's overrides other than the variant, the step size, the seed and those every job
    shares (a panel's title)."""
    skip = ("optimizer=", "base_optimizer.lr=", "seed=")
    return " ".join(o for o in overrides if not o.startswith(skip) and o not in common)
