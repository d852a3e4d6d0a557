"""Slices around one run: the centre is the run's own loss bit for bit, the files, the fitted
curvature on a quadratic toy and along the top Hessian eigenvector."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from landscape_helpers import CNN, MLP, copy_run, trained
from omegaconf import OmegaConf
from torch import nn

from sam_runner.data import Data, build_data
from sam_runner.landscape.cli import main
from sam_runner.landscape.directions import filter_normalized
from sam_runner.landscape.evaluate import COLUMNS
from sam_runner.landscape.options import Options
from sam_runner.landscape.slices import make_evaluator, run_slices
from sam_runner.models import build_model
from sam_runner.rebuild import LoadedRun, load_run
from sam_runner.runfiles import read_rows

SMALL = ["landscape.points=11", "landscape.grid=5", "trainer.progress=none"]


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def own_train_loss(run_dir, cfg_overrides):
    """The run's loss on its curvature subset, computed here from scratch: its config, its data,
    its checkpoint, a plain eval-mode forward."""
    from conftest import compose
    from landscape_helpers import FAST

    cfg = compose(*FAST, *cfg_overrides)
    torch.manual_seed(cfg.seed)
    data = build_data(cfg.dataset, torch.device("cpu"), cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    model.load_state_dict(
        torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]
    )
    x, y = data.train_subset(cfg.metrics.hessian.num_samples, cfg.seed)
    with torch.no_grad():
        out = model.eval()(x).float()
    return float(nn.functional.cross_entropy(out, y))


@pytest.mark.parametrize("hydra", [True, False], ids=["hydra-config", "checkpoint-config"])
def test_the_centre_is_the_runs_own_loss_exactly(tmp_path, hydra):
    run = copy_run(trained(*CNN, hydra=hydra), tmp_path / "run")
    assert main([str(run), *SMALL]) == 0
    centre = next(r for r in rows(run / "landscape" / "slice_1d.csv") if r["coordinate"] == "0.0")
    last = [r for r in read_rows(run / "metrics.jsonl") if "test_loss" in r][-1]
    # the test set: the numbers the run itself logged at the checkpoint's weights
    assert float(centre["test_loss"]) == last["test_loss"]
    assert float(centre["test_acc"]) == last["test_acc"]
    # the training subset: the run's loss recomputed from its files
    assert float(centre["train_loss"]) == own_train_loss(run, CNN)
    npz = np.load(run / "landscape" / "slice_2d.npz")
    i = int(np.flatnonzero(npz["x"] == 0)[0])
    assert npz["train_loss"][i, i] == float(centre["train_loss"])
    assert npz["test_loss"][i, i] == last["test_loss"]
    summary = json.loads((run / "landscape" / "landscape.json").read_text())
    assert summary["test_loss"] == last["test_loss"] and summary["train_samples"] == 256


def test_files_settings_and_weights_put_back(tmp_path):
    run = copy_run(trained(*CNN), tmp_path / "run")
    assert main([str(run), *SMALL, "landscape.seed=4", "landscape.span=[-0.5,0.5]"]) == 0
    out = run / "landscape"
    table = rows(out / "slice_1d.csv")
    assert list(table[0]) == ["coordinate", *COLUMNS] and len(table) == 11
    assert [float(r["coordinate"]) for r in table] == pytest.approx(np.linspace(-0.5, 0.5, 11))
    npz = np.load(out / "slice_2d.npz")
    assert npz["train_loss"].shape == (5, 5) and list(npz["seeds"]) == [4, 5]
    for png in ("slice_1d.png", "slice_2d.png", "surface_2d.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    s = json.loads((out / "landscape.json").read_text())
    assert s["slice_1d"]["settings"]["seed"] == 4 and s["slice_2d"]["settings"]["grid"] == 5
    assert s["slice_1d"]["settings"]["span"] == [-0.5, 0.5]
    assert s["basin_width_1d"] > 0 and len(s["basin_width_2d"]) == 2
    assert s["variant"] == "sam" and s["rho"] == 0.05
    # the model object is moved in place, then put back bit for bit
    loaded = load_run(run, torch.device("cpu"))
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    ev = make_evaluator(loaded, Options(bn="recompute", bn_samples=64))
    d = filter_normalized(loaded.model, 0)
    ev.sweep([0.5, -0.5], lambda c: ev.move([d], [c]), "", "none")
    after = loaded.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_later_2d_slice_keeps_the_1d_numbers(tmp_path):
    run = copy_run(trained(*MLP), tmp_path / "run")
    assert main([str(run), *SMALL, "landscape.slices=1d"]) == 0
    first = json.loads((run / "landscape" / "landscape.json").read_text())
    assert "slice_2d" not in first
    assert main([str(run), *SMALL, "landscape.slices=2d"]) == 0
    both = json.loads((run / "landscape" / "landscape.json").read_text())
    assert both["basin_width_1d"] == first["basin_width_1d"] and "slice_2d" in both


class SquaredError(LoadedRun):
    """A toy run whose loss is (w·x − y)²: quadratic in the weights."""

    def criterion(self):
        return lambda out, y: (out[:, 0] - y) ** 2


def toy_run(tmp_path):
    """A linear model under squared error on 64 seeded samples: its loss is exactly quadratic."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 3, generator=g), torch.randn(64, generator=g)
    model = nn.Linear(3, 1, bias=False)
    data = Data(None, [(x[:16], y[:16], None)], 1, (3,), 64, train_tensors=(x, y))
    cfg = OmegaConf.create(
        {
            "seed": 0,
            "trainer": {},
            "optimizer": {"name": "toy"},
            "model": {"arch": "linear"},
            "dataset": {"name": "toy", "batch_size": 16},
            "metrics": {"hessian": {"num_samples": 64, "tol": 1e-8, "method": "double_backward"}},
        }
    )
    return SquaredError(tmp_path, cfg, model.state_dict(), model, data, torch.device("cpu")), x


def test_fitted_curvature_equals_a_quadratics_known_one(tmp_path):
    run, x = toy_run(tmp_path)
    s = run_slices(run, Options(points=21, grid=5, progress="none"))
    for seed, kappa in (
        (0, s["curvature_1d"]),
        (0, s["curvature_2d"][0]),
        (1, s["curvature_2d"][1]),
    ):
        d = filter_normalized(run.model, seed)[0].double()
        known = 2 * float(((x.double() @ d.T) ** 2).mean())  # d²/dα² of mean((w + αd)·x − y)²
        assert kappa == pytest.approx(known, rel=1e-4)


def test_curvature_along_a_hessian_eigenvector_per_unit_norm_is_its_eigenvalue(tmp_path):
    run, x = toy_run(tmp_path)
    s = run_slices(run, Options(directions="hessian", points=21, grid=5, progress="none"))
    top2 = np.linalg.eigvalsh(2 * (x.double().T @ x.double()).numpy() / 64)[::-1][:2]
    assert s["slice_1d"]["direction"]["eigenvalue"] == pytest.approx(top2[0], rel=1e-6)
    assert s["curvature_1d_per_unit_norm"] == pytest.approx(top2[0], rel=1e-4)
    axes = s["slice_2d"]["axes"]
    assert [a["curvature_per_unit_norm"] for a in axes] == pytest.approx(top2, rel=1e-4)
    norms = [d["norm"] for d in s["slice_2d"]["directions"]]
    assert norms == pytest.approx([float(run.model.weight.detach().norm())] * 2, rel=1e-5)


def test_hessian_slice_of_a_real_run_has_the_eigenvalue_as_its_curvature_scale(tmp_path):
    """On a ReLU network the slice crosses kinks the Hessian does not see: close, not equal."""
    run = copy_run(trained(*MLP, "trainer.epochs=3"), tmp_path / "run")
    argv = [
        str(run),
        "landscape.directions=hessian",
        "landscape.slices=1d",
        "trainer.progress=none",
    ]
    assert main([*argv, "landscape.span=[-0.05,0.05]", "landscape.fit_radius=0.04"]) == 0
    s = json.loads((run / "landscape" / "landscape.json").read_text())
    lam = s["slice_1d"]["direction"]["eigenvalue"]
    assert s["curvature_1d_per_unit_norm"] == pytest.approx(lam, rel=0.1)


# ------------------------------------------------------------ progress and resume (#28)
def test_progress_lines_say_each_tenth_of_a_slice_with_the_time_left(tmp_path, capsys):
    """trainer.progress=lines (what auto gives off a terminal: nohup, a log, SLURM): a line at
    the first point of each slice and at every tenth, with the time taken and left."""
    run = copy_run(trained(*MLP), tmp_path / "run")
    argv = [str(run), "landscape.points=11", "landscape.grid=5", "trainer.progress=lines"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "sam-landscape: 1-D slice: 1/11 points (9%)" in err and "left" in err
    assert "sam-landscape: 1-D slice: 11/11 points (100%)" in err
    assert "sam-landscape: 2-D slice: 25/25 points (100%)" in err
    done = [int(line.split(": ")[2].split("/")[0]) for line in err.splitlines() if "1-D" in line]
    assert done == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11]  # the first point, then each tenth (of 11)


@pytest.mark.slow  # a killed subprocess and its rerun: ~16 s (CI's time)
def test_a_call_killed_in_its_2d_slice_keeps_its_1d_slice(tmp_path):
    """Killed (SIGKILL) while the 2-D slice runs, the same command computes the 2-D slice only:
    the 1-D slice's files and numbers were written when it ended, and are kept."""
    import signal
    import subprocess
    import sys

    from conftest import ROOT, wait_for

    run = copy_run(trained(*MLP), tmp_path / "run")
    argv = [str(run), "landscape.points=11", "landscape.grid=61", "trainer.progress=lines"]
    cmd = [sys.executable, "-m", "sam_runner.landscape.cli", *argv]
    log = tmp_path / "err.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stderr=err, stdout=subprocess.DEVNULL, cwd=ROOT)
        wait_for(lambda: "2-D slice: 1/" in log.read_text(), "the 2-D slice", proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    held = json.loads((run / "landscape" / "landscape.json").read_text())
    assert "slice_1d" in held and "slice_2d" not in held and "options" not in held
    first = (run / "landscape" / "slice_1d.csv").read_bytes()
    again = [*cmd[:-2], "landscape.grid=5", "trainer.progress=lines"]
    done = subprocess.run(again, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "the 1-D slice is in landscape.json with these settings: kept" in done.stderr
    assert "1-D slice: " not in done.stderr and "2-D slice: 25/25" in done.stderr
    assert (run / "landscape" / "slice_1d.csv").read_bytes() == first
    both = json.loads((run / "landscape" / "landscape.json").read_text())
    assert both["slice_1d"] == held["slice_1d"] and "slice_2d" in both
    assert (run / "landscape" / "slice_1d.png").is_file()
