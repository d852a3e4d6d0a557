"""PNG plots of a run (its training curves, its reliability diagram) and of a sweep
(the figures of ``sam-report``). Drawn from the run's own files, never from live state.

Matplotlib is used through ``matplotlib.figure.Figure`` and the Agg canvas directly,
not pyplot: no display is needed and the caller's pyplot backend is left alone.

Choices of ours: on the run's curves, a mid-epoch curvature row (logged at optimizer
step s) is drawn at the fractional epoch s / (steps per epoch), the steps per epoch
being read off the epoch rows; diverged (non-finite) values are left out of the lines.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from .runfiles import (  # torch-free: sam-report stays light
    atomic_write_bytes,
    finite,
    read_json,
    read_rows,
)


def _figure(nrows=1, ncols=1, size=(6.0, 4.0)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def save_png(fig, path: Path) -> Path:
    """Render ``fig`` and write it atomically (a half-written PNG never lands)."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    atomic_write_bytes(Path(path), buf.getvalue())
    return Path(path)


def log_scale(ax, which: str, values) -> None:
    """Log scale on the ``which`` ("x"/"y") axis; over less than a decade, a few plain-number
    ticks (log ticks would be unreadable there)."""
    from matplotlib import ticker

    getattr(ax, f"set_{which}scale")("log")
    axis = getattr(ax, f"{which}axis")
    pos = [v for v in values if finite(v) and v > 0]
    if pos and max(pos) / min(pos) < 10:
        axis.set_major_locator(ticker.MaxNLocator(5))
        axis.set_minor_locator(ticker.NullLocator())
        axis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))


def natural_key(text: str) -> list:
    """Sort key ordering the numbers inside a name by value (``batch_size=32`` before ``128``).
    re.split with one group alternates text and number, so equal positions compare alike."""
    parts = re.split(r"(\d+(?:\.\d*)?(?:e-?\d+)?)", text)
    return [float(p) if i % 2 else p for i, p in enumerate(parts)]


def _epoch_axis(rows: list[dict]):
    """x (in epochs) for each row: its epoch on epoch rows, step / steps-per-epoch on mid-epoch
    ones.
    """
    spe = next(
        (
            r["step"] / r["epoch"]
            for r in rows
            if "train_loss" in r
            and finite(r.get("step"))
            and finite(r.get("epoch"))
            and r["epoch"] > 0
        ),
        None,
    )
    xs = []
    for r in rows:
        if "train_loss" in r or not spe or not finite(r.get("step")):
            xs.append(r.get("epoch"))
        else:
            xs.append(r["step"] / spe)
    return xs


def _series(rows, xs, key):
    pts = [(x, r[key]) for x, r in zip(xs, rows) if finite(x) and finite(r.get(key))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_curves(rows: list[dict], title: str = ""):
    """2×2: loss, accuracy, ECE, λ_max over epochs (train and test where both are logged)."""
    fig, axes = _figure(2, 2, size=(10.0, 7.0))
    xs = _epoch_axis(rows)
    panels = [
        ("loss", [("train_loss", "train"), ("test_loss", "test")], False),
        ("accuracy", [("train_acc", "train"), ("test_acc", "test")], False),
        ("ECE (test)", [("test_ece", "test")], False),
        ("λ_max (top Hessian eigenvalue)", [("lambda_max", "λ_max")], True),
    ]
    for ax, (name, keys, logy) in zip(axes.flat, panels):
        drawn = False
        for key, label in keys:
            x, y = _series(rows, xs, key)
            if not x:
                continue
            ax.plot(x, y, marker="o", markersize=3, label=label)
            drawn = True
            if logy and all(v > 0 for v in y):
                log_scale(ax, "y", y)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        if drawn and len(keys) > 1:
            ax.legend()
        if not drawn:
            ax.text(
                0.5,
                0.5,
                "not logged",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="gray",
            )
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def find_reliability(summary: dict) -> dict | None:
    """The reliability bins in a summary: a dict with confidence/accuracy/count lists, at top
    level or one level down (the key name is the metrics code's choice, so it is not assumed)."""

    def fits(d):
        return isinstance(d, dict) and all(
            isinstance(d.get(k), list) for k in ("confidence", "accuracy", "count")
        )

    for v in summary.values():
        if fits(v):
            return v
        if isinstance(v, dict):
            for w in v.values():
                if fits(w):
                    return w
    return None


def plot_reliability(bins: dict, title: str = ""):
    """Accuracy per confidence bin against the diagonal; bar width = bin width, empty bins left
    out."""
    conf, acc, count = bins["confidence"], bins["accuracy"], bins["count"]
    n = len(count)
    fig, axes = _figure(1, 1, size=(5.0, 5.0))
    ax = axes[0, 0]
    width = 1.0 / max(n, 1)
    left = [i * width for i in range(n)]
    keep = [i for i in range(n) if count[i] and finite(acc[i]) and finite(conf[i])]
    ax.bar(
        [left[i] for i in keep],
        [acc[i] for i in keep],
        width=width,
        align="edge",
        edgecolor="black",
        alpha=0.7,
        label="accuracy",
    )
    ax.bar(
        [left[i] for i in keep],
        [abs(conf[i] - acc[i]) for i in keep],
        bottom=[min(conf[i], acc[i]) for i in keep],
        width=width,
        align="edge",
        color="red",
        alpha=0.3,
        hatch="//",
        label="gap to mean confidence",
    )
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left")
    ax.set_title(title or "reliability diagram")
    return fig


def write_run_plots(run_dir) -> list[Path]:
    """Write curves.png (and reliability.png when the run logged reliability bins) into the run
    folder.
    """
    run_dir = Path(run_dir)
    written = []
    rows = read_rows(run_dir / "metrics.jsonl")
    summary = read_json(run_dir / "summary.json") or {}
    title = f"{run_dir.name}  ({summary.get('status', 'no summary')})"
    if rows:
        written.append(save_png(plot_curves(rows, title), run_dir / "curves.png"))
    # the final bins: in the summary if the metrics code puts them there, else on the last evaluated
    # row
    bins = find_reliability(summary) or next(
        (b for b in map(find_reliability, reversed(rows)) if b), None
    )
    if bins:
        ece = summary.get("test_ece")
        written.append(
            save_png(
                plot_reliability(bins, f"reliability, ECE {ece:.4f}" if finite(ece) else ""),
                run_dir / "reliability.png",
            )
        )
    return written


# ---- sweep figures (sam-report) ------------------------------------------------------


def _rho_axis(ax, rhos):
    pos = [r for r in rhos if finite(r) and r > 0]
    if pos and max(pos) / min(pos) >= 10:
        # ρ = 0 has no place on a log axis: linear below the smallest ρ
        if any(r == 0 for r in rhos):
            ax.set_xscale("symlog", linthresh=min(pos))
            # autoscale would run to -linthresh and end on max ρ
            ax.set_xlim(-0.5 * min(pos), 1.5 * max(pos))
        else:
            log_scale(ax, "x", pos)
    ax.set_xlabel("ρ (optimizer.rho)")
    ax.grid(alpha=0.3)


def plot_metric_vs_rho(
    groups: list[dict], metric: str, ylabel: str, logy: bool = False, bounds=None
):
    """Mean ± std of ``metric`` per group against ρ, one line per series (a variant and the
    sweep's other non-ρ overrides). A series without ρ (``base``) is drawn as a horizontal
    level with its ±std band. ``bounds``: optional {series: [(rho, bound), ...]} drawn
    dashed in the series' colour (the TLC-SAM stability bound), with one legend entry for all.
    The legend stands right of the axes: a sweep's many series would cover the points."""
    fig, axes = _figure(size=(10.0, 4.5))
    ax = axes[0, 0]
    by_series: dict = {}
    for g in groups:
        by_series.setdefault(g["series"], []).append(g)
    colors, drawn = {}, []
    for series, gs in sorted(by_series.items(), key=lambda kv: natural_key(kv[0])):
        stats = [(g.get("rho"), g["stats"].get(metric)) for g in gs]
        stats = [
            (r, s) for r, s in stats if s and finite(s["mean"]) and (not logy or s["mean"] > 0)
        ]
        if stats:
            drawn += [s["mean"] for _, s in stats]
            colors[series] = _draw_series(ax, series, stats, gs[0]["variant"] == "base")
    drawn += _draw_bounds(ax, bounds or {}, colors)
    if logy:
        log_scale(ax, "y", drawn)
    _rho_axis(ax, [g["rho"] for g in groups if finite(g.get("rho"))])
    ax.set_ylabel(ylabel)
    _legend_or_note(ax, "no completed job logged this")
    return fig


def _draw_series(ax, series: str, stats: list, is_base: bool) -> str:
    """One series: mean ± std against ρ, or a level across the plot when it has no ρ; its colour."""
    with_rho = sorted(
        ((r, s) for r, s in stats if finite(r)), key=lambda t: t[0]
    )  # never compare dicts
    if with_rho:
        line = ax.errorbar(
            [r for r, _ in with_rho],
            [s["mean"] for _, s in with_rho],
            yerr=[s["std"] if finite(s["std"]) else 0 for _, s in with_rho],
            marker="o",
            capsize=3,
            label=series,
        )
        return line[0].get_color()
    mean = sum(s["mean"] for _, s in stats) / len(stats)
    std = max((s["std"] for _, s in stats if finite(s["std"])), default=0.0)
    line = ax.axhline(mean, linestyle=":", color="black" if is_base else None, label=series)
    if std > 0:
        ax.axhspan(mean - std, mean + std, color=line.get_color(), alpha=0.1)
    return line.get_color()


def _draw_bounds(ax, bounds: dict, colors: dict) -> list:
    """The stability bounds, dashed in their series' colour, one legend entry for all; returns
    the values drawn."""
    label, drawn = "stability bound (bΓ/(2ρη²))^(1/3), dashed", []
    for series, pts in sorted(bounds.items()):
        pts = sorted(p for p in pts if finite(p[0]) and finite(p[1]) and p[1] > 0)
        if pts:
            drawn += [p[1] for p in pts]
            ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                linestyle="--",
                marker="x",
                color=colors.get(series),
                label=label,
            )
            label = "_nolegend_"
    return drawn


def _legend_or_note(ax, note: str) -> None:
    """A legend right of the axes (in columns of 25), or ``note`` when nothing was drawn."""
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(
            fontsize=7,
            loc="upper left",
            bbox_to_anchor=(1.02, 1.0),
            borderaxespad=0.0,
            ncol=1 + len(handles) // 25,
        )
    else:
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)


def plot_acc_vs_lambda(points):
    """Test accuracy against λ_max, one point per job (``points``: (variant, λ_max, accuracy))."""
    fig, axes = _figure()
    ax = axes[0, 0]
    by_variant: dict = {}
    for variant, lam, acc in points:
        if finite(lam) and lam > 0 and finite(acc):
            by_variant.setdefault(variant, []).append((lam, acc))
    for variant, pts in sorted(by_variant.items()):
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], label=variant, alpha=0.8)
    if by_variant:
        log_scale(ax, "x", [p[0] for pts in by_variant.values() for p in pts])
        ax.legend(fontsize=8)
    else:
        ax.text(
            0.5,
            0.5,
            "no completed job logged λ_max",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_xlabel("λ_max (top Hessian eigenvalue, log scale)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    return fig
