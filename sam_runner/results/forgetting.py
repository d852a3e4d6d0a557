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
the reduction is 100·(F_base − F)/F_base against the rows of ``optimizer=base`` (none where
F_base ≤ 0: a base that lost nothing).

On language-model chains (``experiment=lm_midtraining_mini``: jobs whose lines carry
``test_ppl``), where token accuracy moves little, the loss is the measure: the table adds the
test perplexity before and after post-training, the test-loss rise the quantized weights show
(``quant_loss_rise_<b>bit``) and the reductions of both rises.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .sections import SECTIONS, figure
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from .sweep import Report


def _source(job, by_dir: dict):
    """The report's job whose weights ``job`` started from (``init_from`` in its summary)."""
    path = _init_from(job)
    if not path:
        return None
    p = Path(path)
    folder = p.parent.parent if p.parent.name == "checkpoints" else p
    return by_dir.get(folder.resolve())


def _init_from(job):
    """The path of the weights ``job`` started from (its summary's ``init_from``), or None."""
    return ((job.run.summary or {}).get("init_from") or {}).get("path") if job.run else None


def _last(job, key: str):
    """A value of the job: eval.json's, else summary.json's, else its last logged line's."""
    for found in (job.run.eval() or {}, job.run.summary or {}):
        if isinstance(found.get(key), (int, float)):
            return float(found[key])
    return next((float(r[key]) for r in reversed(job.run.rows()) if key in r), None)


def chains(report: Report) -> list[tuple]:
    """(mid-trained job, post-trained job) for each completed post-trained job whose source
    started from another job of the report."""
    done = [j for j in report.jobs if j.path is not None and j.status == "completed"]
    if not any(_init_from(j) for j in done):  # no chain: no folder resolved (a study of 1,000s)
        return []
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
    "ppl_before": "test ppl after mid-training",
    "ppl_after": "after post-training",
}
STEM = "forgetting"


def rows(report: Report) -> list[dict]:
    """One row per mid-training setting: each measured column's statistics over its seeds
    (``stats``), and the reductions against ``optimizer=base`` mid-training (of the means)."""
    return report.once("forgetting_rows", lambda: _rows(report))


def _rows(report: Report) -> list[dict]:
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
    lm = any(_last(mid, "test_ppl") is not None for mid, _ in found)
    quantized = [f"quant_drop_{b}bit" for b in bits]
    quantized += [f"quant_loss_rise_{b}bit" for b in bits] if lm else []
    out = []
    for label, pairs in sorted(groups.items(), key=lambda kv: (kv[0] != "base", kv[0])):
        before = [_last(m, "test_acc") for m, _ in pairs]
        after = [_last(p, "test_acc") for _, p in pairs]
        values = {
            "acc_before": before,
            "acc_after": after,
            "forgetting_acc": list(map(diff, before, after)),
            "loss_rise": [diff(_last(p, "test_loss"), _last(m, "test_loss")) for m, p in pairs],
            **(
                {
                    "ppl_before": [_last(m, "test_ppl") for m, _ in pairs],
                    "ppl_after": [_last(p, "test_ppl") for _, p in pairs],
                }
                if lm
                else {}
            ),
            **{key: [_last(m, key) for m, _ in pairs] for key in quantized},
        }
        row = {"midtraining": label, "variant": pairs[0][0].variant, "n": len(pairs)}
        row["stats"] = {k: stats(v) for k, v in values.items()}
        out.append(row)
    base = next((r for r in out if r["variant"] == "base"), None)
    reduced = [("forgetting_acc", "reduction_post_pct"), *(
        (f"quant_drop_{b}bit", f"reduction_{b}bit_pct") for b in bits)]  # fmt: skip
    if lm:
        reduced += [("loss_rise", "reduction_loss_pct"), *(
            (f"quant_loss_rise_{b}bit", f"reduction_{b}bit_loss_pct") for b in bits)]  # fmt: skip
    for r in out:
        r["reductions"] = {}
        for key, name in reduced:
            ref, mine = (base["stats"][key]["mean"] if base else None), r["stats"][key]["mean"]
            # against a base that lost nothing (or gained) a reduction has no meaning
            bad = ref is None or ref <= 0 or mine is None
            r["reductions"][name] = None if bad else 100 * (ref - mine) / ref
    return out


def _csv_row(r: dict) -> dict:
    """forgetting.csv's row: the setting, each column's mean and sample std, the reductions."""
    flat = {"midtraining": r["midtraining"], "variant": r["variant"], "n": r["n"]}
    for key, s in r["stats"].items():
        flat[key], flat[f"{key}_std"] = s["mean"], s["std"]
    return {**flat, **r["reductions"]}


def write_forgetting(report: Report, out_dir: Path) -> list[Path]:
    """forgetting.csv and its figure: one row per mid-training setting (nothing without chains)."""
    table = rows(report)
    if not table:
        return []
    from ..plots.cache import save_plot
    from ..plots.forgetting import plot_forgetting
    from ..runfiles import atomic_write_bytes

    text = io.StringIO()
    flat = [_csv_row(r) for r in table]
    w = csv.DictWriter(text, fieldnames=list(flat[0]), lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in flat)
    path = Path(out_dir) / "forgetting.csv"
    atomic_write_bytes(path, text.getvalue().encode())
    return [path, save_plot(out_dir, STEM, report.plot_format, plot_forgetting, table)]


HEADERS = [  # report.md's header of each other column, by its name's pattern
    (r"quant_drop_(\d+)bit", r"\1-bit drop (acc)"),
    (r"quant_loss_rise_(\d+)bit", r"\1-bit loss rise"),
    (r"reduction_post_pct", "forgetting reduction"),
    (r"reduction_loss_pct", "loss-rise reduction"),
    (r"reduction_(\d+)bit_pct", r"\1-bit drop reduction"),
    (r"reduction_(\d+)bit_loss_pct", r"\1-bit loss-rise reduction"),
]


def _header(key: str) -> str:
    if key in COLUMNS:
        return COLUMNS[key]
    return next((re.sub(p, h, key) for p, h in HEADERS if re.fullmatch(p, key)), key)


def _percent(v) -> str:
    return "—" if v is None else f"{v:+.0f}%"


@SECTIONS.register(
    "forgetting", "forgetting after post-training and quantization", order=36,
    files=write_forgetting,
)  # fmt: skip
def section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's forgetting table: per mid-training setting, the measured columns over seeds
    and the reductions against base."""
    table = rows(report)
    if not table:
        return []
    keys, reductions = list(table[0]["stats"]), list(table[0]["reductions"])
    head = ["mid-training", *map(_header, keys), *map(_header, reductions), "n"]
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
        "less forgetting, a smaller drop; none against a base that lost nothing). "
        "forgetting.csv has every column with its std."
        + (
            " Language models: ppl = the first corpus's test perplexity; the b-bit loss rise is "
            "the test-loss rise of the quantized weights; the loss-rise reductions are of those."
            if "ppl_before" in keys
            else ""
        ),
        "",
    ]
