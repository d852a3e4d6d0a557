"""Fine-tuning in ``sam-report``: for each job started from another job of the report
(``model.init_from``, as the stages of ``experiment=optimizer_consistency_mini`` and
``peft_flatness_mini`` are) that itself started from no other (a pretrained job), what the
fine-tuning learned and what it forgot (fine_tuning.csv, fine_tuning.<format>).

Our choices: the second task is what the fine-tuning job trains on, the first what every job's
test set measures (the presets change the training task — relabelled examples, recased text —
and keep the test set). So:
- learning: the fine-tuned job's ``train_loss`` and ``train_acc`` on the second task (its last
  evaluation line: the mean over the last epoch's training batches at the weights of each
  step; in-sample, as its test set is the first task's);
- forgetting: ``loss_rise`` = the fine-tuned job's ``test_loss`` − the pretrained job's, and
  ``acc_drop`` = the pretrained job's ``test_acc`` − the fine-tuned job's;
- ``lambda_max``: the fine-tuned job's (under ``model.peft``, over the trainable parameters:
  ``metrics.hessian.params``), beside ``lambda_max_pretrained``, around the checkpoint it
  started from (over every parameter).
Rows are (model, pretraining, fine-tuning, lr), means over seeds; the figure draws the loss of
the second task against the loss rise of the first, one curve per model × pretraining ×
fine-tuning over the learning rates (low and left: learns more and forgets less).
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from .forgetting import _init_from, _last, _source
from .sections import SECTIONS
from .sweep import stats, stats_cell

if TYPE_CHECKING:
    from .sweep import Report

COLUMNS = ("new_loss", "new_acc", "loss_rise", "acc_drop", "lambda_max", "lambda_max_pretrained")


def pairs(report: Report) -> list[tuple]:
    """(pretrained job, fine-tuned job) for each completed job that started from a completed job
    of the report, which started from none of them, and that no job started from: a chain of
    three stages (pretrain → mid-train → post-train) is the forgetting section's, not this."""
    done = report.completed()
    if not any(_init_from(j) for j in done):  # nothing fine-tuned: no folder resolved
        return []
    by_dir = {j.path.resolve(): j for j in done}
    source = {id(j): _source(j, by_dir) for j in done}
    started_from = {id(s) for s in source.values() if s is not None}
    return [
        (source[id(tuned)], tuned)
        for tuned in done
        if source[id(tuned)] is not None
        and source[id(source[id(tuned)])] is None
        and id(tuned) not in started_from
    ]


def _optimizer(job) -> str:
    """How a job trained: its base optimizer, and its variant where it has one."""
    base = str(job.run.get("base_optimizer.name") or "?")
    return base if job.variant in ("base", "unknown") else f"{job.variant}-{base}"


def _method(job) -> str:
    """What fine-tuned: every weight or the adapters, by which optimizer, at which ρ (two ρ are
    two rows, never one mean)."""
    peft = str(job.run.get("model.peft") or "none")
    rho = f" ρ={job.rho:g}" if job.rho is not None else ""
    return f"{'full' if peft == 'none' else peft} {_optimizer(job)}{rho}"


def _value(job, key):
    if key == "new_loss":
        return _last(job, "train_loss")
    if key == "new_acc":
        return _last(job, "train_acc")
    return _last(job, key)


def rows(report: Report) -> list[dict]:
    """One row per (model, pretraining, fine-tuning, lr): means over its seeds."""
    groups: dict[tuple, list] = {}
    for source, tuned in pairs(report):
        key = (
            str(tuned.run.get("model.arch") or "?"),
            _optimizer(source),
            _method(tuned),
            tuned.lr,
        )
        groups.setdefault(key, []).append((source, tuned))
    out = []
    for (model, pretrain, method, lr), members in sorted(
        groups.items(), key=lambda kv: tuple(str(k) for k in kv[0][:3]) + (kv[0][3] or 0,)
    ):
        diff = lambda a, b: None if a is None or b is None else a - b  # noqa: E731
        values = {
            "new_loss": [_value(t, "new_loss") for _, t in members],
            "new_acc": [_value(t, "new_acc") for _, t in members],
            "loss_rise": [diff(_last(t, "test_loss"), _last(s, "test_loss")) for s, t in members],
            "acc_drop": [diff(_last(s, "test_acc"), _last(t, "test_acc")) for s, t in members],
            "lambda_max": [_last(t, "lambda_max") for _, t in members],
            "lambda_max_pretrained": [_last(s, "lambda_max") for s, _ in members],
        }
        source, tuned = members[0]
        same = source.run.get("base_optimizer.name") == tuned.run.get("base_optimizer.name")
        row = {"model": model, "pretraining": pretrain, "fine_tuning": method, "lr": lr}
        row["same_optimizer"] = same
        row.update({k: stats(v) for k, v in values.items()})
        row["trainable_parameters"] = (members[0][1].run.summary or {}).get("trainable_parameters")
        row["n"] = len(members)
        out.append(row)
    return out


def pretrained_rows(report: Report) -> list[dict]:
    """One row per pretrained job: its model, optimizer, first-task loss and λ_max."""
    seen, out = set(), []
    for source, _ in pairs(report):
        if source.path in seen:
            continue
        seen.add(source.path)
        out.append(
            {
                "job": source.name,
                "model": str(source.run.get("model.arch") or "?"),
                "pretraining": _optimizer(source),
                "test_loss": _last(source, "test_loss"),
                "test_acc": _last(source, "test_acc"),
                "lambda_max": _last(source, "lambda_max"),
            }
        )
    return out


def _csv_cell(v):
    if isinstance(v, dict):
        return "" if v.get("mean") is None else v["mean"]
    return "" if v is None else v


def write_fine_tuning(report: Report, out_dir: Path) -> list[Path]:
    """fine_tuning.csv (one row per model, pretraining, fine-tuning and lr) and its trade-off
    figure."""
    table = rows(report)
    if not table:
        return []
    from ..runfiles import atomic_write_bytes

    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(table[0]), lineterminator="\n")
    w.writeheader()
    w.writerows({k: _csv_cell(v) for k, v in r.items()} for r in table)
    path = Path(out_dir) / "fine_tuning.csv"
    atomic_write_bytes(path, text.getvalue().encode())
    from ..plots.cache import save_plot
    from ..plots.fine_tuning import plot_trade_off

    return [path, save_plot(out_dir, "fine_tuning", report.plot_format, plot_trade_off, table)]


def _cell(v) -> str:
    if isinstance(v, dict):
        return stats_cell(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    return "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


@SECTIONS.register(
    "fine_tuning", "learning and forgetting of fine-tuned jobs", order=37, files=write_fine_tuning
)
def section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's fine-tuning section: learning and forgetting, one row per (model, pretraining,
    fine-tuning, lr)."""
    table = rows(report)
    if not table:
        return []
    keys = ["model", "pretraining", "fine_tuning", "lr", "same_optimizer", *COLUMNS,
            "trainable_parameters", "n"]  # fmt: skip
    out = ["## Fine-tuning: learning and forgetting", ""]
    out += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(_cell(r[k]) for k in keys) + " |" for r in table]
    out += [
        "",
        "Per model, pretraining optimizer, fine-tuning method and learning rate, mean ± std over "
        "seeds (n). The second task is what fine-tuning trained on: new_loss and new_acc are its "
        "last epoch's training loss and accuracy (in-sample). The first task is what the test "
        "set measures: loss_rise = test_loss after fine-tuning − before, acc_drop = test_acc "
        "before − after (forgetting). lambda_max is the fine-tuned job's (in the trainable "
        "parameters under model.peft), lambda_max_pretrained the pretrained checkpoint's (every "
        "parameter).",
        "",
        f"![learning against forgetting](fine_tuning.{report.plot_format})",
        "",
        "### Pretrained checkpoints",
        "",
        "| job | model | pretraining | test_loss | test_acc | lambda_max |",
        "|---|---|---|---|---|---|",
    ]
    for r in pretrained_rows(report):
        cells = [r["job"], r["model"], r["pretraining"]]
        cells += [_cell(r[k]) for k in ("test_loss", "test_acc", "lambda_max")]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]
