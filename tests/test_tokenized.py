"""dataset.tokenizer and local corpora (.txt, .jsonl, .csv, .parquet) for dataset=text, tokenized
once into the token cache; dataset=table for sequence classification (a BERT-style classifier);
bad columns and vocabularies are one line, exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import HF_TINY, compose, run_cli, stopped_early_of

from sam_runner.data.text import load_corpus
from sam_runner.train import train

pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")

DOCS = [
    f"Document {i}: the loss landscape of model {i % 7} is flat, or sharp.\n" for i in range(80)
]
LLAMA = (
    "model.config={model_type: llama, hidden_size: 16, intermediate_size: 32, "
    "num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, "
    "max_position_embeddings: 32}"
)
BERT = (
    "model.config={model_type: bert, hidden_size: 16, intermediate_size: 32, "
    "num_hidden_layers: 1, num_attention_heads: 2, max_position_embeddings: 32, vocab_size: 256}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A small BPE tokenizer trained here and saved with save_pretrained (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["[PAD]", "[UNK]", "<eos>"])
    tok.train_from_iterator(DOCS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="<eos>"
    )
    folder = tmp_path_factory.mktemp("tok") / "bpe"
    fast.save_pretrained(folder)
    return folder, fast


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tables")
    rows = [{"text": d, "label": ["flat", "sharp"][i % 2], "id": i} for i, d in enumerate(DOCS)]
    with open(folder / "docs.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    table = datasets.Dataset.from_list(rows)
    table.to_csv(folder / "docs.csv", index=False)
    table.to_parquet(folder / "docs.parquet")
    (folder / "docs.txt").write_text("".join(DOCS))
    return folder


@pytest.mark.parametrize("name", ["docs.jsonl", "docs.csv", "docs.parquet"])
def test_table_corpora_are_their_text_column_in_bytes(tables, name):
    cfg = compose("dataset=text", f"dataset.path={tables / name}").dataset
    corpus = load_corpus(cfg)
    ids = np.concatenate([corpus.train, corpus.test])
    assert bytes(ids.astype(np.uint8)) == "\n\n".join(DOCS).encode("utf-8")
    assert corpus.vocab_size == 256


def test_a_tokenizer_tokenizes_once_into_the_cache(tables, tokenizer, tmp_path):
    folder, fast = tokenizer
    cfg = compose(
        "dataset=text", f"dataset.path={tables / 'docs.jsonl'}", f"dataset.tokenizer={folder}",
        f"dataset.data_dir={tmp_path}", "dataset.val_fraction=0.25",
    ).dataset  # fmt: skip
    corpus = load_corpus(cfg)
    expected = []
    for d in DOCS:
        expected += fast(d, add_special_tokens=False)["input_ids"] + [fast.eos_token_id]
    assert np.array_equal(np.concatenate([corpus.train, corpus.test]), np.array(expected))
    assert corpus.vocab_size == len(fast) and isinstance(corpus.train, np.memmap)
    (cached,) = (tmp_path / "tokens").iterdir()
    when = (cached / "train.bin").stat().st_mtime_ns
    again = load_corpus(cfg)  # read from the cache, not tokenized again
    assert (cached / "train.bin").stat().st_mtime_ns == when
    assert np.array_equal(again.train, corpus.train)


def test_a_tiny_llama_trains_on_tokenized_text(tables, tokenizer, tmp_path):
    folder, fast = tokenizer
    cfg = compose(
        "dataset=text", f"dataset.path={tables / 'docs.txt'}", f"dataset.tokenizer={folder}",
        f"dataset.data_dir={tmp_path}", "dataset.block_size=8", "dataset.batch_size=4",
        "trainer.steps=3", *HF_TINY, LLAMA,
    )  # fmt: skip
    summary = train(cfg, tmp_path / "run")
    assert summary["status"] == "completed" and "tokenizer" in summary["corpus"]
    assert summary["parameters"] > 0 and np.isfinite(summary["lambda_max"])


def test_a_bert_style_classifier_trains_on_a_table_and_resumes_exactly(tables, tmp_path):
    common = [
        "dataset=table", f"dataset.path={tables / 'docs.parquet'}", "dataset.block_size=24",
        "dataset.batch_size=8", *HF_TINY, BERT, "model.task=sequence_classification",
        "optimizer=sam",
    ]  # fmt: skip
    two = [*common, "trainer.epochs=2"]
    full = train(compose(*two), tmp_path / "full")
    assert full["status"] == "completed" and full["model_built"] == "hf:bert"
    assert 0 <= full["test_acc"] <= 1 and np.isfinite(full["lambda_max"])
    train(compose(*common, "trainer.epochs=1"), tmp_path / "split")
    stopped_early_of(tmp_path / "split", 2)
    train(compose(*two), tmp_path / "split")
    a, b = (
        torch.load(tmp_path / r / "checkpoints" / "last.pt")["model"] for r in ("full", "split")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


def _one_line_exit_2(tmp_path, capsys, argv, *needles):
    run = tmp_path / "run"
    code, _, err = run_cli([*argv, f"hydra.run.dir={run}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    assert not run.exists()


def test_a_missing_text_column_is_one_line(tables, tmp_path, capsys):
    argv = ["dataset=text", f"dataset.path={tables / 'docs.jsonl'}", "dataset.text_column=body",
            *HF_TINY, LLAMA]  # fmt: skip
    _one_line_exit_2(tmp_path, capsys, argv, "dataset.text_column='body'", "text, label, id")


def test_a_missing_label_column_is_one_line(tables, tmp_path, capsys):
    argv = ["dataset=table", f"dataset.path={tables / 'docs.csv'}", "dataset.label_column=y",
            *HF_TINY, BERT, "model.task=sequence_classification"]  # fmt: skip
    _one_line_exit_2(tmp_path, capsys, argv, "dataset.label_column='y' is not a column")


def test_a_tokenizer_larger_than_the_models_vocabulary_is_one_line(tables, tokenizer, tmp_path,
                                                                   capsys):  # fmt: skip
    folder, fast = tokenizer
    small = LLAMA.replace("max_position_embeddings: 32", "vocab_size: 64")
    argv = ["dataset=text", f"dataset.path={tables / 'docs.txt'}", f"dataset.tokenizer={folder}",
            f"dataset.data_dir={tmp_path / 'data'}", *HF_TINY, small]  # fmt: skip
    _one_line_exit_2(tmp_path, capsys, argv, f"{len(fast)} token ids", "vocabulary 64")


def test_a_tokenizer_that_is_not_there_is_one_line(tmp_path, capsys):
    argv = ["dataset=text", "dataset.tokenizer=sam-runner-tests/no-such-tokenizer", *HF_TINY, LLAMA]
    _one_line_exit_2(tmp_path, capsys, argv, "dataset.tokenizer=sam-runner-tests/no-such-tokenizer",
                     "huggingface-cli download")  # fmt: skip


def test_a_classifier_masks_the_pad_token_of_the_datas_tokenizer(tables, tmp_path):
    """The pad id comes from dataset.tokenizer (here 2), not the architecture's config: a
    right-padded row is classified as the row without its padding (a Llama classifier pools
    at each row's last non-pad token)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from sam_runner.models import build_model

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    specials = ["[UNK]", "<eos>", "[PAD]"]
    tok.train_from_iterator(DOCS, trainers.BpeTrainer(vocab_size=120, special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    fast.save_pretrained(tmp_path / "tok")
    cfg = compose(
        "dataset=table", f"dataset.path={tables / 'docs.jsonl'}",
        f"dataset.tokenizer={tmp_path / 'tok'}", "dataset.block_size=24", *HF_TINY, LLAMA,
        "model.task=sequence_classification",
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model(cfg.model, (24,), 2).eval()
    assert fast.pad_token_id == 2 and model.pad_token_id == 2 == model.hf.config.pad_token_id
    ids = fast("the loss landscape is flat")["input_ids"]
    padded = torch.full((1, 24), 2)
    padded[0, : len(ids)] = torch.tensor(ids)
    with torch.no_grad():
        assert torch.allclose(model(padded), model(torch.tensor([ids])), atol=1e-6)
