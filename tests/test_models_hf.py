"""model=hf: tiny Hugging Face models built from their configs (no download) train through the
CLI and the Python API and resume exactly; a save_pretrained folder loads by model.name; λ_max
through eager attention equals the top eigenvalue of the dense float64 Hessian; bad input is
one line, exit 2, nothing written."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from conftest import HF_TINY, compose, run_cli, stopped_early_of

from sam_runner.errors import UserError
from sam_runner.models import build_model
from sam_runner.train import train

pytest.importorskip("transformers")  # the hf extra (installed with the test extra)

LLAMA = (
    "model.config={model_type: llama, hidden_size: 32, intermediate_size: 64, "
    "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
    "max_position_embeddings: 64}"
)
GPT2 = "model.config={model_type: gpt2, n_embd: 32, n_layer: 2, n_head: 4, n_positions: 64}"
VIT = (
    "model.config={model_type: vit, hidden_size: 32, num_hidden_layers: 1, "
    "num_attention_heads: 2, intermediate_size: 64, patch_size: 4}"
)
TEXT = ["dataset=text", "dataset.block_size=16", "dataset.batch_size=8"]


def lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=False)["model"]


def test_tiny_llama_trains_with_sam_and_resumes_exactly(tmp_path):
    common = [*TEXT, *HF_TINY, LLAMA, "optimizer=sam", "dataset.steps_per_epoch=3"]
    two = [*common, "trainer.epochs=2"]
    full = train(compose(*two), tmp_path / "full", ["model=hf"])
    assert full["status"] == "completed" and full["model_built"] == "hf:llama"
    assert full["hf_model"]["attention"] == "eager" and full["hf_model"]["model_type"] == "llama"
    assert math.isfinite(full["lambda_max"]) and full["lambda_max"] > 0
    evaluated = [x for x in lines(tmp_path / "full") if "test_loss" in x]
    assert evaluated[-1]["test_ppl"] == pytest.approx(math.exp(evaluated[-1]["test_loss"]))
    assert evaluated[-1]["test_bpc"] == pytest.approx(evaluated[-1]["test_loss"] / math.log(2))
    train(compose(*common, "trainer.epochs=1"), tmp_path / "split")
    stopped_early_of(tmp_path / "split", 2)
    train(compose(*two), tmp_path / "split")
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "split")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tiny_gpt2_trains_through_the_cli(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [*TEXT, *HF_TINY, GPT2, "trainer.steps=4", f"hydra.run.dir={run}"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["model_built"] == "hf:gpt2"
    assert "test_ppl" in summary and math.isfinite(summary["lambda_max"])


def test_tiny_vit_classifies_images(tmp_path):
    cfg = compose(
        "dataset=digits", *HF_TINY, VIT, "model.task=image_classification", "trainer.epochs=1"
    )
    summary = train(cfg, tmp_path / "vit")
    assert summary["status"] == "completed" and summary["model_built"] == "hf:vit"
    assert 0 <= summary["test_acc"] <= 1 and math.isfinite(summary["lambda_max"])


def test_a_save_pretrained_folder_loads_by_model_name(tmp_path, capsys):
    cfg = compose(*TEXT, *HF_TINY, LLAMA)
    torch.manual_seed(5)
    source = build_model(cfg.model, (16,), 256).hf
    folder = tmp_path / "tiny-llama"
    source.save_pretrained(folder)
    loaded = build_model(compose(*TEXT, *HF_TINY, f"model.name={folder}").model, (16,), 256)
    theirs, ours = source.state_dict(), loaded.hf.state_dict()
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    run = tmp_path / "run"
    argv = [*TEXT, *HF_TINY, f"model.name={folder}", "trainer.steps=2", f"hydra.run.dir={run}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["hf_model"]["name"] == str(folder)


def test_lambda_max_through_attention_equals_the_dense_hessian():
    from torch.func import functional_call, hessian

    from sam_runner.losses import per_example
    from sam_runner.metrics import top_hessian_eigenvalues

    tiny = (
        "model.config={model_type: llama, hidden_size: 4, intermediate_size: 8, "
        "num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, "
        "max_position_embeddings: 16, vocab_size: 8}"
    )
    torch.manual_seed(0)
    model = build_model(compose(*TEXT, *HF_TINY, tiny).model, (6,), 8).double().eval()
    x = torch.randint(0, 8, (3, 6))
    y = torch.randint(0, 8, (3, 6))
    loss = per_example("cross_entropy", 0.0)
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat0 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def mean_loss(flat):
        chunks = flat.split([s.numel() for s in shapes])
        params = {n: c.view(s) for n, c, s in zip(names, chunks, shapes)}
        return loss(functional_call(model, params, (x,)), y).mean()

    dense = hessian(mean_loss)(flat0)
    top = torch.linalg.eigvalsh((dense + dense.T) / 2)[-1].item()
    ours = top_hessian_eigenvalues(model, loss, [(x, y)], k=1, tol=1e-10, max_iter=500)[0]
    assert ours == pytest.approx(top, rel=1e-6)


def _one_line_exit_2(tmp_path, capsys, argv, *needles):
    run = tmp_path / "run"
    code, _, err = run_cli([*argv, f"hydra.run.dir={run}"], capsys)
    assert code == 2, err
    assert err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    assert not run.exists()
    return err


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["model.name=/nonexistent/tiny-llama"], ["model.name=/nonexistent/tiny-llama", "folder"]),
        (["model.name=sam-runner-tests/no-such-model"],
         ["model.name=sam-runner-tests/no-such-model", "model.download=true"]),
        ([LLAMA.replace("max_position_embeddings: 64", "vocab_size: 100")],
         ["256 token ids", "vocabulary 100"]),
        (["model.task=sequence_classifier", LLAMA], ["model.task='sequence_classifier'"]),
        ([], ["model.name", "model.config"]),
    ],
    ids=["missing-folder", "unknown-id", "vocab-too-small", "unknown-task", "neither"],
)  # fmt: skip
def test_bad_model_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, argv, needles):
    _one_line_exit_2(tmp_path, capsys, [*TEXT, *HF_TINY, *argv], *needles)


def test_a_task_without_a_head_is_one_line(tmp_path, capsys):
    argv = ["dataset=digits", *HF_TINY, LLAMA, "model.task=image_classification"]
    _one_line_exit_2(tmp_path, capsys, argv, "llama model has no image_classification head")


def test_model_hf_without_transformers_names_the_extra(monkeypatch, tmp_path, capsys):
    from sam_runner.models import hf

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers: ImportError
    with pytest.raises(UserError, match=r"pip install -e '\.\[hf\]'"):
        hf.transformers()
    _one_line_exit_2(tmp_path, capsys, [*TEXT, *HF_TINY, LLAMA], "pip install -e '.[hf]'")


@pytest.mark.slow  # two started processes importing transformers: ~30 s on 2 shared cores
def test_two_gloo_processes_match_one_on_a_peft_lora_llama(tmp_path):
    from sam_runner import distributed

    cfg = compose(
        *TEXT, *HF_TINY, LLAMA, "model.peft=lora", "optimizer=sam",
        "optimizer.sync_perturbation=true", "trainer.steps=4", "trainer.device=cpu",
        "metrics.hessian.enabled=false",
    )  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    s1 = train(cfg, one, ["x"])
    s2 = distributed.launch(train, (cfg, str(two), ["x"]), 2, torch.device("cpu"))
    assert s1["status"] == s2["status"] == "completed"
    r1, r2 = lines(one)[-1], lines(two)[-1]
    for key in ("step", "train_loss", "test_loss", "test_acc", "test_ece"):
        assert r2[key] == pytest.approx(r1[key], abs=1e-5), key
    a, b = _weights(one), _weights(two)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert (two / "adapter" / "adapter_config.json").is_file()


def test_muon_takes_gpt2s_conv1d_matrices_as_hidden():
    from sam_runner.optim.build import parameter_groups

    cfg = compose(*TEXT, *HF_TINY, GPT2, "base_optimizer=muon")
    model = build_model(cfg.model, (16,), 256)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in parameter_groups(model) if g["use_muon"] for p in g["params"]]
    assert any("c_attn" in n for n in muon) and any("c_fc" in n for n in muon)
    assert not any("wte" in n or "wpe" in n for n in muon)
    assert model.hf.config.bos_token_id is None  # GPT-2's 50256 is beyond 256 bytes


def test_the_wandb_config_holds_the_model_id_and_revision():
    from sam_runner.loggers.wandb import _config_dict

    cfg = compose(*TEXT, *HF_TINY, "model.name=allenai/OLMo-2-0425-1B", "model.revision=stage1")
    logged = _config_dict(cfg)["model"]
    assert (logged["name"], logged["revision"]) == ("allenai/OLMo-2-0425-1B", "stage1")


def test_model_dtype_bf16_loads_trains_and_measures_in_bf16(tmp_path):
    cfg = compose(*TEXT, *HF_TINY, LLAMA, "model.dtype=bf16", "optimizer=sam", "trainer.steps=3")
    summary = train(cfg, tmp_path / "bf16")
    assert summary["status"] == "completed" and summary["hf_model"]["dtype"] == "bf16"
    assert math.isfinite(summary["lambda_max"])
    assert {v.dtype for v in _weights(tmp_path / "bf16").values()} == {torch.bfloat16}


def test_the_blocks_are_the_embeddings_each_layer_and_the_head(tmp_path):
    from sam_runner.optim.build import parameter_groups

    model = build_model(compose(*TEXT, *HF_TINY, LLAMA).model, (16,), 256)
    blocks = [b for g in parameter_groups(model) for b in g["blocks"]]
    assert set(blocks) == {"embed", "layer1", "layer2", "head"}
    cfg = compose(*TEXT, *HF_TINY, LLAMA, "optimizer=gear_sam", "trainer.steps=2",
                  "metrics.blocks.enabled=true")  # fmt: skip
    summary = train(cfg, tmp_path / "gear")
    assert summary["status"] == "completed"
    last = [x for x in lines(tmp_path / "gear") if "lambda_max" in x][-1]
    assert {f"lambda_max_block_{b}" for b in ("embed", "layer1", "layer2", "head")} <= set(last)
