"""weight_decay=ouidecay: the collector's OUI, the rescale rule against a hand-computed recurrence,
the window collection equal to collecting every step, accumulation, the run's files, exact
resume, composition with variants, metrics.oui, and bad keys."""

import json
from collections import deque

import pytest
import torch
from conftest import TINY, compose, run_cli, stopped_early_of
from torch import nn

from sam_runner import distributed
from sam_runner.clock import Clock
from sam_runner.errors import UserError
from sam_runner.metrics import oui
from sam_runner.optim.build import parameter_groups
from sam_runner.train import train
from sam_runner.weight_decay import OUIDecay, build_weight_decay, tracked_layers


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 6), nn.ReLU(), nn.Linear(6, 3))


def _bound(rule, net, wd=1e-3, steps_per_epoch=1000):
    groups = rule.param_groups(parameter_groups(net), net)
    opt = torch.optim.SGD(groups, lr=0.0, weight_decay=wd)
    clock = Clock()
    clock.total_steps = 10_000
    rule.bind(net, opt, distributed.current(), 0, clock, steps_per_epoch)
    return opt, clock


def _outputs(net, x):
    """Each linear layer's output on x, by name."""
    return {n: m(x_in) for n, m, x_in in _trace(net, x)}


def _trace(net, x):
    out = []
    for name, m in net.named_children():
        if isinstance(m, nn.Linear):
            out.append((name, m, x))
        x = m(x)
    return out


def test_layers_get_their_own_groups_and_the_rest_keeps_the_runners():
    net = _net()
    rule = OUIDecay()
    groups = rule.param_groups(parameter_groups(net), net)
    layered = [g for g in groups if "layer" in g]
    assert sorted(g["layer"] for g in layered) == ["0", "2", "4"] == list(tracked_layers(net))
    assert all(g["params"] == [net[int(g["layer"])].weight] for g in layered)
    rest = {id(p) for g in groups if "layer" not in g for p in g["params"]}
    assert rest == {id(net[i].bias) for i in (0, 2, 4)}
    assert sum(len(g["params"]) for g in groups) == len(list(net.parameters()))


def test_the_coefficients_follow_the_hand_computed_recurrence_and_the_window_suffices():
    """Every 4 steps, λ_l = λ(s1 + (s2 − s1)(o_l − min o)/(max o − min o + eps)), o_l the mean OUI
    of the last 2 steps; OUI collected on those steps only equals OUI collected on every step."""
    net, wd, s1, s2 = _net(), 2e-3, 0.5, 3.0
    rule = OUIDecay(every=4, window=2, scale_min=s1, scale_max=s2)
    opt, clock = _bound(rule, net, wd)
    g = torch.Generator().manual_seed(3)
    history, want = deque(maxlen=2), None
    collected = []
    for step in range(1, 13):
        x = torch.randn(16, 5, generator=g)
        with torch.no_grad():
            history.append({n: oui(a) for n, a in _outputs(net, x).items()})  # every step
            with rule.forward_context(pass_index=0):
                net(x)
            with rule.forward_context(pass_index=1):  # a second SAM pass: not counted
                net(torch.randn(16, 5, generator=g))
        if rule.counts:
            collected.append(step)
        clock.step = step
        rule.after_step(step)
        if collected[-1] == step:  # the step's OUI per layer: oui() of each layer's output
            assert rule.latest.tolist() == pytest.approx(list(history[-1].values()), rel=1e-12)
        if step % 4 == 0:
            o = {n: sum(h[n] for h in history) / len(history) for n in history[0]}
            lo, hi = min(o.values()), max(o.values())
            want = {n: wd * (s1 + (s2 - s1) * (v - lo) / (hi - lo + 1e-8)) for n, v in o.items()}
        if want is not None:
            got = {gr["layer"]: gr["weight_decay"] for gr in opt.param_groups if "layer" in gr}
            assert got == pytest.approx(want, rel=1e-12)
    assert collected == [1, 3, 4, 7, 8, 11, 12]
    assert min(want.values()) == pytest.approx(wd * s1) and max(want.values()) < wd * s2
    assert {gr["weight_decay"] for gr in opt.param_groups if "layer" not in gr} == {wd}


def test_a_convolutions_oui_reads_one_position_per_sample_and_micro_batches_sum_to_the_batch():
    conv = nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6, 3))
    rule = OUIDecay(every=1, window=1, positions="first")
    _bound(rule, conv)
    x = torch.randn(10, 2, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), rule.forward_context(0):
        conv(x)
    rule.after_step(1)
    whole = rule.latest.clone()
    assert whole[0].item() == pytest.approx(oui(conv[0](x)[:, :, 0]))  # position 0 of each
    for half in x.tensor_split(2):  # accumulation: the step's counts over its micro-batches
        with torch.no_grad(), rule.forward_context(0):
            conv(half)
    rule.after_step(2)
    assert torch.equal(rule.latest, whole)


def _ouidecay_run(*extra):
    return [*TINY, "metrics=off", "weight_decay=ouidecay", "weight_decay.every_n_steps=4", *extra]


def _rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "time_s"} for x in lines]


def test_a_run_logs_oui_writes_the_final_coefficients_and_resumes_exactly(tmp_path):
    run = _ouidecay_run("optimizer=sam", "scheduler=constant", "trainer.epochs=3")
    train(compose(*run), tmp_path / "whole", [])
    rows = _rows(tmp_path / "whole")
    assert len(rows) == 3 and all(0 < r["oui"] < 1 for r in rows)
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    layers = summary["weight_decay_layers"]
    state = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)
    groups = state["optimizer"]["param_groups"]
    saved = {g["layer"]: g["weight_decay"] for g in groups if "layer" in g}
    assert layers == saved and len(set(layers.values())) == len(layers) > 1
    assert min(layers.values()) == pytest.approx(5e-4 * 0.6666)
    # stopped after epoch 2 (mid-way between two rescales), then resumed
    part = [*run[:-1], "trainer.epochs=2"]
    train(compose(*part), tmp_path / "split", [])
    stopped_early_of(tmp_path / "split", 3)
    train(compose(*run), tmp_path / "split", [])
    assert _rows(tmp_path / "split") == rows
    again = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert again["weight_decay_layers"] == layers
    other = torch.load(tmp_path / "split" / "checkpoints" / "last.pt", weights_only=True)
    assert all(torch.equal(other["model"][k], v) for k, v in state["model"].items())


@pytest.mark.parametrize(
    "extra",
    [
        ["optimizer=asam"],
        ["optimizer=gear_sam", "base_optimizer=adamw", "base_optimizer.weight_decay=0.01"],
        ["optimizer=base", "trainer.accumulate=2"],
        ["optimizer=sam", "trainer.precision=bf16"],
    ],
    ids=["asam", "gear_sam-adamw", "base-accumulate", "sam-bf16"],
)
def test_it_composes_with_variants_base_optimizers_and_accumulation(extra, tmp_path):
    train(compose(*_ouidecay_run(*extra, "trainer.epochs=1")), tmp_path / "r", [])
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert len(set(summary["weight_decay_layers"].values())) > 1


def test_metrics_oui_logs_oui_and_leaves_the_run_as_it_was(tmp_path):
    tiny = [*TINY, "trainer.epochs=1", "metrics=off"]
    train(compose(*tiny), tmp_path / "plain", [])
    train(compose(*tiny, "metrics.oui=true"), tmp_path / "logged", [])
    plain, logged = _rows(tmp_path / "plain"), _rows(tmp_path / "logged")
    assert "oui" not in plain[0] and 0 < logged[0].pop("oui") < 1
    assert plain == logged
    summary = json.loads((tmp_path / "logged" / "summary.json").read_text())
    assert "weight_decay_layers" not in summary
    assert build_weight_decay(compose()) is None  # the base optimizer's own decay: no part


def test_a_model_without_conv_or_linear_layers_is_refused():
    net = nn.Sequential(nn.BatchNorm1d(3))
    with pytest.raises(UserError, match="needs a model with conv or linear layers"):
        OUIDecay().param_groups(parameter_groups(net), net)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["base_optimizer.weight_decay=0"], "nothing to rescale at 0"),
        (["weight_decay.every_n_steps=0"], "weight_decay.every_n_steps=0 must be an integer >= 1"),
        (["weight_decay.window=0"], "weight_decay.window=0 must be an integer >= 1"),
        (["weight_decay.scale_max=0.5"], "weight_decay.scale_max=0.5 must be a finite number >="),
        (["weight_decay.positions=all"], "weight_decay.positions='all' is unknown"),
    ],
)
def test_bad_ouidecay_keys_are_one_line_and_exit_2(overrides, message, tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["weight_decay=ouidecay", *overrides, f"hydra.run.dir={run}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not run.exists()


@pytest.mark.slow
def test_two_processes_see_the_global_batchs_oui_and_set_the_coefficients_of_one(tmp_path):
    """Under DDP the counts are summed over the processes: an MLP (no sampled positions) trained
    by 2 processes logs the OUI and ends with the coefficients of 1 process at the same batch."""
    run = ["model=mlp", "dataset.num_samples=600", "dataset.batch_size=64", "trainer.device=cpu"]
    cfg = compose(*_ouidecay_run(*run, "optimizer.sync_perturbation=true"))
    train(cfg, tmp_path / "one", [])
    two = distributed.launch(train, (cfg, str(tmp_path / "two"), []), 2, torch.device("cpu"))
    assert two["status"] == "completed"
    r1, r2 = _rows(tmp_path / "one"), _rows(tmp_path / "two")
    assert [r["oui"] for r in r2] == pytest.approx([r["oui"] for r in r1], abs=1e-3)
    one = _summary_of(tmp_path / "one")["weight_decay_layers"]
    assert _summary_of(tmp_path / "two")["weight_decay_layers"] == pytest.approx(one, rel=1e-3)


def _summary_of(run_dir):
    return json.loads((run_dir / "summary.json").read_text())
