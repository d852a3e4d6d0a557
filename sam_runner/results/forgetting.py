"""Forgetting in ``sam-report``: for jobs in a chain pretrain -> mid-training -> post-training
(each started from the one before by ``model.init_from``, as the stages of
``experiment=sam_midtraining_mini`` are), the first task's test accuracy and loss before and
after post-training, and the accuracy lost by 4-bit (and other) quantization of the mid-trained
weights, with and without SAM mid-training (forgetting.csv).

Our choices: the first task is what every job's test set measures (post-training changes the
training task, not the test set: the presets relabel training examples), so forgetting =
the mid-trained job's ``test_acc`` − the post-trained job's, and the loss rise = the post-trained
job's ``test_loss`` − the mid-trained job's (their last logged values); the quantization drop is
the mid-trained job's ``quant_drop_<b>bit`` (eval.json's when sam-eval measured it, else its
training run's last line). Rows are the mid-training settings (variant and ρ), means over seeds;
the reduction is 100·(F_base − F)/F_base against the rows of ``optimizer=base``.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from .sections import SECTIONS, figure
from .sweep import stats, stats_cell


def _source(job, by_dir: dict):
    """The report's job whose weights ``job`` started from (``init_from`` in its summary)."""
    path = ((job.run.summary or {}).get("init_from") or {}).get("path") if job.run else None
    if not path:
        return None
    p = Path(path)
    folder = p.parent.parent if p.parent.name == "checkpoints" else p
    return by_dir.get(folder.resolve())


def _last(job, key: str):
    """A value of the job: eval.json's, else summary.json's, else its last logged line's."""
    for found in (job.run.eval() or {}, job.run.summary or {}):
        if isinstance(found.get(key), (int, float)):
            return float(found[key])
    return next((float(r[key]) for r in reversed(job.run.rows()) if key in r), None)


def chains(report) -> list[tuple]:
    """(mid-trained job, post-trained job) for each completed post-trained job whose source
    started from another job of the report."""
    done = [j for j in report.jobs if j.path is not None and j.status == "completed"]
    by_dir = {j.path.resolve(): j for j in done}
    out = []
    for post in done:
        mid = _source(post, by_dir)
        if mid is not None and _source(mid, by_dir) is not None:
            out.append((mid, post))
    return out


def _label(job) -> str:
    return job.variant + (f" ρ={job.rho:g}" if job.rho is not None else "")


COLUMNS = {  # forgetting.csv's measured columns -> report.md's headers
    "acc_before": "test acc after mid-training",
    "acc_after": "after post-training",
    "forgetting_acc": "forgetting (acc)",
    "loss_rise": "test loss rise",
}
STEM = "forgetting"


def rows(report) -> list[dict]:
    """One row per mid-training setting: each measured column's statistics over its seeds
    (``stats``), and the reductions against ``optimizer=base`` mid-training (of the means)."""
    groups: dict[str, list] = {}
    found = chains(report)
    for mid, post in found:
        groups.setdefault(_label(mid), []).append((mid, post))
    bits = sorted(
        {
            int(m.group(1))
            for mid, _ in found
            for r in [*(mid.run.rows()[-1:]), mid.run.eval() or {}, mid.run.summary or {}]
            for k in r
            for m in [re.fullmatch(r"quant_drop_(\d+)bit", k)]
            if m
        },
        reverse=True,
    )
    diff = lambda a, b: None if a is None or b is None else a - b  # noqa: E731
    out = []
    for label, pairs in sorted(groups.items(), key=lambda kv: (kv[0] != "base", kv[0])):
        before = [_last(m, "test_acc") for m, _ in pairs]
        after = [_last(p, "test_acc") for _, p in pairs]
        values = {
            "acc_before": before,
            "acc_after": after,
            "forgetting_acc": list(map(diff, before, after)),
            "loss_rise": [diff(_last(p, "test_loss"), _last(m, "test_loss")) for m, p in pairs],
            **{
                f"quant_drop_{b}bit": [_last(m, f"quant_drop_{b}bit") for m, _ in pairs]
                for b in bits
            },
        }
        row = {"midtraining": label, "variant": pairs[0][0].variant, "n": len(pairs)}
        row["stats"] = {k: stats(v) for k, v in values.items()}
        out.append(row)
    base = next((r for r in out if r["variant"] == "base"), None)
    for r in out:
        r["reductions"] = {}
        for key, name in [("forgetting_acc", "reduction_post_pct"), *(
                (f"quant_drop_{b}bit", f"reduction_{b}bit_pct") for b in bits)]:  # fmt: skip
            ref, mine = (base["stats"][key]["mean"] if base else None), r["stats"][key]["mean"]
            r["reductions"][name] = None if not ref or mine is None else 100 * (ref - mine) / ref
    return out


def _csv_row(r: dict) -> dict:
    """forgetting.csv's row: the setting, each column's mean and sample std, the reductions."""
    flat = {"midtraining": r["midtraining"], "variant": r["variant"], "n": r["n"]}
    for key, s in r["stats"].items():
        flat[key], flat[f"{key}_std"] = s["mean"], s["std"]
    return {**flat, **r["reductions"]}


def write_forgetting(report, out_dir: Path) -> list[Path]:
    table = rows(report)
    if not table:
        return []
    from ..plots.forgetting import plot_forgetting
    from ..plots.style import save_figure
    from ..runfiles import atomic_write_bytes

    text = io.StringIO()
    flat = [_csv_row(r) for r in table]
    w = csv.DictWriter(text, fieldnames=list(flat[0]), lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in flat)
    path = Path(out_dir) / "forgetting.csv"
    atomic_write_bytes(path, text.getvalue().encode())
    return [path, save_figure(plot_forgetting(table), out_dir, STEM, report.plot_format)]


def _bits(key: str) -> str:
    return key.removeprefix("quant_drop_").removesuffix("bit")


def _percent(v) -> str:
    return "—" if v is None else f"{v:+.0f}%"


@SECTIONS.register(
    "forgetting", "forgetting after post-training and quantization", order=36,
    files=write_forgetting,
)  # fmt: skip
def section(report, _plots=None) -> list[str]:
    table = rows(report)
    if not table:
        return []
    keys = list(table[0]["stats"])
    bits = [_bits(k) for k in keys if k not in COLUMNS]
    head = ["mid-training", *(COLUMNS.get(k) or f"{_bits(k)}-bit drop (acc)" for k in keys)]
    head += ["forgetting reduction", *(f"{b}-bit drop reduction" for b in bits), "n"]
    out = ["## Forgetting after post-training and quantization", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        cells = [r["midtraining"], *(stats_cell(r["stats"][k]) for k in keys)]
        reference = r is next((t for t in table if t["variant"] == "base"), None)
        cells += ["reference" if reference else _percent(v) for v in r["reductions"].values()]
        out.append("| " + " | ".join([*cells, str(r["n"])]) + " |")
    return out + [
        "",
        figure(f"{STEM}.{report.plot_format}"),
        "",
        "Per mid-training setting, mean ± sample std over seeds (n chains pretrain → mid-training "
        "→ post-training): the first task's test accuracy after mid-training and after "
        "post-training, forgetting = their difference, the rise of its test loss, and the "
        "accuracy the mid-trained weights lose when rounded to b bits. A reduction is "
        "100·(base − this)/base of the means against `optimizer=base` mid-training (positive: "
        "less forgetting, a smaller drop). forgetting.csv has every column with its std.",
        "",
    ]
