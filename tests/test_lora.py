"""model.peft=lora: our adapters against the ``peft`` library on the same layers, a LoRA run that
leaves the pretrained weights bit-identical, the curvature over the adapters, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose, run_cli
from torch import nn

from sam_runner.adapters import adapter_names, attach_adapters
from sam_runner.adapters.lora import add_lora
from sam_runner.metrics.tracker import CurvatureTracker
from sam_runner.models import build_model, load_initial_weights
from sam_runner.rebuild import load_run
from sam_runner.train import train

SMALL = [
    "dataset=digits",
    "model=cnn",
    "model.channels=4",
    "scheduler=constant",
    "metrics.hessian.num_samples=128",
    "metrics.hessian.max_iter=10",
    "trainer.progress=none",
    "trainer.epochs=1",
    "base_optimizer=adamw",
    "base_optimizer.lr=0.01",
]


@pytest.fixture
def pretrained(tmp_path):
    """A state_dict file of the small CNN (its seeded initialisation stands in for a pretrained
    run: what matters here is that the weights are given)."""
    torch.manual_seed(3)
    model = build_model(compose(*SMALL).model, (1, 8, 8), 10)
    for m in model.modules():  # running statistics that are not the defaults
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    path = tmp_path / "pretrained.pt"
    torch.save(model.state_dict(), path)
    return path


LAYERS = [
    lambda: nn.Linear(7, 5),
    lambda: nn.Conv2d(3, 6, 3, stride=2, padding=1),
    lambda: nn.Conv1d(2, 4, 5, padding=2),
]


@pytest.mark.parametrize("make", LAYERS, ids=["linear", "conv2d", "conv1d"])
def test_our_lora_layer_computes_what_peft_computes(make):
    peft = pytest.importorskip("peft")  # a test-only dependency (the `test` extra)
    torch.manual_seed(0)
    ours = nn.Sequential(make()).double()
    theirs = nn.Sequential(make()).double()
    theirs.load_state_dict(ours.state_dict())
    config = peft.LoraConfig(r=2, lora_alpha=6, target_modules=["0"], lora_dropout=0.0)
    theirs = peft.inject_adapter_in_model(config, theirs)
    add_lora(ours[0], rank=2, alpha=6)
    # the same adapters, B not zero (a trained adapter)
    with torch.no_grad():
        ours[0].lora_B.normal_()
        theirs[0].lora_A["default"].weight.copy_(ours[0].lora_A)
        theirs[0].lora_B["default"].weight.copy_(ours[0].lora_B)
    shape = (4, 7) if isinstance(ours[0], nn.Linear) else (4, *ours[0].weight.shape[1:2], 9, 9)
    if isinstance(ours[0], nn.Conv1d):
        shape = (4, 2, 11)
    x = torch.randn(shape, dtype=torch.float64)
    a, b = ours(x), theirs(x)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    a.square().sum().backward()
    b.square().sum().backward()
    torch.testing.assert_close(ours[0].lora_A.grad, theirs[0].lora_A["default"].weight.grad)
    torch.testing.assert_close(ours[0].lora_B.grad, theirs[0].lora_B["default"].weight.grad)


def test_a_fresh_adapter_leaves_the_layer_s_function_and_state_names():
    torch.manual_seed(0)
    layer = nn.Linear(6, 4)
    x = torch.randn(3, 6)
    before = layer(x)
    add_lora(layer, rank=3, alpha=3)
    assert isinstance(layer, nn.Linear) and torch.equal(layer(x), before)  # B = 0 at the start
    assert list(layer.state_dict()) == ["weight", "bias", "lora_A", "lora_B"]


def test_a_lora_run_keeps_the_pretrained_weights_bit_identical(pretrained, tmp_path):
    cfg = compose(
        *SMALL,
        f"model.init_from={pretrained}",
        "model.peft=lora",
        "model.lora.rank=2",
        "optimizer=sam",
    )
    summary = train(cfg, tmp_path / "ft", [])
    assert summary["status"] == "completed"
    given = torch.load(pretrained, weights_only=True)
    saved = torch.load(tmp_path / "ft" / "checkpoints" / "last.pt", weights_only=True)["model"]
    for k, v in given.items():  # BatchNorm's running statistics and its count included
        assert torch.equal(saved[k], v), k
    adapters = [k for k in saved if k not in given]
    assert adapters and all(".lora_" in k for k in adapters)
    assert any(saved[k].abs().sum() > 0 for k in adapters if k.endswith("lora_B"))  # trained
    n_adapters = sum(saved[k].numel() for k in adapters)
    assert summary["trainable_parameters"] == n_adapters < summary["parameters"]
    assert summary["peft"]["layers"] == ["stem.0", "stage1.0", "stage2.0", "head.2"]
    on_disk = json.loads((tmp_path / "ft" / "summary.json").read_text())
    assert on_disk["trainable_parameters"] == n_adapters
    # the run folder rebuilds (sam-eval, sam-landscape): adapters and all
    run = load_run(tmp_path / "ft", torch.device("cpu"), purpose="sam-eval")
    assert sorted(adapter_names(run.model)) == sorted(adapters)


def test_reset_head_trains_the_classifier_in_full_and_targets_choose_layers(pretrained):
    cfg = compose(
        *SMALL,
        f"model.init_from={pretrained}",
        "model.peft=lora",
        "model.reset_head=true",
        "model.lora.targets=[stage*]",
    )
    model = build_model(cfg.model, (1, 8, 8), 4)
    load_initial_weights(cfg.model, model)
    record = attach_adapters(cfg.model, model)
    assert record["layers"] == ["stage1.0", "stage2.0"] and record["trained_in_full"] == ["head.2"]
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == [
        "head.2.bias",
        "head.2.weight",
        "stage1.0.lora_A",
        "stage1.0.lora_B",
        "stage2.0.lora_A",
        "stage2.0.lora_B",
    ]
    # a frozen BatchNorm normalises with its pretrained statistics even in train mode
    model.train()
    bn = model.stem[1]
    x = torch.randn(8, 1, 8, 8)
    y = model.stem(x)
    expected = torch.relu(
        nn.functional.batch_norm(
            model.stem[0](x), bn.running_mean, bn.running_var, bn.weight, bn.bias, False
        )
    )
    torch.testing.assert_close(y, expected)


def test_curvature_is_over_the_adapters_by_default_and_over_all_on_request(pretrained):
    from sam_runner.data import build_data

    def measure(params):
        cfg = compose(
            *SMALL,
            f"model.init_from={pretrained}",
            "model.peft=lora",
            "model.lora.rank=2",
            f"metrics.hessian.params={params}",
        )
        data = build_data(cfg.dataset, torch.device("cpu"), 0)
        torch.manual_seed(0)
        model = build_model(cfg.model, data.input_shape, data.num_classes)
        load_initial_weights(cfg.model, model)
        attach_adapters(cfg.model, model)
        with torch.no_grad():  # adapters that change the function
            for n, p in model.named_parameters():
                if n.endswith("lora_B"):
                    p.normal_(0, 0.1)
        tracker = CurvatureTracker(cfg.metrics, model, data, None, 0)
        value = tracker.measure(final=True)["lambda_max"]
        assert [p.requires_grad for p in model.parameters()] == [
            ".lora_" in n for n, _ in model.named_parameters()
        ]  # the frozen weights frozen again afterwards
        return value, tracker.vector

    adapters, v_adapters = measure("trainable")
    everything, v_all = measure("all")
    assert len(v_adapters) == 8 and len(v_all) > len(v_adapters)  # one block per parameter
    assert everything > adapters  # the Hessian over more parameters has a larger top eigenvalue


BAD = [
    (["model.peft=lora"], "model.peft=lora fine-tunes given weights: set model.init_from"),
    (["model.peft=lora", "model.init_from=PRE", "model.lora.rank=0"],
     "model.lora.rank=0 must be an integer >= 1"),
    (["model.peft=lora", "model.init_from=PRE", "model.lora.rank=5"],
     "model.lora.rank=5 is larger than layer stem.0 allows (min(d_in, d_out) = 4)"),
    (["model.peft=lora", "model.init_from=PRE", "model.lora.targets=[fc*]"],
     "model.lora.targets: 'fc*' matches no Linear/Conv layer; the layers it could match: "
     "stem.0, stage1.0, stage2.0, head.2"),
    (["model.peft=prompt", "model.init_from=PRE"],
     "model.peft=prompt prepends learned vectors to a GPT's input, and model=cnn is not one: "
     "use model=gpt"),
    (["model.peft=adapters"], "model.peft='adapters' is unknown; choose one of none, lora, prompt"),
    (["metrics.hessian.params=some"], "metrics.hessian.params='some' is unknown"),
]  # fmt: skip


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a)[-30:] for a, _ in BAD])
def test_bad_peft_input_is_one_line_exit_2_writing_nothing(
    argv, message, pretrained, tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("PRE", str(pretrained)) for a in argv]
    code, _, err = run_cli([*SMALL, *argv, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"sam-run: error: {message}"), err
    assert not run_dir.exists()


def test_muon_trains_the_adapters_of_hidden_layers_as_matrices():
    from sam_runner.optim.build import parameter_groups

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    model.requires_grad_(False)
    for i in (0, 2, 4):
        add_lora(model[i], rank=2, alpha=2)
    groups = parameter_groups(model)
    muon = [p for g in groups if g["use_muon"] for p in g["params"]]
    assert muon == [model[2].lora_A, model[2].lora_B]  # the first layer and the head: AdamW's
    assert sum(len(g["params"]) for g in groups) == 6
