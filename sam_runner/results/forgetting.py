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

from .sections import SECTIONS
from .sweep import stats


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


def rows(report) -> list[dict]:
    """One row per mid-training setting: means over its seeds."""
    groups: dict[str, list] = {}
    for mid, post in chains(report):
        groups.setdefault(_label(mid), []).append((mid, post))
    bits = sorted(
        {
            int(m.group(1))
            for mid, _ in chains(report)
            for r in [*(mid.run.rows()[-1:]), mid.run.eval() or {}]
            for k in r
            for m in [re.fullmatch(r"quant_drop_(\d+)bit", k)]
            if m
        },
        reverse=True,
    )
    lm = any(_last(mid, "test_ppl") is not None for mid, _ in chains(report))
    out = []
    for label, pairs in groups.items():
        row = {"midtraining": label, "variant": pairs[0][0].variant, "n": len(pairs)}
        acc_before = [_last(m, "test_acc") for m, _ in pairs]
        acc_after = [_last(p, "test_acc") for _, p in pairs]
        loss_before = [_last(m, "test_loss") for m, _ in pairs]
        loss_after = [_last(p, "test_loss") for _, p in pairs]
        diff = lambda a, b: None if a is None or b is None else a - b  # noqa: E731
        row["acc_before"] = stats(acc_before)["mean"]
        row["acc_after"] = stats(acc_after)["mean"]
        row["forgetting_acc"] = stats(map(diff, acc_before, acc_after))["mean"]
        row["loss_rise"] = stats(map(diff, loss_after, loss_before))["mean"]
        if lm:
            row["ppl_before"] = stats([_last(m, "test_ppl") for m, _ in pairs])["mean"]
            row["ppl_after"] = stats([_last(p, "test_ppl") for _, p in pairs])["mean"]
        for b in bits:
            for key in (f"quant_drop_{b}bit", *([f"quant_loss_rise_{b}bit"] if lm else [])):
                row[key] = stats([_last(m, key) for m, _ in pairs])["mean"]
        out.append(row)
    base = next((r for r in out if r["variant"] == "base"), None)
    reduced = [("forgetting_acc", "reduction_post_pct"), *(
        (f"quant_drop_{b}bit", f"reduction_{b}bit_pct") for b in bits)]  # fmt: skip
    if lm:
        reduced += [("loss_rise", "reduction_loss_pct"), *(
            (f"quant_loss_rise_{b}bit", f"reduction_{b}bit_loss_pct") for b in bits)]  # fmt: skip
    for r in out:
        for key, name in reduced:
            ref = base.get(key) if base else None
            # against a base that lost nothing (or gained) a reduction has no meaning
            bad = ref is None or ref <= 0 or r.get(key) is None
            r[name] = None if bad else 100 * (ref - r[key]) / ref
    return out


def _cell(v) -> str:
    return "—" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))


def write_forgetting(report, out_dir: Path) -> list[Path]:
    table = rows(report)
    if not table:
        return []
    from ..runfiles import atomic_write_bytes

    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=list(table[0]), lineterminator="\n")
    w.writeheader()
    w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in table)
    path = Path(out_dir) / "forgetting.csv"
    atomic_write_bytes(path, text.getvalue().encode())
    return [path]


@SECTIONS.register(
    "forgetting", "forgetting after post-training and quantization", order=36,
    files=write_forgetting,
)  # fmt: skip
def section(report, _plots=None) -> list[str]:
    table = rows(report)
    if not table:
        return []
    keys = [k for k in table[0] if k not in ("variant",)]
    out = ["## Forgetting after post-training and quantization", ""]
    out += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    out += ["| " + " | ".join(_cell(r[k]) for k in keys) + " |" for r in table]
    return out + [
        "",
        "Per mid-training setting, means over seeds (n): the first task's test accuracy after "
        "mid-training (acc_before) and after post-training (acc_after), forgetting = their "
        "difference, loss_rise = the rise of its test loss, quant_drop_<b>bit = the accuracy "
        "the mid-trained weights lose when quantized; reduction_* = 100·(base − this)/base "
        "against optimizer=base mid-training (positive: less forgetting)."
        + (
            " Language models: ppl_* = the first corpus's test perplexity, quant_loss_rise_<b>bit "
            "= the test-loss rise of the quantized weights, reduction_*loss_pct of the loss rises."
            if "ppl_before" in table[0]
            else ""
        ),  # fmt: skip
        "",
    ]
