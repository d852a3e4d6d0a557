"""Presets in stages (sam_runner/sweep/stages.py): stage:NAME references resolved to a sibling
stage's job, stages run in order into <sweep>/<stage>/<n>, resumed, refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from sam_runner.errors import UserError
from sam_runner.sweep.stages import pick

# tiny jobs: a 1-epoch mlp on 300 MNIST-1D samples, no curvature measurement
TINY_HEAD = """# @package _global_
defaults:
  - override /dataset: mnist1d
  - override /model: mlp
  - override /optimizer: base
study: {name: tiny_stages}
model: {hidden: [8]}
dataset: {num_samples: 300, batch_size: 100}
trainer: {epochs: 1, progress: none}
metrics: {hessian: {enabled: false}}
"""

CHAIN = """stages:
  first:
    seed: 0
  second:
    model.init_from: stage:first
    trainer.distill.teacher: stage:first
    optimizer: base,sam
    seed: 0
  third:
    model.init_from: stage:second/optimizer:base,stage:second/optimizer:sam
    dataset.label_noise: 0.5
    seed: 0
"""


def preset(tmp_path: Path, stages: str, name: str = "tiny_stages") -> list[str]:
    """The overrides that add a preset ``name`` (TINY_HEAD + ``stages``) from a config folder
    of the test's own."""
    folder = tmp_path / "conf" / "experiment"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(TINY_HEAD + stages)
    return [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"experiment={name}"]


def summary(path: Path) -> dict:
    return json.loads((path / "summary.json").read_text())


TWO = """stages:
  first:
    seed: 0
  second:
    model.init_from: stage:first
    trainer.distill.teacher: stage:first
    seed: 0
"""


@pytest.mark.slow  # CI's time (~12 s; the chain of three stages below resumes too)
def test_stages_run_in_order_into_their_folders_and_resume(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    argv = ["-m", *preset(tmp_path, TWO), f"hydra.sweep.dir={sweep}"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "stage first (1/2)" in out and "2 stage(s) completed" in out
    first, second = sweep / "first" / "0", sweep / "second" / "0"
    assert summary(first)["status"] == "completed"
    # the references are resolved in the recorded config, kept as written in the overrides
    s = summary(second)
    assert s["status"] == "completed"
    assert s["config"]["trainer.distill.teacher"] == str(first.absolute())
    assert s["init_from"]["path"] == str((first / "checkpoints" / "last.pt").resolve())
    assert "model.init_from=stage\\:first" in s["overrides"]
    # the same command again: every job is found completed, none of its files is written
    # (Hydra rewrites each stage's multirun.yaml)
    jobs = lambda: {p: p.stat().st_mtime_ns for p in sweep.rglob("*/0/**/*") if p.is_file()}  # noqa: E731
    kept = jobs()
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert kept and jobs() == kept


@pytest.mark.slow
def test_a_chain_of_three_stages_resumes_a_failed_job_and_reports_forgetting(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    argv = ["-m", *preset(tmp_path, CHAIN), f"hydra.sweep.dir={sweep}"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    first, second, third = (sweep / s for s in ("first", "second", "third"))
    # job n of third starts from second's job of the selected variant (base #0, sam #1)
    for n, variant in ((0, "base"), (1, "sam")):
        assert summary(third / str(n))["config"]["model.init_from"] == str(
            (second / str(n)).absolute()
        )
        assert summary(second / str(n))["config"]["optimizer.name"] == variant
    # resume: a failed job of the last stage runs again, nothing else does
    kept = {p: p.stat().st_mtime_ns for p in sweep.rglob("summary.json")}
    (third / "1" / "summary.json").write_text(json.dumps({"status": "failed", "error": "x"}))
    (third / "1" / "checkpoints" / "last.pt").unlink()
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert summary(third / "1")["status"] == "completed"
    changed = [p for p, t in kept.items() if p.stat().st_mtime_ns != t]
    assert changed == [third / "1" / "summary.json"]
    # sam-report on the sweep folder: every stage's jobs, and the forgetting chain
    from sam_runner.results.report import main as report_main

    report_main([str(sweep)])
    rows = (sweep / "forgetting.csv").read_text().splitlines()
    assert rows[0].startswith("midtraining,variant,n,acc_before,acc_before_std,acc_after")
    assert {"forgetting_acc", "forgetting_acc_std", "reduction_post_pct"} <= set(rows[0].split(","))
    assert [r.split(",")[0] for r in rows[1:]] == ["base", "sam ρ=0.05"]
    assert "5 jobs: 5 completed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("stages", "said"),
    [
        (
            "stages:\n  a: {seed: 0}\n  b: {model.init_from: 'stage:nope'}\n",
            "model.init_from=stage:nope: there is no stage nope; the preset's stages are a, b",
        ),
        (
            "stages:\n  a: {model.init_from: 'stage:b'}\n  b: {seed: 0}\n",
            "model.init_from=stage:b: stage b runs after stage a",
        ),
        (
            "stages:\n  a: {seed: '0,1'}\n  b: {model.init_from: 'stage:a'}\n",
            "matches 2 jobs of stage a (jobs 0, 1: they differ in seed); select one, e.g. "
            "stage:a/seed:0",
        ),
        (
            "stages:\n  a: {seed: '0,1'}\n  b: {model.init_from: 'stage:a', seed: 2}\n",
            "model.init_from=stage:a (stage b, job 0) matches no job of stage a: none has seed=2",
        ),
        (
            "stages:\n  a: {seed: 0}\n  b: {model.init_from: 'stage:a/seed'}\n",
            "the selector 'seed' is not key:value",
        ),
    ],
)
def test_a_bad_reference_is_one_line_before_anything_runs(tmp_path, capsys, stages, said):
    sweep = tmp_path / "sweep"
    code, out, err = run_cli(["-m", *preset(tmp_path, stages), f"hydra.sweep.dir={sweep}"], capsys)
    assert code == 2
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert not sweep.exists()


def test_a_staged_preset_without_m_is_refused(tmp_path, capsys):
    code, _, err = run_cli([*preset(tmp_path, CHAIN)], capsys)
    assert code == 2 and "runs in stages; run it as a sweep (-m)" in err


def test_a_stage_reference_outside_a_staged_sweep_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    code, _, err = run_cli(["model.init_from=stage:first", f"hydra.run.dir={run}"], capsys)
    assert code == 2 and "no stage first has run" in err


def test_pick_matches_selectors_and_the_keys_both_jobs_set():
    teachers = [[f"optimizer={o}", f"seed={s}", "model.hidden=[512]"]
                for o in ("base", "sam") for s in (0, 1)]  # fmt: skip
    key = "trainer.distill.teacher"
    student = ["optimizer=base", "seed=1", "model.hidden=[32]"]
    assert pick(key, "stage:t/optimizer:sam", student, teachers, "") == 3
    assert pick(key, "stage:t", student, teachers, "") == 1  # its own optimizer and seed
    assert pick(key, "stage:t/optimizer:base/seed:0", student, teachers, "") == 0
    with pytest.raises(UserError, match="matches 2 jobs"):
        pick(key, "stage:t/optimizer:sam", ["model.hidden=[32]"], teachers, "")
    # values compare in Hydra's normal form
    rhos = [["optimizer=sam", "optimizer.rho=0.05"], ["optimizer=sam", "optimizer.rho=0.2"]]
    assert pick("model.init_from", "stage:m/optimizer.rho:0.050", [], rhos, "") == 0
