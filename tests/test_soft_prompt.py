"""model.peft=prompt: a soft prompt on a tiny GPT — the pretrained tensors bit-identical after a
run, the loss over the real tokens alone, SAM's perturbation on the prompt alone, an exact
resume, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import compose, run_cli, stopped_early_of

from sam_runner.adapters import adapter_names, attach_adapters
from sam_runner.models import build_model, load_initial_weights
from sam_runner.optim import VARIANTS
from sam_runner.optim.build import parameter_groups
from sam_runner.rebuild import load_run
from sam_runner.train import train

# a 24-position GPT read with 16-token windows: room for a prompt of up to 8 vectors
SMALL = [
    "dataset=text",
    "dataset.block_size=16",
    "dataset.batch_size=8",
    "dataset.steps_per_epoch=3",
    "model=gpt",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=16",
    "model.block_size=24",
    "base_optimizer=adamw",
    "base_optimizer.lr=0.01",
    "scheduler=constant",
    "metrics=off",  # no curvature: tests/test_lora.py measures it over the adapters
    "dataset.eval_windows=8",
    "trainer.progress=none",
    "trainer.epochs=1",
]
VOCAB, LENGTH = 256, 4  # byte-level text; the prompt's vectors


@pytest.fixture
def pretrained(tmp_path):
    """A state_dict file of the tiny GPT (its seeded initialisation stands in for a pretrained
    run: what matters here is that the weights are given)."""
    torch.manual_seed(3)
    path = tmp_path / "pretrained.pt"
    torch.save(build_model(compose(*SMALL).model, (16,), VOCAB).state_dict(), path)
    return path


def prompted(pretrained, *more):
    return [*SMALL, f"model.init_from={pretrained}", "model.peft=prompt",
            f"model.prompt.length={LENGTH}", *more]  # fmt: skip


def prompted_model(pretrained):
    cfg = compose(*prompted(pretrained))
    torch.manual_seed(0)
    model = build_model(cfg.model, (16,), VOCAB)
    load_initial_weights(cfg.model, model)
    record = attach_adapters(cfg.model, model, (16,))
    return model.double(), record


def test_the_prompt_comes_first_and_its_positions_give_no_logits(pretrained):
    model, record = prompted_model(pretrained)
    assert record == {"method": "prompt", "length": LENGTH, "layers": ["embed.prompt"]}
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["embed.prompt.vectors"]
    idx = torch.randint(VOCAB, (3, 16))
    out = model(idx)
    assert out.shape == (3, 16, VOCAB)  # one row of logits per real token
    # the same as the plain GPT reading P tokens whose embeddings are the prompt's, then the
    # window, with the first P rows of logits dropped
    prompt_ids = torch.tensor([5, 77, 140, 201])
    with torch.no_grad():
        model.embed.prompt.vectors.copy_(model.embed.tok.weight[prompt_ids])
    prompt = model.embed.prompt
    model.embed.prompt = None
    plain = model(torch.cat([prompt_ids.expand(3, -1), idx], dim=1))
    model.embed.prompt = prompt
    torch.testing.assert_close(model(idx), plain[:, LENGTH:], rtol=1e-12, atol=1e-12)


def test_sam_perturbs_the_prompt_alone_with_radius_rho(pretrained):
    model, _ = prompted_model(pretrained)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    groups = parameter_groups(model)  # the runner's groups: the prompt only
    assert [p for g in groups for p in g["params"]] == [model.embed.prompt.vectors]
    opt = VARIANTS["sam"](groups, torch.optim.SGD, lr=0.1, rho=0.07, total_steps=10)
    opt.bind(model=model)
    x, y = torch.randint(VOCAB, (4, 16)), torch.randint(VOCAB, (4, 16))
    seen = {}

    def closure():
        seen[opt.pass_index] = (
            model.embed.prompt.vectors.detach().clone(),
            {n: p.detach().clone() for n, p in model.named_parameters() if n in frozen},
        )
        opt.zero_grad(set_to_none=True)
        out = model(x)
        per_sample = F.cross_entropy(out.transpose(1, 2), y, reduction="none").mean(1)
        loss = opt.reduce_loss(per_sample, out, y)
        loss.backward()
        return loss.detach()

    opt.step(closure)
    eps = seen[1][0] - seen[0][0]
    assert eps.norm().item() == pytest.approx(0.07, rel=1e-9)  # ‖ε‖ over the prompt alone
    for _, state in seen.values():
        assert all(torch.equal(state[n], frozen[n]) for n in frozen)


def test_a_prompt_run_keeps_the_pretrained_weights_bit_identical(pretrained, tmp_path):
    summary = train(compose(*prompted(pretrained, "optimizer=sam")), tmp_path / "ft", [])
    assert summary["status"] == "completed", summary.get("error")
    given = torch.load(pretrained, weights_only=True)
    saved = torch.load(tmp_path / "ft" / "checkpoints" / "last.pt", weights_only=True)["model"]
    for k, v in given.items():
        assert torch.equal(saved[k], v), k
    assert sorted(set(saved) - set(given)) == ["embed.prompt.vectors"]
    assert summary["trainable_parameters"] == LENGTH * 16 < summary["parameters"]
    assert summary["peft"]["method"] == "prompt"
    on_disk = json.loads((tmp_path / "ft" / "summary.json").read_text())
    assert on_disk["trainable_parameters"] == LENGTH * 16
    # the run folder rebuilds (sam-eval, sam-landscape) with its trained prompt
    run = load_run(tmp_path / "ft", torch.device("cpu"), purpose="sam-eval")
    assert adapter_names(run.model) == ["embed.prompt.vectors"]
    assert torch.equal(run.model.embed.prompt.vectors, saved["embed.prompt.vectors"])


@pytest.mark.slow  # three runs: over the default suite's 5 s a test
def test_a_prompt_run_resumes_to_the_same_prompt(pretrained, tmp_path):
    two = prompted(pretrained, "optimizer=sam", "trainer.epochs=2")
    train(compose(*two), tmp_path / "full", [])
    train(compose(*prompted(pretrained, "optimizer=sam")), tmp_path / "split", [])
    weights = lambda r: torch.load(tmp_path / r / "checkpoints" / "last.pt")["model"]
    after_one = weights("split")["embed.prompt.vectors"]
    stopped_early_of(tmp_path / "split", 2)
    train(compose(*two), tmp_path / "split", [])
    a, b = weights("full"), weights("split")
    assert not torch.equal(a["embed.prompt.vectors"], after_one)  # the second epoch trained it
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


BAD = [
    (["model.prompt.length=0"], "model.prompt.length=0 must be an integer >= 1"),
    (["model.prompt.length=9"],
     "model.prompt.length=9 + dataset.block_size=16 = 25 is more than the model's context "
     "model.block_size=24"),
]  # fmt: skip
# (a prompt on a model that is no GPT: tests/test_lora.py)


@pytest.mark.parametrize("argv, message", BAD, ids=["length 0", "over context"])
def test_bad_prompt_input_is_one_line_exit_2_writing_nothing(
    argv, message, pretrained, tmp_path, capsys, monkeypatch
):
    run_dir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli([*prompted(pretrained), *argv, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"sam-run: error: {message}"), err
    assert not run_dir.exists()
