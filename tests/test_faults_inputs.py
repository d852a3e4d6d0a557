"""Bad inputs that used to pass in silence (#28, item 5): a key given twice, an option the
variant ignores, a report column or pooling key that does not exist, a sweep folder that does
not exist, milestones past the last epoch."""

from __future__ import annotations

import pytest
from conftest import TINY, compose, run_cli

from sam_runner.preflight import check_jobs
from sam_runner.results import report
from sam_runner.sweep.hydra_api import args_parser
from sam_runner.sweep.lines import lines_main
from sam_runner.train import train
from sam_runner.validate import warnings


def test_a_key_given_twice_is_one_line_naming_it(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    code, _, err = run_cli(["-m", "seed=0,1", "seed=2,3", f"hydra.sweep.dir={sweep}"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("sam-run: error: seed is given twice (seed=0,1 and seed=2,3)")
    assert not sweep.exists()


def test_cfg_with_a_sweep_prints_its_first_job(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    argv = ["-m", "optimizer=sam,base", "seed=4,5", f"hydra.sweep.dir={sweep}", "--cfg", "job"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    assert err == (
        "sam-run: note: -m with --cfg prints the config of the first of its 4 jobs "
        f"(optimizer=sam seed=4 hydra.sweep.dir={sweep})\n"
    )
    assert "name: sam" in out and "seed: 4" in out and not sweep.exists()


def test_a_single_run_says_its_variant_ignores_rho():
    args = args_parser().parse_args(["optimizer=base", "optimizer.rho=0.5"])
    message, notes = check_jobs(args)
    assert message is None
    assert "optimizer=base ignores optimizer.rho=0.5 (nothing is perturbed)" in " ".join(notes)
    _, notes = check_jobs(args_parser().parse_args(["optimizer=sam", "optimizer.rho=0.5"]))
    assert not any("ignores" in n for n in notes)


def test_milestones_past_the_last_epoch_are_a_notice():
    cfg = compose("scheduler=multistep", "scheduler.milestones=[1,5,9]", "trainer.epochs=5")
    notes = [n for n in warnings(cfg) if "milestones" in n]
    assert notes == [
        "scheduler.milestones 5, 9 are at or beyond trainer.epochs=5: the learning rate is "
        "never multiplied by gamma there"
    ]
    assert not any("milestones" in n for n in warnings(compose("scheduler=multistep",
        "scheduler.milestones=[1,2]", "trainer.epochs=5")))  # fmt: skip


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(compose(*TINY, "seed=3"), run_dir, ["seed=3"])
    return run_dir


@pytest.mark.parametrize(
    "option, message",
    [
        (["--metric", "test_acx"], "--metric test_acx is not a numeric summary.json or "
         "metrics.jsonl key of any completed job; did you mean test_acc?"),
        (["--metric", "nonexistent"], "--metric nonexistent is not a numeric summary.json or "
         "metrics.jsonl key of any completed job; choose one of "),
        (["--metric", "config"], "--metric config is not a numeric summary.json or "
         "metrics.jsonl key of any completed job; "),
        (["--ignore", "nosuchkey"], "--ignore nosuchkey is not an override key of any job; "
         "choose one of seed"),
        (["--ignore", "sede"], "--ignore sede is not an override key of any job; did you mean "
         "seed?"),
    ],
)  # fmt: skip
def test_report_keys_that_no_job_has_are_one_line(run_folder, option, message, tmp_path, capsys):
    out = tmp_path / "report"
    assert report.main([str(run_folder), *option, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sam-report: error: {message}") and err.count("\n") == 1
    assert not out.exists()  # nothing written


def test_report_keys_that_exist_are_tabulated(run_folder, tmp_path):
    out = tmp_path / "report"
    assert report.main([str(run_folder), "--metric", "train_loss", "--ignore", "seed",
                        "--out", str(out)]) == 0  # fmt: skip
    assert "train_loss_mean" in (out / "report.csv").read_text()


def test_sweep_lines_report_of_a_missing_folder_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        lines_main(["--report", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"sam-sweep-lines: error: --report {tmp_path / 'nope'}: no such folder")


# ---------------------------------------------------------------------------- #42, item 1
BAD_RUNS = [
    (["~optimizer"], "~optimizer removes optimizer, which the runner reads; set a value"),
    (["~trainer.epochs"], "~trainer.epochs removes trainer.epochs, which the runner reads"),
    (["optimizer.rho=${nope}"], "optimizer.rho=${nope}: Interpolation key 'nope' not found"),
    (["metrics.hessian.k=1000000"], "metrics.hessian.k=1000000 must be at most "
     "metrics.hessian.max_iter=100"),
    (["seed=" + "1" * 5000], "seed=111111111111... holds a number of 5000 digits; Hydra parses "
     "numbers of at most 4300 digits"),
    (["hydra.run.dir=''"], "hydra.run.dir='' is empty, which would write into the current "
     "folder"),
    (["hydra.run.dir="], "hydra.run.dir= is empty"),
    (["trainer.objective=val_acc"], "trainer.objective=val_acc is measured on a validation "
     "split, and dataset.val_split=0: set dataset.val_split"),
    (["trainer.steps=10", "trainer.epochs=3"], "trainer.steps=10 and trainer.epochs=3 are both "
     "given, and a run trains for one budget"),
    (["-m", "seed=range(0,0)"], "seed=range(0,0) sweeps no value; give at least one"),
    (["-m", "optimizer=sam,sam"], "optimizer=sam,sam lists optimizer=sam twice (duplicates"),
    (["-m", "optimizer.rho=0.05,0.050"], "optimizer.rho=0.05,0.050 lists optimizer.rho=0.05 "
     "twice"),
    (["-m", "optimizer=sam,gear_sam", "optimizer.beta=0.5"], "optimizer.beta is not a key of "
     "optimizer=sam; choose one of rho"),
    (["-m", "hparams_search=sam_rho_lr", "hydra.sweeper.n_trials=0"], "hydra.sweeper.n_trials=0 "
     "must be an integer >= 1"),
    (["-m", "hparams_search=sam_rho_lr", "hydra.sweeper.n_trials=-1"], "hydra.sweeper.n_trials=-1 "
     "must be an integer >= 1"),
]  # fmt: skip


@pytest.mark.parametrize("argv, message", BAD_RUNS, ids=[" ".join(a)[:40] for a, _ in BAD_RUNS])
def test_bad_inputs_of_42_are_refused_before_anything_runs(argv, message):
    found, _ = check_jobs(args_parser().parse_args(argv))
    assert found is not None and found.startswith(message), found
    assert "\n" not in found


def test_keys_the_user_added_may_be_removed_and_good_sweeps_pass():
    for argv in (["-m", "seed=0,1", "optimizer.rho=0.05,0.1"], ["trainer.steps=10"],
                 ["trainer.objective=val_acc", "dataset.val_split=0.1"],
                 ["metrics.hessian.k=3", "metrics.hessian.max_iter=3"]):  # fmt: skip
        assert check_jobs(args_parser().parse_args(argv))[0] is None, argv


@pytest.mark.parametrize("argv", [["~optimizer"], ["optimizer.rho=${nope}"], ["hydra.run.dir="],
                                  ["-m", "optimizer=sam,sam"]])  # fmt: skip
def test_sam_run_refuses_them_in_one_line_exit_2_writing_nothing(argv, tmp_path, capsys,
                                                                 monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("sam-run: error: "), err
    assert list(tmp_path.iterdir()) == []


def _main_of(command: str):
    from sam_runner.evaluation.cli import main as eval_main
    from sam_runner.landscape.cli import main as landscape_main
    from sam_runner.results.index import main as index_main

    return {"sam-eval": eval_main, "sam-report": report.main, "sam-index": index_main,
            "sam-landscape": landscape_main, "sam-sweep-lines": lines_main}[command]  # fmt: skip


def _call(command: str, argv: list[str]) -> int:
    """A command's main in this process, its exit status (0 for a sam-sweep-lines that returns)."""
    try:
        return _main_of(command)(argv) or 0
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("command", ["sam-eval", "sam-report", "sam-index", "sam-landscape"])
def test_a_name_longer_than_the_file_system_allows_is_one_line(command, tmp_path, capsys):
    long = tmp_path / ("a" * 300) / "run"
    assert _call(command, [str(long)]) == 2
    err = capsys.readouterr().err
    assert err == (f"{command}: error: {long}: its name {'a' * 20}... is 300 bytes long, and a "
                   "file or folder name is at most 255; use a shorter one\n")  # fmt: skip


def test_sam_index_csv_into_a_place_that_cannot_be_written_is_one_line(run_folder, tmp_path,
                                                                       capsys):  # fmt: skip
    db, blocker = tmp_path / "r.sqlite", tmp_path / "a_file"
    blocker.write_text("")  # a file where a folder should be (root writes any read-only folder)
    assert _call("sam-index", [str(run_folder), "--db", str(db)]) == 0
    capsys.readouterr()
    assert _call("sam-index", ["--db", str(db), "--query", "SELECT 1", "--csv",
                               str(blocker / "out.csv")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith(f"sam-index: error: --csv {blocker / 'out.csv'} cannot be written (")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "argv, message",
    [(["optimizer=gearsam,sam"], "optimizer=gearsam is unknown (did you mean gear_sam?)"),
     (["optimizer=sam,sam"], "optimizer=sam,sam lists optimizer=sam twice"),
     (["~optimizer"], "~optimizer removes optimizer"),
     (["--report", ".", "--jobs", "-1"], "--jobs -1 must be an integer >= 1")],
)  # fmt: skip
def test_sweep_lines_refuses_what_sam_run_m_refuses(argv, message, capsys):
    assert _call("sam-sweep-lines", argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sam-sweep-lines: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize(
    "command", ["sam-run", "sam-eval", "sam-report", "sam-index", "sam-landscape",
                "sam-sweep-lines"])  # fmt: skip
def test_every_command_says_its_version(command, capsys):
    from sam_runner import __version__

    if command == "sam-run":
        code, out, _ = run_cli(["--version"], capsys)
    else:
        code, out = _call(command, ["--version"]), capsys.readouterr().out
    assert code == 0 and out == f"sam-runner {__version__}\n"


@pytest.mark.parametrize(
    "argv, message",
    [(["--cfg", "job", "optimizer=nope"], "optimizer=nope is unknown; choose one of asam"),
     (["--help", "optimizer=nope"], "optimizer=nope is unknown; choose one of asam"),
     (["--cfg", "job", "trainer.epoch=1"], "trainer.epoch is not a key of trainer=default; did you "
      "mean trainer.epochs?"),
     (["--config-name=nope"], "--config-name=nope: no config nope.yaml in "),
     (["--config-dir=/nonexistent"], "--config-dir=/nonexistent: no such folder"),
     (["--config-path=/nonexistent"], "--config-path=/nonexistent: no such folder")],
)  # fmt: skip
def test_hydras_own_errors_are_one_line_exit_2(argv, message, capsys):
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"sam-run: error: {message}"), err


def test_cfg_still_prints_a_config_whose_values_a_run_refuses(capsys):
    code, out, _ = run_cli(["--cfg", "job", "trainer.epochs=0"], capsys)
    assert code == 0 and "epochs: 0" in out


def test_report_counts_a_folder_given_twice_or_inside_another_once(run_folder, tmp_path):
    import csv
    import shutil

    sweep = tmp_path / "sweep"
    for job in ("0", "1"):
        shutil.copytree(run_folder, sweep / job)
    for folders in ([sweep, sweep], [sweep, sweep / "0"], [sweep / "1", sweep], [sweep, tmp_path
                    / "." / "sweep"]):  # fmt: skip
        out = tmp_path / "report"
        assert report.main([*map(str, folders), "--out", str(out)]) == 0
        rows = list(csv.DictReader((out / "report.csv").open()))
        assert [(r["jobs"], r["test_acc_n"]) for r in rows] == [("2", "2")], folders  # once each
        assert "given too: its jobs are counted once" in (out / "report.md").read_text()


def test_sam_eval_without_arguments_names_the_folder_alone(capsys):
    assert _call("sam-eval", []) == 2
    assert capsys.readouterr().err == (
        "sam-eval: error: no folder given: sam-eval PATH [KEY=VALUE ...] (a run or sweep folder)\n"
    )


# ---------------------------------------------------------------------------- #42, item 3
def test_the_console_prints_lambda_max_in_one_format_and_the_averaged_weights(capsys):
    from sam_runner.progress import Progress, print_final

    row = {
        "epoch": 3,
        "train_loss": 0.5,
        "train_acc": 0.8,
        "test_acc": 0.75,
        "test_ece": 0.05,
        "lambda_max": 41.0,
        "avg_test_acc": 0.7712,
        "avg_test_ece": 0.0412,
        "time_s": 2.0,
    }
    Progress("lines", 5, 10).epoch_line(row)
    Progress("lines", 5, 10).epoch_line({**row, "lambda_max": 59.4567})  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("epoch 3/5 | train_loss 0.5000 | train_acc 0.8000 | test_acc 0.7500 | "
                      "test_ece 0.0500 | lambda_max 41.00 | avg_test_acc 0.7712 | "
                      "avg_test_ece 0.0412 | elapsed 2.0s")  # fmt: skip
    assert "lambda_max 59.46 |" in err[1]
    print_final(
        {
            "status": "completed",
            "test_acc": 0.75,
            "test_ece": 0.05,
            "lambda_max": 41.0,
            "avg_test_acc": 0.7712,
            "avg_test_ece": 0.0412,
            "avg_lambda_max": 30.0,
        },
        "R",
    )
    print_final({"status": "completed", "test_acc": 0.75, "test_ece": 0.05, "lambda_max": 7}, "R")
    assert capsys.readouterr().out.splitlines() == [
        "completed: test_acc=0.750 test_ece=0.050 lambda_max=41.0 avg_test_acc=0.771 "
        "avg_test_ece=0.041 avg_lambda_max=30.0  (R)",
        "completed: test_acc=0.750 test_ece=0.050 lambda_max=7.00  (R)",
    ]


@pytest.mark.parametrize("fmt", ["pdf", "svg", "png"])
def test_report_md_shows_pngs_and_links_pdfs_and_svgs(run_folder, fmt, tmp_path):
    import re

    out = tmp_path / "report"
    assert report.main([str(run_folder), f"plots.format={fmt}", "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    figures = sorted(p.name for p in out.iterdir() if p.suffix == f".{fmt}")
    assert figures
    for name in figures:
        stem = name.rsplit(".", 1)[0]
        shown, linked = f"![{stem}]({name})", f"[{stem} ({fmt.upper()})]({name})"
        assert (shown if fmt == "png" else linked) in md, name
    assert bool(re.search(r"!\[[^]]*\]\([^)]*\.(pdf|svg)\)", md)) is False


@pytest.mark.parametrize(
    "argv, note",
    [(["trainer.ema_decay=0.9"], "trainer.ema_decay=0.9 does nothing without "
      "trainer.weight_averaging=ema: the run trains as without it"),
     (["trainer.swa_start=3"], "trainer.swa_start=3 does nothing without "
      "trainer.weight_averaging=swa"),
     (["model.reset_head=true"], "model.reset_head=true does nothing without "
      "model.init_from=RUN_DIR"),
     (["experiment=edge_of_stability_mini"], "experiment=edge_of_stability_mini is a sweep ("),
     (["trainer.precision=fp16"], "trainer.precision=fp16 on a CPU is 4-10x slower than fp32")],
)  # fmt: skip
def test_settings_that_do_nothing_are_a_notice(argv, note):
    message, notes = check_jobs(args_parser().parse_args(argv))
    assert message is None and any(n.startswith(note) for n in notes), notes


def test_settings_that_act_are_no_notice_and_a_key_hydra_lacks_is_refused():
    for argv in (["trainer.weight_averaging=ema", "trainer.ema_decay=0.9"],
                 ["-m", "experiment=edge_of_stability_mini"]):  # fmt: skip
        message, notes = check_jobs(args_parser().parse_args(argv))
        assert message is None and not any("does nothing" in n or "is a sweep" in n for n in notes)
    message, _ = check_jobs(args_parser().parse_args(["+hydra.foo=1"]))
    assert message.startswith("hydra.foo is not a key; choose one of run, sweep")


# ---------------------------------------------------------------------------- #42, item 1: the rest
def _a_run_folder(folder):
    """A folder sam-eval and sam-landscape take for a run (its summary.json): they refuse these
    inputs before reading anything else of it."""
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text('{"status": "completed"}')
    return folder


LAST = [
    ("sam-run", ["dataset=mnist1d", "dataset.augment=cutout"], "dataset.augment=cutout acts on "
     "images, and dataset=mnist1d (1-D signals of length 40) is not augmented (only cifar10, "
     "cifar100, cifar100_lt, image_folder are); use dataset.augment=none"),
    ("sam-run", ["dataset=digits", "dataset.augment=autoaugment"], "dataset.augment=autoaugment "
     "acts on images, and dataset=digits (8×8 images) is not augmented"),
    ("sam-run", ["scheduler=multistep", "scheduler.milestones=[5,2]"], "scheduler.milestones="
     "[5, 2] must be increasing epochs, each later than the one before, e.g. [2, 5]"),
    ("sam-run", ["scheduler=multistep", "scheduler.milestones=[2,2,4]"], "scheduler.milestones="
     "[2, 2, 4] must be increasing epochs"),
    ("sam-eval", ["{run}", "+foo=1"], "foo is not a key; sam-eval's keys are metrics.*, eval.*, "
     "trainer.* (a key added with + must be one sam-eval reads)"),
    ("sam-eval", ["{run}", "+metrics.hessian.kk=2"], "metrics.hessian.kk is not a key; did you "
     "mean metrics.hessian.k? (a key added with + must be one sam-eval reads)"),
    ("sam-landscape", ["{run}", "+landscape.pointz=3"], "landscape.pointz is not a key; did you "
     "mean landscape.points?"),
    ("sam-landscape", ["{run}", "landscape.to={run}"], "landscape.to='{run}' is the run itself "
     "({run}): the line between a run and itself is one point; give another run's folder"),
    ("sam-landscape", ["{run}", "--to", "{run}/."], "landscape.to='{run}' is the run itself"),
]  # fmt: skip


@pytest.mark.parametrize("command, argv, message", LAST,
                         ids=[f"{c} {' '.join(a)}"[:50] for c, a, _ in LAST])  # fmt: skip
def test_the_last_bad_inputs_of_42_are_one_line_exit_2_writing_nothing(command, argv, message,
                                                                       tmp_path, capsys,
                                                                       monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    run = _a_run_folder(tmp_path / "run")
    argv, message = [a.replace("{run}", str(run)) for a in argv], message.replace("{run}", str(run))
    before = sorted(tmp_path.rglob("*"))
    if command == "sam-run":
        code, _, err = run_cli(argv, capsys)
    else:
        code, err = _call(command, argv), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"{command}: error: {message}"), err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("argv", [["scheduler=multistep", "scheduler.milestones=[2,5]"],
                                  ["optimizer.rho=0.1", "optimizer.rho=0.1", "seed=1"],
                                  ["dataset=cifar10", "dataset.augment=cutout"]])  # fmt: skip
def test_milestones_in_order_a_key_given_once_and_cutout_on_images_pass(argv):
    message, notes = check_jobs(args_parser().parse_args(argv))
    assert message is None and not any("given twice" in n for n in notes), notes


@pytest.mark.parametrize(
    "argv, note",
    [(["optimizer.rho=0.1", "optimizer.rho=0.2"], "optimizer.rho is given twice "
      "(optimizer.rho=0.1 and optimizer.rho=0.2): the last counts, optimizer.rho=0.2"),
     (["-m", "seed=0,1", "seed=2"], "seed is given twice (seed=0,1 and seed=2): the last counts, "
      "seed=2"),
     (["optimizer=sam", "optimizer=base"], "optimizer is given twice (optimizer=sam and "
      "optimizer=base): the last counts, optimizer=base")],
)  # fmt: skip
def test_a_key_given_twice_with_a_plain_value_is_a_notice_naming_the_one_that_counts(argv, note):
    """Not refused (as a key swept twice is): setting one key again after a list of shared
    settings is how scripts (and these tests' tiny budgets) override it."""
    message, notes = check_jobs(args_parser().parse_args(argv))
    assert message is None and note in notes, (message, notes)


def test_a_stage_sweep_sets_again_a_key_of_its_stage_without_a_notice(monkeypatch):
    """A stage's sweep: the stage's keys, then the user's, who may set one of them again."""
    from sam_runner.sweep import stages

    monkeypatch.setattr(stages, "current", "a")  # what staged.run sets while a stage runs
    _, notes = check_jobs(args_parser().parse_args(["trainer.epochs=2", "trainer.epochs=3"]))
    assert not any("given twice" in n for n in notes)


@pytest.mark.parametrize(
    "argv, note",
    [(["dataset.augment=true"], "dataset.augment=true does nothing on dataset=mnist1d, which is "
      "not augmented: the run trains as without it"),
     (["trainer.eval_every_n_steps=100", "trainer.eval_every_n_epochs=2"],
      "trainer.eval_every_n_epochs=2 does nothing with trainer.eval_every_n_steps=100: the steps "
      "decide when a run evaluates")],
)  # fmt: skip
def test_the_last_settings_that_do_nothing_are_a_notice(argv, note):
    message, notes = check_jobs(args_parser().parse_args(argv))
    assert message is None and note in notes, notes


@pytest.mark.parametrize("argv", [["dataset=cifar10", "dataset.augment=true"],
                                  ["trainer.eval_every_n_steps=100"]])  # fmt: skip
def test_the_same_settings_where_they_act_are_no_notice(argv):
    message, notes = check_jobs(args_parser().parse_args(argv))
    assert message is None and not any("does nothing" in n for n in notes), notes


@pytest.mark.parametrize("every, said", [(3, True), (6, True), (7, False)])
def test_eval_every_n_steps_within_an_epoch_is_a_notice_as_the_run_starts(every, said, tmp_path,
                                                                          capsys):  # fmt: skip
    from sam_runner.train import Run

    cfg = compose(*TINY, f"trainer.eval_every_n_steps={every}")  # 800 examples / 128: 6 steps
    run = Run(cfg, tmp_path / "run", [])
    run.setup()  # the run's own setup: data, model, the lengths (no epoch is trained)
    assert run.loop.steps_per_epoch == 6
    err = capsys.readouterr().err
    note = (
        f"sam-run: warning: trainer.eval_every_n_steps={every} is at most the 6 steps of an "
        "epoch, and a run evaluates at epoch ends: every epoch is evaluated, as without it\n"
    )
    assert (note in err) is said, err


def test_eval_workers_beyond_the_cores_are_capped_with_one_line(tmp_path, capsys):
    from sam_runner.evaluation.settings import compose_eval, usable_cores

    cores = usable_cores()
    cfg = compose_eval(["eval.workers=1000"], tmp_path)
    assert cfg.eval.workers == cores
    assert capsys.readouterr().err == (
        f"sam-eval: warning: eval.workers=1000 is more than the {cores} CPU core(s) this process "
        f"may use: capped at {cores} worker process(es)\n"
    )
    assert compose_eval([f"eval.workers={cores}"], tmp_path).eval.workers == cores
    assert capsys.readouterr().err == ""
