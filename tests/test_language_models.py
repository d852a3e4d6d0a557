"""Language models: dataset=text (files, .bin folders, the built-in corpus), dataset=
modular_arithmetic, model=gpt, and the token-level metrics, trained in-process on tiny GPTs."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
import torch
from conftest import compose, run_cli, stopped_early_of

from sam_runner.data import modular
from sam_runner.data.text import builtin_text, decode, encode
from sam_runner.models import GPT
from sam_runner.train import train

GPT_TINY = [
    "model=gpt",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=16",
    "base_optimizer=adamw",
    "base_optimizer.lr=3e-3",
    "metrics.hessian.num_samples=32",
    "metrics.hessian.max_iter=20",
    "trainer.progress=none",
]
TEXT_TINY = ["dataset=text", "dataset.block_size=16", "dataset.batch_size=8", "trainer.steps=6"]


def lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_byte_tokens_round_trip_multibyte_utf8():
    text = "héllo — λ_max ≈ 1e3 🙂\nzwölf"
    ids = encode(text)
    assert ids.max() > 127 and len(ids) > len(text)  # multi-byte characters: several ids each
    assert decode(ids) == text


def test_text_run_logs_perplexity_and_bits_per_byte_on_every_line(tmp_path):
    run = tmp_path / "run"
    cfg = compose(*TEXT_TINY, *GPT_TINY, "optimizer=base", "dataset.steps_per_epoch=3")
    summary = train(cfg, run)
    assert summary["status"] == "completed"
    evaluated = [x for x in lines(run) if "test_loss" in x]
    assert len(evaluated) >= 2
    for x in evaluated:
        assert x["test_ppl"] == pytest.approx(math.exp(x["test_loss"]), rel=1e-12)
        assert x["test_bpc"] == pytest.approx(x["test_loss"] / math.log(2), rel=1e-12)
        assert 0 <= x["test_acc"] <= 1 and 0 <= x["train_acc"] <= 1  # per token, not per window
    corpus = builtin_text().encode("utf-8")
    assert summary["corpus_bytes"] == len(corpus)
    import hashlib

    assert summary["corpus_sha256"] == hashlib.sha256(corpus).hexdigest()
    assert math.isfinite(summary["lambda_max"])
    from sam_runner.results.sweep import build_from_dirs

    report = build_from_dirs([run], [run])  # sam-report's table: bits per token, unasked
    assert "test_bpc" in report.metrics and "test_ppl" in report.metrics


@pytest.mark.parametrize("variant", ["sam", "asam", "gsam", "look_sam", "esam"])
def test_sam_variants_train_a_gpt(tmp_path, variant):
    cfg = compose(*TEXT_TINY, *GPT_TINY, f"optimizer={variant}", "trainer.steps=3")
    summary = train(cfg, tmp_path / variant)
    assert summary["status"] == "completed", summary.get("error")
    assert math.isfinite(summary["test_ppl"])


def test_bin_folder_trains_and_resumes_to_the_same_weights(tmp_path):
    folder = tmp_path / "tokens"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 50, 3000).astype(np.uint16).tofile(folder / "train.bin")
    rng.integers(0, 50, 600).astype(np.uint16).tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 50}, f)
    common = [
        *TEXT_TINY,
        *GPT_TINY,
        f"dataset.path={folder}",
        "optimizer=sam",
        "scheduler=constant",
    ]
    once = train(compose(*common, "trainer.steps=8"), tmp_path / "once")
    assert once["status"] == "completed" and once["corpus_bytes"] == 7200
    # stopped after the first of two epochs, then resumed: the same batches, the same weights
    two = [*common, "trainer.steps=null", "trainer.epochs=2"]
    train(compose(*two), tmp_path / "full")
    train(compose(*common, "trainer.steps=null", "trainer.epochs=1"), tmp_path / "split")
    stopped_early_of(tmp_path / "split", 2)
    train(compose(*two), tmp_path / "split")
    a = torch.load(tmp_path / "full" / "checkpoints" / "last.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "split" / "checkpoints" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    out = [x for x in lines(tmp_path / "full") if "test_loss" in x]
    assert out[-1]["test_bpc"] == pytest.approx(out[-1]["test_loss"] / math.log(2))


def test_train_path_trains_on_a_second_corpus_and_tests_on_the_first(tmp_path, capsys):
    from sam_runner.data.text import load_corpus, python_source_text
    from sam_runner.data.text import text as text_data

    cfg = compose("dataset=text", "dataset.train_path=python_source").dataset
    corpus = load_corpus(cfg)
    first, second = encode(builtin_text()), encode(python_source_text())
    assert np.array_equal(corpus.train, second[: len(corpus.train)])  # the source's head...
    assert len(second) - len(corpus.train) == round(0.1 * len(second))  # ... without its tail
    assert np.array_equal(corpus.test, first[len(first) - len(corpus.test) :])  # the docs' tail
    data = text_data(cfg, 0, 0, 1)  # what summary.json records of both
    assert (data.corpus["corpus"], data.corpus["train_corpus"]) == (
        "builtin:pydoc_data.topics", "builtin:python_source",
    )  # fmt: skip
    assert data.corpus["train_corpus_bytes"] == len(second) != data.corpus["corpus_bytes"]
    assert np.array_equal(data.train.ids, corpus.train)  # training batches: the source's
    assert np.array_equal(data.train_tensors[0][0].numpy(), second[:64])  # measurement windows
    folder = tmp_path / "tokens"  # another tokenizer's ids: refused in one line
    folder.mkdir()
    for split in ("train", "val"):
        np.arange(40, dtype=np.uint16).tofile(folder / f"{split}.bin")
    argv = ["dataset=text", "model=gpt", f"dataset.train_path={folder}", "dataset.vocab_size=50"]
    _fails(argv, tmp_path, capsys, "50 token ids", "256", "one tokenizer")


def test_eval_windows_default_fits_the_logits_in_a_memory_budget(tmp_path):
    from sam_runner.data.text import EVAL_LOGITS_BYTES, EVAL_WINDOWS, eval_windows
    from sam_runner.data.text import text as text_data

    folder = tmp_path / "gpt2_ids"  # GPT-2's vocabulary: 20 windows of 256 fit in 1 GiB
    folder.mkdir()
    for split, n in (("train", 20_000), ("val", 40_000)):
        np.arange(n, dtype=np.uint16).tofile(folder / f"{split}.bin")
    cfg = compose("dataset=text", f"dataset.path={folder}", "dataset.vocab_size=50257",
                  "dataset.block_size=256").dataset  # fmt: skip
    assert EVAL_LOGITS_BYTES // (256 * 50257 * 4) == 20 < EVAL_WINDOWS
    data = text_data(cfg, 0, 0, 1)
    assert len(data.test.y) == 20 and len(data.train_plain.y) == 20
    assert len(text_data(compose("dataset=text").dataset, 0, 0, 1).test.y) == EVAL_WINDOWS
    cfg.eval_windows = 50  # given: kept, whatever the vocabulary
    assert eval_windows(cfg, 50257) == 50 and len(text_data(cfg, 0, 0, 1).test.y) == 50


def test_tied_embeddings_are_one_parameter():
    model = GPT(vocab=30, context=8, n_layer=1, n_head=2, n_embd=16)
    names = [n for n, _ in model.named_parameters()]
    assert "embed.tok.weight" in names and not any(
        "head" in n and "weight" in n and n != "head.weight" for n in names
    )
    counted = sum(p.numel() for p in model.parameters())
    distinct = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert counted == distinct
    logits = model(torch.randint(0, 30, (2, 8)))
    assert logits.shape == (2, 8, 30)


def test_lambda_max_of_a_tiny_gpt_is_the_dense_hessians_top_eigenvalue():
    from sam_runner.losses import mean_loss
    from sam_runner.metrics import top_hessian_eigenvalues

    torch.manual_seed(0)
    model = GPT(vocab=12, context=6, n_layer=1, n_head=2, n_embd=8).double().eval()
    params = [p for p in model.parameters()]
    assert sum(p.numel() for p in params) <= 5000
    x = torch.randint(0, 12, (4, 6))
    y = torch.randint(0, 12, (4, 6))
    loss = mean_loss("cross_entropy")
    (lam,) = top_hessian_eigenvalues(model, loss, [(x, y)], k=1)
    names = [n for n, _ in model.named_parameters()]

    def f(*flat):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH]):
            out = torch.func.functional_call(model, dict(zip(names, flat)), (x,))
        return loss(out, y)

    h = torch.autograd.functional.hessian(f, tuple(p.detach() for p in params))
    sizes = [p.numel() for p in params]
    dense = torch.cat(
        [
            torch.cat([h[i][j].reshape(sizes[i], sizes[j]) for j in range(len(params))], 1)
            for i in range(len(params))
        ]
    )
    top = float(torch.linalg.eigvalsh(dense).max())
    assert lam == pytest.approx(top, rel=1e-4)


def test_modular_split_is_disjoint_seeded_and_covers_every_pair():
    x, c = modular.pairs(7, "add")
    assert len(c) == 49 and torch.equal(c, (x[:, 0] + x[:, 2]) % 7)
    tr, te = modular.split(49, 0.5, 0)
    assert set(tr.tolist()).isdisjoint(te.tolist()) and len(tr) + len(te) == 49
    assert torch.equal(tr, modular.split(49, 0.5, 0)[0])
    assert not torch.equal(tr, modular.split(49, 0.5, 1)[0])
    xd, cd = modular.pairs(7, "div")
    assert len(cd) == 42 and torch.equal((cd * xd[:, 2]) % 7, xd[:, 0])


def test_modular_arithmetic_trains_a_gpt_with_token_metrics(tmp_path):
    cfg = compose(
        "dataset=modular_arithmetic",
        "dataset.p=11",
        "dataset.batch_size=16",
        *GPT_TINY,
        "optimizer=sam",
        "trainer.steps=8",
    )
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed"
    assert summary["test_ppl"] == pytest.approx(math.exp(summary["test_loss"]))
    assert math.isfinite(summary["lambda_max"])


def _fails(argv, tmp_path, capsys, *words):
    run = tmp_path / "bad_run"
    code, _, err = run_cli([*argv, f"hydra.run.dir={run}"], capsys)
    assert code == 2, err
    assert err.count("\n") == 1, err
    for w in words:
        assert w in err, err
    assert not run.exists()


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["dataset=modular_arithmetic", "dataset.p=1"], ["dataset.p=1"]),
        (["dataset=modular_arithmetic", "dataset.p=9", "dataset.operation=div"], ["not prime"]),
        (["dataset=modular_arithmetic", "dataset.train_fraction=1.0"], ["train_fraction"]),
        (["dataset=text", "model=mlp"], ["model=gpt"]),
        (["dataset=mnist1d", "model=gpt"], ["model=mlp or model=cnn1d"]),
        (["dataset=text", "dataset.block_size=80", "model.block_size=64"], ["context"]),
        (["dataset=text", "dataset.path=/nonexistent/corpus.txt"], ["does not exist"]),
        (["dataset=text", "dataset.train_path=/nonexistent/b.txt"], ["dataset.train_path="]),
    ],
)
def test_bad_language_model_input_is_one_line_exit_2(tmp_path, capsys, argv, words):
    model = [] if any(a.startswith("model=") for a in argv) else ["model=gpt"]
    _fails([*argv, *model], tmp_path, capsys, *words)


def test_bad_corpus_files_are_one_line_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    _fails(["dataset=text", "model=gpt", f"dataset.path={empty}"], tmp_path, capsys, "empty")
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("abc caf".encode() + "é".encode("latin-1") + b" more")
    _fails(["dataset=text", "model=gpt", f"dataset.path={latin}"], tmp_path, capsys, "offset 7")
    short = tmp_path / "short.txt"
    short.write_text("tiny corpus")
    _fails(["dataset=text", "model=gpt", f"dataset.path={short}"], tmp_path, capsys, "block_size")
    folder = tmp_path / "tokens"
    folder.mkdir()
    np.arange(200, dtype=np.uint16).tofile(folder / "train.bin")
    argv = ["dataset=text", "model=gpt", f"dataset.path={folder}", "dataset.vocab_size=300"]
    _fails(argv, tmp_path, capsys, "missing val.bin")
    (folder / "val.bin").write_bytes(b"\x01\x00\x02")
    _fails(argv, tmp_path, capsys, "3 bytes")
    np.arange(100, dtype=np.uint16).tofile(folder / "val.bin")
    _fails([*argv[:-1], "dataset.vocab_size=150"], tmp_path, capsys, "token id 199")


def test_sam_eval_reads_a_gpt_run(tmp_path):
    from sam_runner.evaluation.cli import main as sam_eval

    run = tmp_path / "run"
    train(compose(*TEXT_TINY, *GPT_TINY, "optimizer=sam", "trainer.steps=3"), run)
    assert (
        sam_eval([str(run), "metrics.hessian.num_samples=16", "metrics.hessian.max_iter=10"]) == 0
    )
    ev = json.loads((run / "eval.json").read_text())
    assert math.isfinite(ev["lambda_max"]) and 0 <= ev["train_acc"] <= 1
    assert ev["gen_gap"] == pytest.approx(ev["train_acc"] - ev["test_acc"])


def test_sam_landscape_reads_a_gpt_run(tmp_path):
    from sam_runner.landscape.cli import main as sam_landscape

    run = tmp_path / "run"
    train(compose(*TEXT_TINY, *GPT_TINY, "optimizer=base", "trainer.steps=3"), run)
    argv = [str(run), "landscape.points=5", "landscape.grid=3", "landscape.train_samples=16"]
    assert sam_landscape(argv) == 0
    assert (run / "landscape" / "slice_1d.csv").read_text().startswith("coordinate,train_loss")


@pytest.mark.slow
def test_the_ci_mini_beats_the_unigram_entropy_by_half_a_bit_per_byte(tmp_path):
    """2 layers, 64 channels, 300 steps on the built-in corpus (lm_sam_mini's AdamW job)."""
    ids = encode(builtin_text())
    train_ids = ids[: len(ids) - int(round(len(ids) * 0.1))]
    p = np.bincount(train_ids, minlength=256) / len(train_ids)
    unigram = float(-(p[p > 0] * np.log2(p[p > 0])).sum())
    cfg = compose("experiment=lm_sam_mini", "optimizer=base", "trainer.progress=none")
    summary = train(cfg, tmp_path / "run")
    assert summary["test_bpc"] <= unigram - 0.5, (summary["test_bpc"], unigram)


def test_preconditioned_sharpness_is_the_dense_top_eigenvalue_of_p_inverse_h():
    from sam_runner.losses import mean_loss
    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.metrics.preconditioned import adam_preconditioner, preconditioned_sharpness

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    x, y = torch.randn(32, 5), torch.randint(0, 3, (32,))
    loss = mean_loss("cross_entropy")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.99))
    for _ in range(5):
        opt.zero_grad()
        loss(model(x), y).backward()
        opt.step()
    with HessianOperator(model, loss, [(x, y)]) as op:
        out = preconditioned_sharpness(op, opt)
        dense = torch.stack([op(e) for e in torch.eye(op.numel)])
    diag, threshold = adam_preconditioner(opt, list(model.parameters()))
    top = torch.linalg.eigvals(torch.diag(1 / diag) @ dense).real.max()
    assert out["precond_lambda_max"] == pytest.approx(float(top), rel=1e-3)
    assert threshold == pytest.approx((2 + 2 * 0.9) / (0.1 * 0.01))
    assert out["precond_eos_ratio"] == pytest.approx(out["precond_lambda_max"] / threshold)
    assert preconditioned_sharpness(op, torch.optim.SGD(model.parameters(), lr=0.1)) == {}


def test_train_case_recases_the_training_split_alone(tmp_path, capsys):
    from sam_runner.data import build_data

    cfg = compose(*TEXT_TINY, *GPT_TINY, "dataset.train_case=upper")
    data = build_data(cfg.dataset, torch.device("cpu"), 0)
    lower = lambda ids: int(((ids >= ord("a")) & (ids <= ord("z"))).sum())  # noqa: E731
    x, y, _ = next(iter(data.train))
    assert lower(x) == lower(y) == 0 and int((x >= ord("A")).sum()) > 0
    assert lower(next(iter(data.test))[0]) > 0  # the first task's text, as written
    bad = [*TEXT_TINY, "model=gpt", "dataset.train_case=title"]
    _fails(bad, tmp_path, capsys, "upper or lower")
