"""trainer.distill: the loss against a direct computation, one teacher forward per step whatever
the variant, weight 0 bit for bit the plain run, the teacher's folder only read, the alignment,
exact resume, and bad input (one line, exit 2, nothing written)."""

import hashlib
import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, compose, run_cli, stopped_early_of
from torch import nn

from sam_runner.distill import Taps, similarity
from sam_runner.losses import (
    distillation_loss,
    distillation_loss_to,
    distillation_targets,
    select_targets,
)
from sam_runner.train import train

FAST = [*TINY, "metrics=off", "trainer.epochs=1"]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_distillation_loss_is_t_squared_kl_teacher_to_student_batch_mean(temperature):
    g = torch.Generator().manual_seed(0)
    s, t = (3 * torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(2))
    want = 0.0
    for row_s, row_t in zip(s.tolist(), t.tolist()):
        zs = sum(math.exp(v / temperature) for v in row_s)
        zt = sum(math.exp(v / temperature) for v in row_t)
        ps = [math.exp(v / temperature) / zs for v in row_s]
        pt = [math.exp(v / temperature) / zt for v in row_t]
        want += temperature**2 * sum(a * math.log(a / b) for a, b in zip(pt, ps))
    got = distillation_loss(s, t, temperature)
    assert got.item() == pytest.approx(want / 6, rel=1e-12)
    assert distillation_loss(s, s, temperature).abs().item() < 1e-14
    half = distillation_loss(s.half(), t.half(), temperature)
    assert half.dtype == torch.float32 and half.item() == pytest.approx(want / 6, rel=1e-2)


@pytest.mark.parametrize("temperature", [1.0, 3.0, 4.0])
def test_the_teacher_s_targets_computed_once_give_the_kl_s_gradient_bit_for_bit(temperature):
    # what a step reuses across its passes (the teacher's soft targets, its entropy) against
    # the KL summed directly: the student's gradient is the same to the last bit
    g = torch.Generator().manual_seed(2)
    s, t = 3 * torch.randn(64, 10, generator=g), 3 * torch.randn(64, 10, generator=g)

    def direct(v):
        log_t = F.log_softmax(t / temperature, 1)
        kl = (log_t.exp() * (log_t - F.log_softmax(v / temperature, 1))).sum(1)
        return temperature**2 * kl.mean()

    def reused(v):
        return distillation_loss_to(v, distillation_targets(t, temperature), temperature)

    grads = []
    for loss in (direct, reused):
        v = s.clone().requires_grad_()
        value = loss(v)
        (0.3 * value).backward()
        grads.append((value.detach(), v.grad))
    (v_direct, g_direct), (v_reused, g_reused) = grads
    assert torch.equal(g_direct, g_reused)
    assert v_reused.item() == pytest.approx(v_direct.item(), rel=1e-6)


def test_the_targets_of_some_rows_are_the_loss_of_those_rows_alone():
    # ESAM's descent pass: the student's kept rows against their own teacher rows
    g = torch.Generator().manual_seed(2)
    s, t = (3 * torch.randn(8, 5, generator=g, dtype=torch.float64) for _ in range(2))
    rows = torch.tensor([1, 4, 6])
    got = distillation_loss_to(s[rows], select_targets(distillation_targets(t, 2.0), rows), 2.0)
    assert got.item() == pytest.approx(distillation_loss(s[rows], t[rows], 2.0).item(), rel=1e-12)


def test_the_alignment_taps_the_middle_layer_and_the_embedding_and_is_zero_for_the_same_model():
    net = nn.Sequential(nn.Conv1d(1, 4, 3), nn.ReLU(), nn.Conv1d(4, 6, 3), nn.ReLU(),
                        nn.Conv1d(6, 5, 3), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                        nn.Linear(5, 3))  # fmt: skip
    taps = Taps(net)
    x = torch.randn(8, 1, 12, generator=torch.Generator().manual_seed(1))
    with taps.on() as features:
        net(x)
    assert set(features) == {"middle", "embedding"}
    torch.testing.assert_close(features["middle"], net[:3](x).mean(2))  # the middle conv's
    torch.testing.assert_close(features["embedding"], net[:7](x))  # the head's input
    sim = similarity(features["embedding"])
    assert sim.shape == (8, 8) and torch.allclose(sim.diagonal(), torch.ones(8))
    with taps.on(False) as nothing:
        net(x)
    assert nothing == {}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    path = tmp_path_factory.mktemp("teacher") / "run"
    train(compose(*FAST, "model=mlp", "model.hidden=[64]", "optimizer=base"), path, [])
    return path


def _digest(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def _model(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


@pytest.mark.parametrize(
    "variant",
    [
        "optimizer=base",
        "optimizer=sam",
        "optimizer=gsam",
        "optimizer=esam",
        "trainer.precision=bf16",
    ],  # fmt: skip
)  # esam: its descent pass runs on some rows of each micro-batch, their teacher targets with them
def test_one_teacher_forward_per_step_whatever_the_variant_and_its_folder_is_only_read(
    variant, teacher, tmp_path
):
    before = _digest(teacher)
    student = [*FAST, variant, f"trainer.distill.teacher={teacher}"]
    train(compose(*student, "trainer.distill.align=1", "trainer.accumulate=2"), tmp_path / "s", [])
    summary = _summary(tmp_path / "s")
    assert summary["status"] == "completed" and summary["teacher_forwards_per_step"] == 1.0
    assert _digest(teacher) == before


def test_weight_zero_is_the_plain_run_bit_for_bit_and_distillation_and_alignment_change_it(
    teacher, tmp_path
):
    runs = {}
    for name, extra in (
        ("plain", []),
        ("zero", [f"trainer.distill.teacher={teacher}", "trainer.distill.weight=0"]),
        ("kd", [f"trainer.distill.teacher={teacher}"]),
        ("aligned", [f"trainer.distill.teacher={teacher}", "trainer.distill.align=1"]),
    ):
        train(compose(*FAST, *extra), tmp_path / name, [])
        runs[name] = _model(tmp_path / name)
    same = {n: all(torch.equal(runs["plain"][k], v[k]) for k in v) for n, v in runs.items()}
    assert same == {"plain": True, "zero": True, "kd": False, "aligned": False}
    assert not all(torch.equal(runs["kd"][k], runs["aligned"][k]) for k in runs["kd"])


def test_a_distilled_run_resumes_exactly(teacher, tmp_path):
    student = [*TINY, "metrics=off", "scheduler=constant", f"trainer.distill.teacher={teacher}",
               "trainer.distill.align=0.5"]  # fmt: skip
    train(compose(*student, "trainer.epochs=2"), tmp_path / "whole", [])
    train(compose(*student, "trainer.epochs=1"), tmp_path / "split", [])
    stopped_early_of(tmp_path / "split", 2)
    train(compose(*student, "trainer.epochs=2"), tmp_path / "split", [])
    whole, split = _model(tmp_path / "whole"), _model(tmp_path / "split")
    assert all(torch.equal(whole[k], split[k]) for k in whole)


def _failed_run(tmp_path):
    path = tmp_path / "failed"
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"status": "failed", "error": "x"}))
    return path


T = "trainer.distill.teacher={teacher}"


@pytest.mark.parametrize(
    "extra,message",
    [
        (["trainer.distill.teacher={tmp}/nowhere"], "is not a folder"),
        (["trainer.distill.teacher={tmp}"], "is not a sam-run run folder"),
        (["trainer.distill.teacher={failed}"], "is not a completed run (status: failed)"),
        (
            [T, "dataset=digits"],
            "was trained on inputs (1, 40) with 10 classes, this run has (1, 8, 8)",
        ),  # fmt: skip
        (
            [T, "trainer.distill.temperature=0"],
            "trainer.distill.temperature=0 must be a finite number > 0",
        ),  # fmt: skip
        (
            [T, "trainer.distill.weight=-0.1"],
            "trainer.distill.weight=-0.1 must be a number in [0, 1]",
        ),  # fmt: skip
        ([T, "trainer.distill.align=-1"], "trainer.distill.align=-1 must be a finite number >= 0"),
        (
            [T, "trainer.distill.weights=best"],
            "trainer.distill.weights='best' is unknown; choose one of last, averaged",
        ),  # fmt: skip
    ],
    ids=[
        "missing",
        "not-a-run",
        "not-completed",
        "other-data",
        "temperature",
        "weight",
        "align",
        "weights",
    ],  # fmt: skip
)
def test_bad_distillation_input_is_one_line_exit_2_and_writes_nothing(
    extra, message, teacher, tmp_path, capsys
):
    run = tmp_path / "run"
    before = _digest(teacher)
    where = dict(teacher=teacher, tmp=tmp_path, failed=_failed_run(tmp_path))
    quick = [o for o in TINY if not o.startswith("dataset.")]  # refused before any data is read
    argv = [*quick, *(o.format(**where) for o in extra), f"hydra.run.dir={run}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not run.exists() and _digest(teacher) == before


def test_the_run_itself_is_refused_as_its_own_teacher(teacher):
    from sam_runner.distill import check_teacher
    from sam_runner.errors import UserError

    with pytest.raises(UserError, match="is this run's own folder"):
        check_teacher(compose(*FAST, f"trainer.distill.teacher={teacher}"), teacher)


def test_the_middle_layer_is_one_rule_for_both_models_half_way_up():
    """#58 item 3: round() halved to even, taking the upper middle of 4 and 8 layers."""
    from sam_runner.distill import middle_index

    assert [middle_index(n) for n in range(1, 9)] == [0, 0, 1, 1, 2, 2, 3, 3]
    for n in (2, 4, 6, 8):  # even bodies: exactly half the layers at or below it
        assert (middle_index(n) + 1) / n == 0.5
    layers = [nn.Linear(3, 3) for _ in range(5)]  # a body of 4 linear layers, then the head
    net = nn.Sequential(*[m for layer in layers[:-1] for m in (layer, nn.ReLU())], layers[-1])
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    with Taps(net).on() as features:
        net(x)
    torch.testing.assert_close(features["middle"], net[:3](x))  # the 2nd of 4, not the 3rd
