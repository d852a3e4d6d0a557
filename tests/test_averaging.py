"""trainer.weight_averaging (SWA, EMA) and model.init_from: against torch.optim.swa_utils fed the
same weights, exact resume, starting from a finished run's weights, and the bad inputs."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose, run_cli, stopped_early_of
from torch.optim.swa_utils import AveragedModel, update_bn

from sam_runner.data import build_data
from sam_runner.errors import UserError
from sam_runner.models import build_model, load_initial_weights
from sam_runner.train import train

# digits, a small CNN, a constant learning rate: a shorter run is the prefix of a longer one
SMALL = [
    "dataset=digits",
    "model=cnn",
    "model.channels=4",
    "scheduler=constant",
    "optimizer=base",
    "metrics.hessian.enabled=false",
    "trainer.progress=none",
]


def weights(run_dir, name="last.pt"):
    return torch.load(run_dir / "checkpoints" / name, weights_only=True)


def rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time_s"} for line in lines]


def fed(states, **average):
    """An AveragedModel fed ``states`` (model state dicts) in order."""
    cfg = compose(*SMALL)
    model = build_model(cfg.model, (1, 8, 8), 10)
    averaged = AveragedModel(model, use_buffers=False, **average)
    for state in states:
        model.load_state_dict(state)
        averaged.update_parameters(model)
    return averaged


def test_swa_equals_averaged_model_fed_the_epoch_end_weights_and_bn_is_recomputed(tmp_path):
    swa = [*SMALL, "trainer.weight_averaging=swa", "trainer.swa_start=1"]
    for epochs in (1, 2, 3):
        train(compose(*swa, f"trainer.epochs={epochs}"), tmp_path / str(epochs), [])
    saved = weights(tmp_path / "3", "averaged.pt")
    assert (saved["kind"], saved["n_averaged"], saved["epoch"]) == ("swa", 3, 3)
    averaged = fed([weights(tmp_path / str(e))["model"] for e in (1, 2, 3)])
    for name, p in averaged.module.named_parameters():
        assert torch.allclose(saved["model"][name], p, atol=1e-6), name
    # BatchNorm statistics: update_bn over the un-augmented training set
    data = build_data(compose(*swa).dataset, torch.device("cpu"), 0)
    update_bn(data.train_plain, averaged.module)
    for name, b in averaged.module.named_buffers():
        assert torch.allclose(saved["model"][name].float(), b.float(), atol=1e-5), name
    assert set(saved["model"]) == set(weights(tmp_path / "3")["model"])  # plain module keys
    summary = json.loads((tmp_path / "3" / "summary.json").read_text())
    assert summary["avg_test_acc"] is not None and summary["avg_test_ece"] is not None
    last_row = rows(tmp_path / "3")[-1]
    assert summary["avg_test_acc"] == last_row["avg_test_acc"]
    # the lr: SWALR from epoch 1, annealed to swa_lr within the first epoch
    assert last_row["lr"] == pytest.approx(0.05)


def test_ema_equals_its_recurrence_step_by_step(tmp_path):
    ema = [*SMALL, "trainer.weight_averaging=ema", "trainer.ema_decay=0.5"]
    ema.append("trainer.ema_warmup=false")  # the plain recurrence
    for steps in (1, 2, 3):
        train(compose(*ema, f"trainer.steps={steps}"), tmp_path / str(steps), [])
    w = [weights(tmp_path / str(s))["model"] for s in (1, 2, 3)]
    saved = weights(tmp_path / "3", "averaged.pt")
    assert (saved["kind"], saved["n_averaged"], saved["step"]) == ("ema", 3, 3)
    model = build_model(compose(*SMALL).model, (1, 8, 8), 10)
    for name, _ in model.named_parameters():
        expected = 0.5 * (0.5 * w[0][name] + 0.5 * w[1][name]) + 0.5 * w[2][name]
        assert torch.allclose(saved["model"][name], expected, atol=1e-6), name


def test_ema_warmup_follows_its_decays_in_a_run(tmp_path):
    ema = [*SMALL, "trainer.weight_averaging=ema", "trainer.ema_decay=0.5"]  # warm-up: default
    for steps in (1, 2, 3):
        train(compose(*ema, f"trainer.steps={steps}"), tmp_path / str(steps), [])
    w = [weights(tmp_path / str(s))["model"] for s in (1, 2, 3)]
    saved = weights(tmp_path / "3", "averaged.pt")
    d1, d2 = 2 / 11, 3 / 12  # min(0.5, (1 + t)/(10 + t)) for t = 1, 2
    model = build_model(compose(*SMALL).model, (1, 8, 8), 10)
    for name, _ in model.named_parameters():
        expected = d2 * (d1 * w[0][name] + (1 - d1) * w[1][name]) + (1 - d2) * w[2][name]
        assert torch.allclose(saved["model"][name], expected, atol=1e-6), name


def first_step_share(*overrides: str, steps: int) -> float:
    """The first step's weight in the EMA after ``steps`` updates: w = 1 at the first, 0 after."""
    from sam_runner.averaging import build_averaging
    from sam_runner.clock import Clock

    model = torch.nn.Linear(1, 1, bias=False)
    clock = Clock()
    clock.total_steps = steps
    run = compose(*SMALL, "trainer.weight_averaging=ema", *overrides)
    ema = build_averaging(run, model, None, clock, [], None)
    for step in range(steps):
        with torch.no_grad():
            model.weight.fill_(1.0 if step == 0 else 0.0)
        ema.after_step(step + 1)
    return float(ema.averaged.module.weight.detach())


def test_ema_warmup_lets_the_first_steps_fade_within_a_short_run(capsys):
    # swa_vs_sam_mini's 176 steps at the default decay 0.999
    plain = first_step_share("trainer.ema_warmup=false", steps=176)
    assert plain == pytest.approx(0.999**175, rel=1e-5)  # 0.84: the plain recurrence
    assert first_step_share(steps=176) < 1e-3  # warmed up: the product of (1 + t)/(10 + t)
    err = capsys.readouterr().err
    assert err.count("sam-run: notice: trainer.ema_decay=0.999 averages over ~1000 steps") == 2
    assert "the first step keeps 0.84 of the final average" in err
    first_step_share(steps=4000)  # 1000 <= 4000 / 4: no notice
    assert "notice" not in capsys.readouterr().err


def test_a_run_stopped_and_resumed_with_swa_ends_like_an_uninterrupted_one(tmp_path):
    swa = [*SMALL, "trainer.weight_averaging=swa", "trainer.swa_start=2"]
    train(compose(*swa, "trainer.epochs=3"), tmp_path / "whole", [])
    train(compose(*swa, "trainer.epochs=2"), tmp_path / "split", [])
    stopped_early_of(tmp_path / "split", 3)
    train(compose(*swa, "trainer.epochs=3"), tmp_path / "split", [])
    assert rows(tmp_path / "split") == rows(tmp_path / "whole")
    a, b = (weights(tmp_path / d, "averaged.pt") for d in ("split", "whole"))
    assert a["n_averaged"] == b["n_averaged"] == 2
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])


def test_a_run_stopped_and_resumed_with_ema_ends_like_an_uninterrupted_one(tmp_path):
    ema = [*SMALL, "trainer.weight_averaging=ema", "trainer.ema_decay=0.9"]
    train(compose(*ema, "trainer.epochs=3"), tmp_path / "whole", [])
    train(compose(*ema, "trainer.epochs=2"), tmp_path / "split", [])
    stopped_early_of(tmp_path / "split", 3)
    train(compose(*ema, "trainer.epochs=3"), tmp_path / "split", [])
    assert rows(tmp_path / "split") == rows(tmp_path / "whole")
    a, b = (weights(tmp_path / d, "averaged.pt") for d in ("split", "whole"))
    assert a["n_averaged"] == b["n_averaged"] == rows(tmp_path / "whole")[-1]["step"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])


def test_cyclic_swa_rate_falls_from_high_to_low_each_epoch_and_resumes_exactly(tmp_path):
    from sam_runner.averaging import CyclicSWASchedule, build_averaging
    from sam_runner.clock import Clock

    swa = [*SMALL, "trainer.weight_averaging=swa", "trainer.swa_start=2"]
    swa += ["trainer.swa_lr=[0.1,0.01]", "base_optimizer.lr=0.05"]
    train(compose(*swa, "trainer.epochs=3"), tmp_path / "whole", [])
    train(compose(*swa, "trainer.epochs=2"), tmp_path / "split", [])
    stopped_early_of(tmp_path / "split", 3)
    train(compose(*swa, "trainer.epochs=3"), tmp_path / "split", [])
    whole = rows(tmp_path / "whole")
    assert rows(tmp_path / "split") == whole
    c = whole[0]["step"]  # steps per epoch
    # a line logs the rate of the next step: the first of a cycle, from epoch 2 on
    first = (1 - 1 / c) * 0.1 + 0.01 / c
    assert all(r["lr"] == pytest.approx(first, rel=1e-12) for r in whole)
    # the rates of epoch 2's steps, read off a real optimizer stepped as the run steps it
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run = compose(*swa, "trainer.epochs=3")
    clock = Clock()
    swa_part = build_averaging(run, model, opt, clock, [], None)
    schedule = CyclicSWASchedule(swa_part, torch.optim.lr_scheduler.StepLR(opt, 1, gamma=1.0), c)
    used = []
    for _ in range(3 * c):
        used.append(opt.param_groups[0]["lr"])
        opt.step()  # no gradients: nothing moves, but the step order is the run's
        schedule.step()
        clock.step += 1
    assert used[:c] == [0.05] * c  # epoch 1: the run's own schedule
    for epoch in (1, 2):
        cycle = used[epoch * c : (epoch + 1) * c]
        assert cycle == pytest.approx([(1 - j / c) * 0.1 + j / c * 0.01 for j in range(1, c + 1)])
    assert used[-1] == pytest.approx(0.01)  # SWA averages the weights of a low-rate step
    saved = weights(tmp_path / "whole", "averaged.pt")
    assert (saved["kind"], saved["n_averaged"]) == ("swa", 2)


def test_sam_report_puts_the_averaged_weights_beside_the_last_ones(tmp_path):
    from sam_runner.results.report import render_markdown
    from sam_runner.results.sweep import build_report

    for name, extra in (("swa", ["trainer.weight_averaging=swa"]), ("plain", [])):
        train(compose(*SMALL, "trainer.epochs=2", *extra), tmp_path / name, [])
    summary = json.loads((tmp_path / "swa" / "summary.json").read_text())
    report = build_report([tmp_path / "swa", tmp_path / "plain"])
    text = render_markdown(report, [])
    table = text.split("## Averaged weights")[1].split("\n\n")[1].splitlines()
    assert len(table) == 3  # the header, its rule and the one group that averaged
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[1] == "swa"
    assert cells[2:4] == [f"{summary['test_acc']:.4g}", f"{summary['avg_test_acc']:.4g}"]
    assert cells[4:6] == [f"{summary['test_ece']:.4g}", f"{summary['avg_test_ece']:.4g}"]


def test_init_from_a_finished_run_reproduces_its_test_accuracy_and_reset_head(tmp_path):
    src = tmp_path / "src"
    done = train(compose(*SMALL, "trainer.epochs=1"), src, [])
    cfg = compose(*SMALL, f"model.init_from={src}")
    data = build_data(cfg.dataset, torch.device("cpu"), 0)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    record = load_initial_weights(cfg.model, model)
    assert record["kind"] == "checkpoint" and record["path"].endswith("last.pt")
    model.eval()  # an evaluation before training (step 0)
    correct = sum(int((model(x).argmax(1) == y).sum()) for x, y, _ in data.test)
    assert correct / len(data.test.y) == pytest.approx(done["test_acc"])
    # another class count: the classifier afresh (as the seed initialises it), the rest loaded
    head = compose(
        *SMALL, f"model.init_from={src / 'checkpoints' / 'last.pt'}", "model.reset_head=true"
    )
    torch.manual_seed(0)
    fresh = build_model(head.model, (1, 8, 8), 5)
    torch.manual_seed(0)
    five = build_model(head.model, (1, 8, 8), 5)
    load_initial_weights(head.model, five)
    trained = weights(src)["model"]
    for k, v in five.state_dict().items():
        expected = fresh.state_dict()[k] if k.startswith("head.2.") else trained[k]
        assert torch.equal(v, expected), k
    # a plain state_dict file; summary.json records where the weights came from
    plain = tmp_path / "plain.pt"
    torch.save(trained, plain)
    started = train(
        compose(*SMALL, "trainer.epochs=1", f"model.init_from={plain}"), tmp_path / "ft", []
    )
    assert started["init_from"]["kind"] == "state_dict" and started["init_from"]["path"] == str(
        plain
    )


def test_init_from_that_does_not_fit_names_the_first_tensor(tmp_path):
    src = tmp_path / "src"
    train(compose(*SMALL, "trainer.epochs=1"), src, [])
    cfg = compose(*SMALL, "model.channels=8", f"model.init_from={src}")
    with pytest.raises(UserError) as e:
        load_initial_weights(cfg.model, build_model(cfg.model, (1, 8, 8), 10))
    assert "stem.0.weight is [4, 1, 3, 3] there and [8, 1, 3, 3] here" in str(e.value)
    assert "reset_head" not in str(e.value)  # the head is not what differs
    assert "another width or architecture" in str(e.value)
    # another class count: the classifier differs, and reset_head is the way out
    with pytest.raises(UserError) as e:
        same = compose(*SMALL, f"model.init_from={src}").model
        load_initial_weights(same, build_model(same, (1, 8, 8), 3))
    assert "(another class count: model.reset_head=true)" in str(e.value)


BAD = [
    (["dataset.augment=autoaugmnet"], "'autoaugmnet' is unknown (did you mean autoaugment?)"),
    (["dataset.mixup_alpha=-1"], "dataset.mixup_alpha=-1 must be a number >= 0"),
    (["trainer.weight_averaging=swaa"], "'swaa' is unknown (did you mean swa?)"),
    (
        ["trainer.weight_averaging=swa", "trainer.swa_start=9", "trainer.epochs=3"],
        "trainer.swa_start=9 must be an epoch in [1, trainer.epochs=3]",
    ),
    (
        ["trainer.weight_averaging=ema", "trainer.ema_decay=1.0"],
        "trainer.ema_decay=1.0 must be a number in (0, 1)",
    ),
    (
        ["trainer.weight_averaging=ema", "trainer.ema_warmup=maybe"],
        "trainer.ema_warmup=maybe must be true or false",
    ),
    (
        ["trainer.weight_averaging=swa", "trainer.swa_lr=[0.01,0.1]"],
        "trainer.swa_lr=[0.01, 0.1] must be a number > 0 or a cyclic range [high, low]",
    ),
    (["model.init_from=/nowhere/run"], "model.init_from=/nowhere/run: /nowhere/run does not exist"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[b[1].split("=")[0] for b in BAD])
def test_bad_recipe_input_is_one_line_exit_2_before_anything_runs(argv, message, capsys, tmp_path):
    code, _, err = run_cli([*argv, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_sweep_with_a_mismatched_init_from_fails_before_its_first_job(capsys, tmp_path):
    src = tmp_path / "src"
    train(compose(*SMALL, "trainer.epochs=1"), src, [])
    code, _, err = run_cli(
        [
            "-m",
            *SMALL,
            "model.channels=4,8",
            f"model.init_from={src}",
            f"hydra.sweep.dir={tmp_path / 's'}",
        ],
        capsys,
    )
    assert code == 2 and "does not fit this model: stem.0.weight" in err, err
    assert not list((tmp_path / "s").glob("*/metrics.jsonl"))


def test_cifar10_autoaugment_mixup_and_swa_run_from_cifar_files(tmp_path, monkeypatch):
    """`sam-run dataset=cifar10 dataset.augment=autoaugment trainer.weight_averaging=swa` on
    files in CIFAR's real format (a small CNN for speed), MixUp on."""
    from cifar_files import install

    install(monkeypatch, tmp_path / "data", "cifar10", n_train=64, n_test=40)
    summary = train(
        compose(
            "dataset=cifar10",
            "dataset.augment=autoaugment",
            "dataset.mixup_alpha=0.2",
            "trainer.weight_averaging=swa",
            f"dataset.data_dir={tmp_path / 'data'}",
            "dataset.batch_size=16",
            "model=cnn",
            "model.channels=4",
            "trainer.epochs=2",
            "metrics.hessian.num_samples=32",
            "metrics.hessian.max_iter=5",
            "trainer.progress=none",
        ),
        tmp_path / "run",
        [],
    )
    assert summary["status"] == "completed" and 0 <= summary["test_acc"] <= 1
    assert summary["avg_test_acc"] is not None and summary["avg_lambda_max"] is not None
    assert weights(tmp_path / "run", "averaged.pt")["n_averaged"] == 1  # swa_start: epoch 2


def test_the_run_folder_name_says_where_the_weights_came_from():
    from sam_runner.sweep.plan import folder_name

    name = folder_name(["model.init_from=/runs/a", "model.reset_head=true"])
    assert name == "model.init_from-_runs_a__model.reset_head-true"
