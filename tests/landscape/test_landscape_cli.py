"""sam-landscape's command line: one-line errors (exit 2, nothing written), the console script."""

from __future__ import annotations

import subprocess
import sys

import pytest
from landscape_helpers import CNN, MLP, copy_run, trained

from sam_runner.landscape.cli import main


def fails(argv, capsys) -> str:
    """The one line of a refused call (exit 2)."""
    with pytest.raises(SystemExit) as exit_info:  # argparse's own refusals exit
        code = main([str(a) for a in argv])
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sam-landscape: error: "), err
    return lines[0]


@pytest.fixture
def run(tmp_path):
    return copy_run(trained(*MLP), tmp_path / "run")


def test_a_missing_folder(tmp_path, capsys):
    line = fails([tmp_path / "nope"], capsys)
    assert "nope" in line and "does not exist" in line


def test_a_run_without_a_checkpoint(run, capsys):
    (run / "checkpoints" / "last.pt").unlink()
    line = fails([run], capsys)
    assert "has no checkpoint" in line and str(run) in line
    assert not (run / "landscape").exists()


def test_an_unreadable_checkpoint(run, capsys):
    (run / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    assert "unreadable" in fails([run], capsys)


def test_two_runs_of_different_architectures(run, capsys):
    other = trained(*CNN)
    line = fails([run, "--to", other], capsys)
    assert "different architectures" in line and "mlp" in line and "cnn1d" in line
    assert not (run / "landscape").exists()


def test_a_folder_that_holds_no_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert "holds no run" in fails([tmp_path / "empty"], capsys)


def test_pairs_of_a_run_folder(run, capsys):
    assert "needs a sweep folder" in fails([run, "landscape.pairs=seeds"], capsys)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["landscape.points=1"], "landscape.points=1 must be an integer >= 3"),
        (["landscape.grid=0"], "landscape.grid=0 must be an integer >= 3"),
        (["landscape.span=[1,-1]"], "landscape.span=[1, -1] must be two finite numbers [LO, HI]"),
        (["landscape.span=[0.1,1]"], "landscape.span=[0.1, 1] must be"),
        (["landscape.span=[-1,nan]"], "must be two finite numbers"),
        (["landscape.fit_radius=-1"], "landscape.fit_radius=-1 must be a finite number > 0"),
        (["landscape.train_samples=0"], "landscape.train_samples=0 must be an integer >= 1"),
        (["landscape.seed=-2"], "landscape.seed=-2 must be an integer >= 0"),
        (["landscape.bn=train"], "landscape.bn='train' is unknown; choose one of eval, recompute"),
        (["landscape.directions=pca"], "landscape.directions='pca' is unknown"),
        (["landscape.points=ten"], "landscape.points='ten' must be an integer >= 3"),
        (["trainer.device=tpu"], "trainer.device='tpu' is unknown; choose auto, cpu, cuda"),
        (["landscape.alphas=5"], "landscape.alphas applies to landscape.to or landscape.pairs"),
        (["landscape.curve=bezier"], "landscape.curve applies to landscape.to or landscape.pairs"),
        (["--to", "X", "landscape.grid=5"],
         "landscape.grid applies to slices, not to landscape.to or landscape.pairs"),
        (["landscape.to=X", "landscape.pairs=seeds"], "landscape.to and landscape.pairs exclude"),
        (["--to", "X", "landscape.alpha_range=[0.2,1]"], "landscape.alpha_range=[0.2, 1] must be"),
        (["--to", "X", "landscape.alphas=1"], "landscape.alphas=1 must be an integer >= 2"),
        (["--to", "X", "landscape.curve_epochs=0"],
         "landscape.curve_epochs=0 must be an integer >= 1"),
        (["landscape.pionts=5"], "landscape.pionts is not a key; did you mean landscape.points?"),
        (["optimizer.rho=1"], "optimizer.rho is not a key"),
        (["--frobnicate"], "--frobnicate is not an option; sam-landscape takes KEY=VALUE"),
    ],
)  # fmt: skip
def test_bad_options(run, capsys, argv, words):
    assert words in fails([run, *argv], capsys)
    assert not (run / "landscape").exists()


@pytest.mark.parametrize(
    "words, line",
    [
        (["landscape.points=1"], "landscape.points=1 must be an integer >= 3"),
        (["landscape.to=X", "landscape.grid=5"],
         "landscape.grid applies to slices, not to landscape.to or landscape.pairs"),
        (["landscape.train_samples=0"], "landscape.train_samples=0 must be an integer >= 1"),
        (["trainer.device=tpu"],
         "trainer.device='tpu' is unknown; choose auto, cpu, cuda or cuda:N"),
    ],
)  # fmt: skip
def test_an_error_is_spelled_as_the_call_spelled_its_options(run, capsys, words, line):
    assert fails([run, *words], capsys) == f"sam-landscape: error: {line}"


def test_a_missing_run_b(run, capsys):
    assert "landscape.to=" in fails([run, "--to", run.parent / "nope"], capsys)
    assert "landscape.to=" in fails([run, f"landscape.to={run.parent / 'nope'}"], capsys)


def test_the_console_entry_point_runs_as_a_module(run):
    proc = subprocess.run(
        [sys.executable, "-m", "sam_runner.landscape.cli", str(run), "landscape.points=0"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "sam-landscape: error: landscape.points=0 must be an integer >= 3"
    help_text = subprocess.run(
        [sys.executable, "-m", "sam_runner.landscape.cli", "--help"], capture_output=True, text=True
    ).stdout
    # every key of conf/landscape.yaml with its default and the comment beside it
    assert "landscape.points=51" in help_text and "points of the 1-D slice" in help_text
    assert "landscape.to=null" in help_text and "--to RUN_B" in help_text
    assert "trainer.device=auto" in help_text and "plots.format=png" in help_text


def test_options_that_do_not_change_a_result_do_not_redo_it():
    from sam_runner.landscape.options import Options

    # the seed and the curve's epochs only matter to a Bézier curve; --bn-samples only to
    # --bn recompute; the other slice's resolution only when both slices are drawn
    assert Options(seed=3, curve_epochs=5).pair_settings() == Options().pair_settings()
    assert Options(bn_samples=10).pair_settings() == Options().pair_settings()
    assert (
        Options(curve="bezier", seed=3).pair_settings() != Options(curve="bezier").pair_settings()
    )
    one_d = Options(slices="1d", grid=9).slice_options()
    assert one_d == Options(slices="1d").slice_options()
    assert Options(points=9).slice_options() != Options().slice_options()


def test_averaged_weights_go_into_their_own_folder(run, capsys):
    import json

    import torch

    line = fails([run, "landscape.weights=averaged"], capsys)
    assert "averaged.pt" in line and str(run) in line
    model = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    model = {k: v * 0.5 if v.is_floating_point() else v for k, v in model.items()}
    averaged = {"model": model, "kind": "ema", "n_averaged": 5, "epoch": 1, "step": 4}
    torch.save(averaged, run / "checkpoints" / "averaged.pt")
    flags = ["landscape.slices=1d", "landscape.points=5", "landscape.train_samples=64"]
    assert main([str(run), *flags, "landscape.weights=averaged"]) == 0
    assert main([str(run), *flags]) == 0
    avg = json.loads((run / "landscape_averaged" / "landscape.json").read_text())
    last = json.loads((run / "landscape" / "landscape.json").read_text())
    assert avg["weights"] == "averaged" and "weights" not in last
    assert avg["train_loss"] != last["train_loss"]  # L(θ) at the other weights


def test_the_to_alias_and_the_key_give_one_result(run, tmp_path, capsys):
    other = copy_run(trained(*MLP), tmp_path / "other")
    words = ["landscape.alphas=3", "landscape.train_samples=64", "trainer.device=cpu"]
    assert main([str(run), *words, f"landscape.to={other}", "trainer.progress=none"]) == 0
    assert (run / "landscape" / "other" / "connectivity.csv").is_file()
    capsys.readouterr()
    # the same computation: found done, not computed again
    assert main([str(run), *words, "--to", str(other), "trainer.progress=none"]) == 0
    assert "the connectivity with these settings, newer than the weights: kept" in (
        capsys.readouterr().out
    )
    line = fails([run, "trainer.progress=line"], capsys)
    assert "trainer.progress='line' is unknown; choose one of auto, bar, lines, none" in line
    line = fails([run, "landscape.span=[1,2]"], capsys)
    assert "landscape.span=[1, 2] must be" in line
    line = fails([run, "landscape.points"], capsys)
    assert "'landscape.points' is not KEY=VALUE" in line


def test_a_done_landscape_is_said_from_its_folder_before_torch_loads(run, tmp_path):
    """A rerun of a finished slice and of a finished pair: nothing computed, torch not imported;
    a run trained again since (a newer checkpoint) is computed again."""
    other = copy_run(trained(*MLP), tmp_path / "other")
    words = ["landscape.slices=1d", "landscape.points=5", "landscape.train_samples=64"]
    pair = ["landscape.train_samples=64", f"landscape.to={other}"]
    assert main([str(run), *words]) == 0 and main([str(run), *pair]) == 0
    code = (
        "import sys; from sam_runner.landscape.cli import main; rc = main(sys.argv[1:]); "
        "print('torch loaded' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)"
    )
    for argv, what in ((words, "slices"), (pair, "connectivity")):
        proc = subprocess.run(
            [sys.executable, "-c", code, str(run), *argv], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        assert f"the {what} with these settings, newer than the weights: kept" in proc.stdout
        assert proc.stdout.strip().endswith("no torch"), proc.stdout
    (run / "checkpoints" / "last.pt").touch()  # as a run trained again
    csv = run / "landscape" / "slice_1d.csv"
    before = csv.stat().st_mtime_ns
    assert main([str(run), *words]) == 0
    assert csv.stat().st_mtime_ns > before


def test_help_shows_list_defaults_as_they_are_typed():
    """#58 item 6: block YAML printed ``landscape.span=- -1.0``."""
    from sam_runner.landscape.cli import help_text

    text = help_text()
    assert "landscape.span=[-1.0, 1.0] " in text
    assert "landscape.alpha_range=[-0.25, 1.25] " in text
    assert "landscape.points=51 " in text and "landscape.to=null " in text
    assert "=- " not in text
