"""model.peft on model=hf through the peft library: LoRA's forward is the merged weight's, a run
leaves the pretrained tensors bit-identical and its adapter/ folder loads with
PeftModel.from_pretrained, every method trains, sam-eval's rebuild fits, Flat-LoRA's noise is
seeded and W is restored exactly, and bad targets are one line."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose, run_cli, stopped_early_of

from sam_runner.adapters import attach_adapters
from sam_runner.adapters.hf_peft import merged_copy
from sam_runner.models import build_model
from sam_runner.registry import VARIANTS
from sam_runner.train import train

peft = pytest.importorskip("peft")  # the hf extra (installed with the test extra)

LLAMA = (
    "model.config={model_type: llama, hidden_size: 32, intermediate_size: 64, "
    "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
    "max_position_embeddings: 64}"
)
COMMON = [
    "dataset=text",
    "dataset.block_size=16",
    "dataset.batch_size=8",
    "model=hf",
    "base_optimizer=adamw",
    "base_optimizer.lr=1e-2",
    "scheduler=constant",
    "metrics.hessian.num_samples=16",
    "metrics.hessian.max_iter=10",
    "trainer.progress=none",
]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A tiny Llama written with save_pretrained: the 'pretrained checkpoint' the runs load."""
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    torch.manual_seed(11)
    build_model(compose(*COMMON, LLAMA).model, (16,), 256).hf.save_pretrained(folder)
    return folder


def _model(folder, *overrides):
    cfg = compose(*COMMON, f"model.name={folder}", *overrides)
    model = build_model(cfg.model, (16,), 256)
    return cfg, model


def test_peft_lora_forward_equals_the_merged_weight_forward(pretrained):
    cfg, model = _model(pretrained, "model.peft=lora", "+model.peft_config.init_lora_weights=false")
    attach_adapters(cfg.model, model, (16,))  # init_lora_weights=false: B is not zero
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        adapted, merged = model(x), merged_copy(model)(x)
    assert not any("lora" in n for n, _ in merged_copy(model).named_parameters())
    torch.testing.assert_close(adapted, merged, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def lora_run(pretrained, tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "lora"
    cfg = compose(*COMMON, f"model.name={pretrained}", "model.peft=lora", "optimizer=sam",
                  "model.peft_config.r=4", "trainer.steps=4")  # fmt: skip
    summary = train(cfg, run, ["model.peft=lora"])
    assert summary["status"] == "completed"
    return run, summary


def test_a_lora_run_keeps_the_pretrained_tensors_and_saves_loadable_adapters(pretrained, lora_run):
    from transformers import AutoModelForCausalLM

    run, summary = lora_run
    assert summary["peft"]["method"] == "lora" and summary["peft"]["library"] == "peft"
    assert 0 < summary["trainable_parameters"] < summary["parameters"]
    base = AutoModelForCausalLM.from_pretrained(pretrained).state_dict()
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    frozen = {
        k.removeprefix("hf.base_model.model.").replace(".base_layer", ""): v
        for k, v in state.items()
        if "lora_" not in k
    }
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[k], base[k]) for k in base)  # bit for bit
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in state.items())  # it trained
    loaded = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(pretrained), run / "adapter"
    ).eval()
    from sam_runner.rebuild import load_run

    rebuilt = load_run(run, torch.device("cpu"), purpose="sam-eval")
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits, rebuilt.model(x))


@pytest.mark.slow  # metrics=full on a peft run, ~23 s (CI's time); its rebuild is tested above
def test_sam_eval_measures_a_peft_run_with_metrics_full(lora_run, capsys):
    from sam_runner.evaluation.cli import main as eval_main

    run, _ = lora_run
    argv = [
        str(run),
        "metrics=full",
        "metrics.hessian.num_samples=16",
        "metrics.hessian.max_iter=10",
    ]
    code = eval_main(argv)
    assert code in (0, None), capsys.readouterr().err
    measured = json.loads((run / "eval.json").read_text())
    assert measured["lambda_max"] > 0 and 0 <= measured["test_acc"] <= 1
    for key in ("quant_drop_4bit", "sharpness_avg", "param_norm", "lambda_2", "fisher_rao_norm"):
        assert key in measured, key


def test_sam_landscape_slices_a_peft_run(lora_run):
    from sam_runner.landscape.cli import main as landscape_main

    run, _ = lora_run
    flags = ["landscape.slices=1d", "landscape.points=5", "landscape.train_samples=16",
             "trainer.progress=none"]  # fmt: skip
    assert landscape_main([str(run), *flags]) == 0
    rows = (run / "landscape" / "slice_1d.csv").read_text().splitlines()
    assert len(rows) == 6 and "train_loss" in rows[0]


@pytest.mark.parametrize("method", ["dora", "ia3", "prompt", "prefix"])
def test_every_peft_method_trains_the_adapters_alone(pretrained, tmp_path, method):
    cfg = compose(*COMMON, f"model.name={pretrained}", f"model.peft={method}", "trainer.steps=2")
    summary = train(cfg, tmp_path / method)
    assert summary["status"] == "completed" and summary["peft"]["method"] == method
    assert 0 < summary["trainable_parameters"] < summary["parameters"]
    assert (tmp_path / method / "adapter" / "adapter_config.json").is_file()


def test_targets_that_match_nothing_name_the_models_layers(pretrained, tmp_path, capsys):
    run = tmp_path / "run"
    argv = [*COMMON, f"model.name={pretrained}", "model.peft=lora",
            "model.peft_config.target_modules=[c_attn]", f"hydra.run.dir={run}"]  # fmt: skip
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "target_modules=" in err and "c_attn" in err and "q_proj" in err and "gate_proj" in err
    assert not run.exists()


def test_peft_only_methods_on_own_models_are_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["dataset=digits", "model=mlp", "model.peft=dora", f"hydra.run.dir={run}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "model.peft=dora goes through the peft library, on model=hf" in err
    assert not run.exists()


# ------------------------------------------------------------------ Flat-LoRA
RUNS = ("full", "split")
FLAT = ["model.peft=lora", "optimizer=flat_lora", "+model.peft_config.init_lora_weights=false"]


def test_flat_lora_noise_is_filter_wise_seeded_and_w_is_restored(pretrained):
    from sam_runner.optim import FlatLoRA
    from sam_runner.optim.flat_lora import lora_layers

    cfg, model = _model(pretrained, *FLAT)
    attach_adapters(cfg.model, model, (16,))
    before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    params = [p for p in model.parameters() if p.requires_grad]
    opt = FlatLoRA(params, torch.optim.SGD, rho=0.5, sigma_schedule="constant", lr=0.0)
    opt.bind(model=model)
    x = torch.randint(0, 256, (2, 16))
    seen = []

    def closure():
        opt.zero_grad()
        w, delta, dim = lora_layers(model)[0]
        seen.append(w.detach().clone())
        loss = model(x).float().logsumexp(-1).mean()
        loss.backward()
        return loss

    opt.step(closure)
    after = {k: v for k, v in model.state_dict().items() if "lora_" not in k}
    assert all(torch.equal(before[k], after[k]) for k in before)  # W bit for bit
    w0, delta, _ = lora_layers(model)[0]
    noise = seen[0] - w0
    rows = (w0 + delta).norm(dim=1)
    ratio = noise.std(dim=1) / (0.5 * rows / w0.shape[1] ** 0.5)
    assert ratio.mean().item() == pytest.approx(1.0, abs=0.1)  # σ‖W'_i‖/√n per row
    opt.step_count -= 1  # the same step again: the same noise
    opt.step(closure)
    assert torch.equal(seen[0], seen[1])


def test_flat_lora_with_zero_sigma_is_the_base_optimizer(pretrained):
    from sam_runner.optim import FlatLoRA

    runs = []
    for use_flat in (True, False):
        cfg, model = _model(pretrained, *FLAT)
        torch.manual_seed(0)
        attach_adapters(cfg.model, model, (16,))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = (
            FlatLoRA(params, torch.optim.AdamW, rho=0.0, lr=1e-2).bind(model=model)
            if use_flat
            else torch.optim.AdamW(params, lr=1e-2)
        )
        x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))

        def closure():
            opt.zero_grad()
            loss = model(x).float().logsumexp(-1).mean()
            loss.backward()
            return loss

        for _ in range(2):
            opt.step(closure)
        runs.append([p.detach().clone() for p in params])
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_flat_lora_runs_resume_exactly(pretrained, tmp_path):
    # constant σ: the first half is trained under a one-epoch config (stopped_early_of), whose
    # increasing σ would follow a shorter run
    common = [*COMMON, f"model.name={pretrained}", *FLAT, "dataset.steps_per_epoch=2",
              "optimizer.sigma_schedule=constant"]  # fmt: skip
    two = [*common, "trainer.epochs=2"]
    summary = train(compose(*two), tmp_path / "full")
    assert summary["status"] == "completed" and summary["grad_evals_per_step"] == 1.0
    train(compose(*common, "trainer.epochs=1"), tmp_path / "split")
    stopped_early_of(tmp_path / "split", 2)
    train(compose(*two), tmp_path / "split")
    a, b = (torch.load(tmp_path / r / "checkpoints" / "last.pt")["model"] for r in RUNS)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_flat_lora_without_lora_layers_perturbs_the_trainable_matrices(tmp_path):
    cfg = compose(*COMMON, LLAMA, "optimizer=flat_lora", "trainer.steps=2")
    summary = train(cfg, tmp_path / "rwp")  # full fine-tuning: random weight perturbation
    assert summary["status"] == "completed" and summary["grad_evals_per_step"] == 1.0


def test_flat_lora_perturbs_our_own_lora_layers_on_the_runners_models(tmp_path):
    small = ["dataset=digits", "model=cnn", "model.channels=4", "trainer.epochs=1",
             "trainer.progress=none", "metrics.hessian.num_samples=64",
             "metrics.hessian.max_iter=5"]  # fmt: skip
    train(compose(*small), tmp_path / "pre")
    tuned = compose(*small, f"model.init_from={tmp_path / 'pre'}", "model.peft=lora",
                    "optimizer=flat_lora", "base_optimizer=adamw")  # fmt: skip
    summary = train(tuned, tmp_path / "lora")
    assert summary["status"] == "completed" and summary["grad_evals_per_step"] == 1.0
    before = torch.load(tmp_path / "pre" / "checkpoints" / "last.pt")["model"]
    after = torch.load(tmp_path / "lora" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(v, after[k]) for k, v in before.items())  # the conv weights, exactly


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_moves_the_adapters_alone(name):
    from sam_runner.losses import per_example
    from sam_runner.optim.build import build_optimizer, parameter_groups

    tiny = LLAMA.replace("hidden_size: 32, intermediate_size: 64", "hidden_size: 16, "
                         "intermediate_size: 32").replace("num_hidden_layers: 2",
                                                          "num_hidden_layers: 1")  # fmt: skip
    base = "base_optimizer=sgd" if name == "sam_sps" else "base_optimizer=adamw"
    cfg = compose(*COMMON, tiny, "model.peft=lora", f"optimizer={name}", base)
    torch.manual_seed(0)
    model = build_model(cfg.model, (8,), 256)
    attach_adapters(cfg.model, model, (8,))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(cfg, parameter_groups(model), 10, 5).bind(model=model)
    if getattr(opt, "class_counts", 0) is None:
        opt.set_class_counts([1] * 256)
    if getattr(opt, "num_data", 0) is None:
        opt.set_num_data(100)
    loss = per_example("cross_entropy", 0.0)
    x, y = torch.randint(0, 256, (4, 8)), torch.randint(0, 256, (4, 8))

    def closure():
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        value = opt.reduce_loss(loss(logits, y), logits, y)
        value.backward()
        return value

    for _ in range(2):
        opt.step(closure)
    after = dict(model.named_parameters())
    trained = {n for n, p in after.items() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert all(torch.equal(after[n], v) for n, v in before.items() if n not in trained)
    assert any(not torch.equal(after[n], before[n]) for n in trained)


VIT = (
    "model.config={model_type: vit, hidden_size: 32, num_hidden_layers: 1, "
    "num_attention_heads: 2, intermediate_size: 64, patch_size: 4}"
)
BERT = (
    "model.config={model_type: bert, hidden_size: 16, intermediate_size: 32, "
    "num_hidden_layers: 1, num_attention_heads: 2, max_position_embeddings: 32, vocab_size: 256}"
)


@pytest.mark.parametrize("method", ["lora", "ia3"])
def test_a_vit_classifier_takes_adapters_and_trains_its_new_head(tmp_path, method):
    cfg = compose("dataset=digits", *COMMON[3:], VIT, "model.task=image_classification",
                  f"model.peft={method}", "trainer.epochs=1")  # fmt: skip
    summary = train(cfg, tmp_path / "vit")
    assert summary["status"] == "completed"
    state = torch.load(tmp_path / "vit" / "checkpoints" / "last.pt")["model"]
    assert any("modules_to_save" in k and "classifier" in k for k in state)  # the head trains


def test_prefix_tuning_on_a_model_without_a_cache_is_one_line(tmp_path, capsys):
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps({"text": f"doc {i}", "label": i % 2}) + "\n"
                             for i in range(20)))  # fmt: skip
    run = tmp_path / "run"
    argv = ["dataset=table", f"dataset.path={table}", "dataset.block_size=8", *COMMON[3:], BERT,
            "model.task=sequence_classification", "model.peft=prefix",
            f"hydra.run.dir={run}"]  # fmt: skip
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "model.peft=prefix on this model" in err and "past key values" in err
    assert not run.exists()
