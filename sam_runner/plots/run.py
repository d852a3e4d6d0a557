"""A run's own figures: ``curves`` (loss, accuracy, ECE, λ_max over epochs) and ``reliability``
(the reliability diagram, with the count of samples per bin under it), as PNG, PDF or SVG
(``plots.format``).

Choices of ours: a mid-epoch curvature row (logged at optimizer step s) is drawn at the
fractional epoch s / (steps per epoch), the steps per epoch being read off the epoch rows;
diverged (non-finite) values are left out of the lines; a quantity measured once is written as
text on its panel, not drawn as a lone dot.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..rundir import RunDir
from ..runfiles import finite
from .style import FONT, figure, log_scale, save_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PANELS = (
    ("loss", (("train_loss", "train"), ("test_loss", "test")), False),
    ("accuracy", (("train_acc", "train"), ("test_acc", "test")), False),
    ("calibration error (test ECE)", (("test_ece", "test"),), False),
    ("λ_max (top Hessian eigenvalue)", (("lambda_max", "λ_max"),), True),
)


def _epoch_axis(rows: list[dict]):
    """x (in epochs) for each row: its epoch on epoch rows, step / steps-per-epoch on mid-epoch
    ones."""
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
    return [
        r.get("epoch")
        if "train_loss" in r or not spe or not finite(r.get("step"))
        else r["step"] / spe
        for r in rows
    ]


def _points(rows, xs, key):
    pts = [(x, r[key]) for x, r in zip(xs, rows) if finite(x) and finite(r.get(key))]
    return [p[0] for p in pts], [p[1] for p in pts]


def run_title(summary: dict) -> str:
    """dataset · model · variant (ρ) · epochs, from the run's own summary (and its status when
    it did not complete)."""
    cfg = summary.get("config") or {}
    variant, rho = cfg.get("optimizer.name", "?"), cfg.get("optimizer.rho")
    parts = [
        str(cfg.get("dataset.name", "?")),
        str(summary.get("model_built") or cfg.get("model.arch", "?")),
        variant + (f" (ρ = {rho:g})" if finite(rho) and variant != "base" else ""),
        f"{cfg['trainer.steps']} steps, η = {cfg.get('base_optimizer.lr', '?'):g}"
        if cfg.get("trainer.steps")
        else f"{summary.get('epochs', cfg.get('trainer.epochs', '?'))} epochs",
    ]
    status = summary.get("status")
    return " · ".join(parts) + (f" — {status}" if status and status != "completed" else "")


def plot_curves(rows: list[dict], title: str = "") -> Figure:
    """2×2: loss, accuracy, ECE, λ_max over epochs (train and test where both are logged); a
    λ_max measured once or never is no curve: 1×3 then, the one value in the title."""
    xs = _epoch_axis(rows)
    lam_x, lam_y = _points(rows, xs, "lambda_max")
    panels = PANELS
    if len(lam_x) < 2:
        panels = PANELS[:3]
        if lam_y:
            said = f"λ_max = {lam_y[0]:.4g} (measured once, at epoch {lam_x[0]:g})"
            title = f"{title}\n{said}" if title else said
    fig, axes = figure(*((2, 2) if len(panels) == 4 else (1, 3)),
                       size=(10.0, 7.0) if len(panels) == 4 else (13.0, 4.2))  # fmt: skip
    for ax, (name, keys, logy) in zip(axes.flat, panels):
        ax.set_title(name, fontsize=FONT + 1)
        lines = [(label, *_points(rows, xs, key)) for key, label in keys]
        lines = [line for line in lines if line[1]]
        if not lines:
            _note(ax, "not logged", color="gray")
        elif sum(len(x) for _, x, _ in lines) == 1:  # once: a value, not a dot on an axis
            label, x, y = lines[0]
            _note(ax, f"{label} = {y[0]:.4g}\n(measured once, at epoch {x[0]:g})")
        else:
            _draw_lines(ax, lines, logy)
    if title:
        fig.suptitle(title, fontsize=FONT + 2)
    return fig


def _draw_lines(ax, lines: list, logy: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    for label, x, y in lines:
        ax.plot(x, y, marker="o", markersize=3, label=label)
    values = [v for _, _, y in lines for v in y]
    if logy and all(v > 0 for v in values):
        log_scale(ax, "y", values)
    if len(lines) > 1:
        ax.legend(fontsize=FONT)
    ax.set_xlabel("epoch", fontsize=FONT)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _note(ax, text: str, color="black") -> None:
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        transform=ax.transAxes,
        color=color,
        fontsize=FONT + 2,
    )
    ax.set_xticks([])
    ax.set_yticks([])


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


GAP_COLOR = "tab:red"  # the gap bars and their legend entry: one colour, no hatching


def plot_reliability(bins: dict, title: str = "") -> Figure:
    """Accuracy per confidence bin against the diagonal, the gap to the bin's mean confidence in
    red; under it, the number of samples per bin (most sit in the top bins)."""
    conf, acc, count = bins["confidence"], bins["accuracy"], bins["count"]
    n = len(count)
    fig, axes = figure(2, 1, size=(5.5, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax, hist = axes[0, 0], axes[1, 0]
    width = 1.0 / max(n, 1)
    keep = [i for i in range(n) if count[i] and finite(acc[i]) and finite(conf[i])]
    left = [i * width for i in keep]
    ax.bar(
        left,
        [acc[i] for i in keep],
        width=width,
        align="edge",
        color="tab:blue",
        edgecolor="black",
        linewidth=0.5,
        label="accuracy",
    )
    # the gap as an outline from accuracy to mean confidence: the same red on the bars and in
    # the legend, whichever side of the accuracy it lies
    ax.bar(
        left,
        [abs(conf[i] - acc[i]) for i in keep],
        bottom=[min(conf[i], acc[i]) for i in keep],
        width=width,
        align="edge",
        fill=False,
        edgecolor=GAP_COLOR,
        linewidth=1.8,
        label="gap to mean confidence",
    )
    ax.plot([0, 1], [0, 1], "k--", linewidth=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy", fontsize=FONT)
    ax.legend(loc="upper left", fontsize=FONT)
    ax.set_title(title or "reliability diagram", fontsize=FONT + 1)
    hist.bar(
        [i * width for i in range(n)],
        count,
        width=width,
        align="edge",
        color="gray",
        edgecolor="black",
        linewidth=0.5,
    )
    if max(count, default=0) > 10 * max(1, min((c for c in count if c), default=1)):
        hist.set_yscale("log")
    hist.set_xlabel("confidence (top-label probability)", fontsize=FONT)
    hist.set_ylabel("samples", fontsize=FONT)
    return fig


def step_curvature(rows: list[dict]) -> bool:
    """Whether the run measured λ_max within epochs, often enough to draw it against the step."""
    return sum(1 for r in rows if finite(r.get("lambda_max")) and "train_loss" not in r) >= 3


def plot_eos(rows: list[dict], title: str = "") -> Figure:
    """The edge-of-stability figure: λ_max against the step with the stability threshold of the
    step (2/η for gradient descent) dashed and labelled, the SAM edge where logged, and the loss
    below on the same steps."""
    fig, axes = figure(2, 1, size=(9.0, 7.0), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top, bottom = axes[0, 0], axes[1, 0]
    curv = [r for r in rows if finite(r.get("lambda_max")) and finite(r.get("step"))]
    top.plot(
        [r["step"] for r in curv],
        [r["lambda_max"] for r in curv],
        color="tab:blue",
        linewidth=1.2,
        label="λ_max",
    )
    for key, style, label in (
        ("eos_threshold", "--", "stability threshold (2/η for GD)"),
        ("sam_edge", ":", "SAM edge (Long & Bartlett 2023)"),
        ("armijo_curvature", "", "Armijo-probe curvature"),
    ):
        pts = [(r["step"], r[key]) for r in curv if finite(r.get(key))]
        if pts:
            top.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                linestyle=style or "none",
                marker="." if not style else None,
                color="black" if style == "--" else "gray",
                label=_threshold_label(label, [p[1] for p in pts]),
            )
    top.set_ylabel("top Hessian eigenvalue", fontsize=FONT)
    top.legend(fontsize=FONT, loc="lower right")
    top.grid(alpha=0.3)
    for key, label, style in (
        ("step_loss", "train (the step's batch)", "-"),
        ("train_loss", "train (epoch mean)", "none"),
        ("test_loss", "test", "-"),
    ):
        pts = [(r["step"], r[key]) for r in rows if finite(r.get(key)) and finite(r.get("step"))]
        if pts:
            bottom.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                linestyle=style,
                marker="o",
                markersize=2 if style == "-" else 4,
                label=label,
            )
    bottom.set_xlabel("step", fontsize=FONT)
    bottom.set_ylabel("loss", fontsize=FONT)
    bottom.legend(fontsize=FONT)
    bottom.grid(alpha=0.3)
    fig.suptitle(title or "edge of stability", fontsize=FONT + 2)
    return fig


def _threshold_label(label: str, values: list) -> str:
    """The label, with the value when it is the same at every step (a constant step size)."""
    return (
        f"{label} = {values[0]:.4g}" if max(values) - min(values) <= 1e-9 * max(values) else label
    )


def write_run_plots(run_dir: Path | str, fmt: str = "png") -> list[Path]:
    """Write curves.<fmt> (and reliability.<fmt> when the run logged reliability bins) into the
    run folder."""
    run_dir = Path(run_dir)
    written = []
    rows = RunDir(run_dir).rows()
    summary = RunDir(run_dir).summary or {}
    if rows:
        draw = plot_eos if step_curvature(rows) else plot_curves
        written.append(save_figure(draw(rows, run_title(summary)), run_dir, "curves", fmt))
    # the final bins: in the summary if the metrics code puts them there, else on the last row
    bins = find_reliability(summary) or next(
        (b for b in map(find_reliability, reversed(rows)) if b), None
    )
    if bins:
        ece, n = summary.get("test_ece"), sum(bins["count"])
        title = f"reliability: ECE {ece:.4f} over {n} test samples" if finite(ece) else ""
        written.append(save_figure(plot_reliability(bins, title), run_dir, "reliability", fmt))
    split = RunDir(run_dir).clients()
    if split and split.get("class_histograms"):  # a federated run's clients
        from .federated import plot_clients

        written.append(save_figure(plot_clients(split), run_dir, "clients", fmt))
    return written
