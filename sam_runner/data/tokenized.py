"""Tokenizers and local corpora for ``dataset=text``, and ``dataset=table`` (text + label) for
sequence classification (docs/language_models.md#tokenizers-and-corpora).

``dataset.tokenizer`` names a ``transformers`` tokenizer (a hub id in the Hugging Face cache, or
a folder; read offline: ``huggingface-cli download ID`` fetches one); unset, tokens are bytes as
everywhere else. ``dataset.path`` may be a text file (``.txt`` or any UTF-8 file) or a table:
JSON Lines (``.jsonl``/``.json``), ``.csv``, Parquet (``.parquet``) or Arrow (``.arrow``), read
with ``datasets.load_dataset`` on the local file, its documents in ``dataset.text_column``.

A corpus is tokenized once: the ids go into the token cache, ``<data_dir>/tokens/<key>/`` with
``train.bin`` and ``val.bin`` (uint16, or uint32 beyond 65,536 ids) and ``meta.json``, the key a
hash of the file's bytes, the tokenizer (its name and vocabulary) and the split settings; every
later run memory-maps them, as a nanoGPT folder. Documents are joined with the tokenizer's end of
text token (none for bytes: the documents are separated by a blank line).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError, integer, number, one_line, require
from ..paths import folder_or_hub_id
from ..registry import DATASETS
from . import Arrays

TABLES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet",
          ".arrow": "arrow"}  # fmt: skip
INSTALL = "pip install -e '.[hf]'"
BYTE_VOCAB = 256  # text.py's
_TOKENIZERS: dict = {}
_TABLES: dict = {}


def tokenizer_name(cfg) -> str | None:
    name = cfg.get("tokenizer")
    return None if name in (None, "", "bytes") else str(name)


def load_tokenizer(name: str):
    """The tokenizer ``dataset.tokenizer`` names, read offline, or one line saying how to get it."""
    if name in _TOKENIZERS:
        return _TOKENIZERS[name]
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError(f"dataset.tokenizer needs the transformers library; {INSTALL}") from None
    ref, local = folder_or_hub_id(
        "dataset.tokenizer", name, "a folder a tokenizer was saved to (save_pretrained) or a hub id"
    )
    try:
        tok = AutoTokenizer.from_pretrained(ref, local_files_only=True)
    except (OSError, ValueError) as e:
        where = "the folder" if local else "the Hugging Face cache"
        raise UserError(
            f"dataset.tokenizer={name}: not found in {where} ({one_line(e)[:80]}); download it "
            f"once (`huggingface-cli download {name}`) or give a folder"
        ) from None
    _TOKENIZERS[name] = tok
    return tok


def pad_id(name: str | None) -> int:
    """The id ``dataset=table`` right-pads its rows with, and the id a ``model=hf`` classifier
    masks: the pad token of the tokenizer ``name``, else 0 (bytes: 0).

    Args:
        name: the tokenizer (``dataset.tokenizer``), None for bytes.
    """
    if name is None:
        return 0
    pad = load_tokenizer(name).pad_token_id
    return 0 if pad is None else int(pad)


def vocab_size(cfg) -> int | None:
    """The tokenizer's vocabulary (None: bytes)."""
    name = tokenizer_name(cfg)
    return None if name is None else len(load_tokenizer(name))


def applies(cfg, path) -> bool:
    """Whether ``dataset=text`` reads this corpus here: a tokenizer is set, or the file is a
    table."""
    if tokenizer_name(cfg) is not None:
        return True
    return path not in (None, "") and Path(str(path)).suffix.lower() in TABLES


def read_table(path: Path, columns: list[str], key: str):
    """The named columns of a local table, read with ``datasets.load_dataset``."""
    stat = path.stat()
    cache_key = (str(path), stat.st_mtime_ns, stat.st_size)
    if cache_key not in _TABLES:
        try:
            import datasets
        except ImportError:
            raise UserError(f"{key}={path}: tables are read with datasets; {INSTALL}") from None
        datasets.disable_progress_bars()  # a local file: no bars between a run's lines
        datasets.logging.set_verbosity_error()
        try:
            table = datasets.load_dataset(
                TABLES[path.suffix.lower()], data_files=str(path), split="train"
            )
        except Exception as e:
            raise UserError(f"{key}={path} cannot be read as a table ({one_line(e)})") from None
        _TABLES[cache_key] = table
    table = _TABLES[cache_key]
    for name, column in columns:
        require(
            column in table.column_names,
            f"{name}={column!r} is not a column of {path}; its columns are "
            f"{', '.join(table.column_names[:10])}",
        )
    return table


def documents(cfg, path, key: str, builtin=None) -> tuple[list[str], bytes, str]:
    """(the documents, the bytes they came from, a source label) of a corpus; ``builtin``: (text,
    label) of a built-in corpus (text.py's)."""
    if builtin is not None:
        text, label = builtin
        return [text], text.encode("utf-8"), label
    p = Path(str(path)).expanduser()
    require(p.is_file(), f"{key}={path} does not exist; give a text file or a table")
    raw = p.read_bytes()
    if p.suffix.lower() not in TABLES:
        try:
            return [raw.decode("utf-8")], raw, str(p)
        except UnicodeDecodeError as e:
            raise UserError(f"{key}={path} is not UTF-8 text (offset {e.start})") from None
    column = str(cfg.get("text_column", "text"))
    table = read_table(p, [("dataset.text_column", column)], key)
    docs = [str(t) for t in table[column] if t is not None]
    require(docs, f"{key}={path}: the column {column!r} holds no text")
    return docs, raw, str(p)


def _ids(docs: list[str], tok) -> np.ndarray:
    if tok is None:  # bytes: the documents separated by a blank line
        return np.frombuffer("\n\n".join(docs).encode("utf-8"), dtype=np.uint8).copy()
    eos = tok.eos_token_id
    out = []
    for doc in docs:
        # long texts in paragraph-sized pieces (the tokenizer's speed; no token spans a blank line)
        pieces = [s for s in re.split(r"(?<=\n\n)", doc) if s] if len(doc) > 100_000 else [doc]
        for ids in tok(pieces, add_special_tokens=False)["input_ids"]:
            out.extend(ids)
        if eos is not None and len(docs) > 1:
            out.append(eos)
    return np.asarray(out, dtype=np.int64)


def corpus(cfg, path, key: str, fraction: float, builtin=None) -> tuple:
    """(train ids, test ids, vocabulary size, bytes, sha256, source) of ``path`` (or the
    ``builtin`` corpus) under ``dataset.tokenizer``: tokenized once into the token cache, then
    memory-mapped (text.py makes its Corpus of them)."""
    docs, raw, source = documents(cfg, path, key, builtin)
    name = tokenizer_name(cfg)
    tok = None if name is None else load_tokenizer(name)
    vocab = BYTE_VOCAB if tok is None else len(tok)
    digest = hashlib.sha256(raw).hexdigest()
    if tok is None:
        ids = _ids(docs, None)
        cut = len(ids) - int(round(len(ids) * fraction))
        return ids[:cut], ids[cut:], vocab, len(raw), digest, source
    spec = json.dumps([digest, name, vocab, str(cfg.get("text_column", "text")), fraction])
    folder = Path(str(cfg.get("data_dir", "."))).expanduser() / "tokens"
    folder = folder / hashlib.sha256(spec.encode()).hexdigest()[:16]
    dtype = np.uint16 if vocab <= 65536 else np.uint32
    if not (folder / "meta.json").is_file():
        ids = _ids(docs, tok)
        cut = len(ids) - int(round(len(ids) * fraction))
        _write_cache(folder, {"train": ids[:cut], "val": ids[cut:]}, dtype, spec, vocab)
    train, test = (np.memmap(folder / f"{s}.bin", dtype=dtype, mode="r") for s in ("train", "val"))
    return train, test, vocab, len(raw), digest, f"{source} (tokenizer {name})"


def _write_cache(folder: Path, splits: dict, dtype, spec: str, vocab: int) -> None:
    """The splits as .bin files and meta.json, written into a fresh folder renamed into place."""
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for split, ids in splits.items():
        require(len(ids) > 0, f"the corpus's {split} split is empty; give a longer corpus")
        ids.astype(dtype).tofile(tmp / f"{split}.bin")
    meta = {"spec": json.loads(spec), "vocab_size": vocab, "dtype": np.dtype(dtype).name}
    (tmp / "meta.json").write_text(json.dumps(meta))
    try:
        tmp.rename(folder)
    except OSError:  # another process wrote it first: theirs is the same
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- dataset=table
def _table_keys(cfg) -> tuple[int, float]:
    length = integer(
        "dataset.block_size", cfg.get("block_size", 64), "an integer >= 1 (tokens per text)",
        lambda b: b >= 1,
    )  # fmt: skip
    fraction = number(
        "dataset.test_fraction", cfg.get("test_fraction", 0.2),
        "a fraction in (0, 1) (held out when there is no dataset.test_path)", lambda f: 0 < f < 1,
    )  # fmt: skip
    return length, fraction


def _columns(cfg) -> list:
    return [
        ("dataset.text_column", str(cfg.get("text_column", "text"))),
        ("dataset.label_column", str(cfg.get("label_column", "label"))),
    ]


def _table_at(cfg, key: str):
    path = cfg.get(key.split(".", 1)[1])
    require(
        path not in (None, "", "???"),
        "dataset=table needs dataset.path=<a .jsonl, .csv, .parquet or .arrow file of text and "
        "labels>",
    )
    p = Path(str(path)).expanduser()
    require(p.is_file(), f"{key}={path} does not exist")
    require(
        p.suffix.lower() in TABLES,
        f"{key}={path}: give a table ({', '.join(TABLES)})",
    )
    return read_table(p, _columns(cfg), key)


def _labels(cfg):
    """The sorted label values of both splits (the classes 0..C-1)."""
    label = _columns(cfg)[1][1]
    values = list(_table_at(cfg, "dataset.path")[label])
    if cfg.get("test_path") not in (None, ""):
        values += list(_table_at(cfg, "dataset.test_path")[label])
    classes = sorted(set(values), key=str)
    require(len(classes) >= 2, f"dataset.label_column={label!r} has a single value; need two")
    return classes


def table_shape(cfg) -> tuple[tuple, int]:
    length, _ = _table_keys(cfg)
    return (length,), len(_labels(cfg))


def _encode(texts, cfg, length: int) -> torch.Tensor:
    """[N, length] token ids, truncated and right-padded with ``pad_id`` (the id model=hf
    masks)."""
    name = tokenizer_name(cfg)
    out = torch.zeros(len(texts), length, dtype=torch.long)
    if name is None:
        for i, t in enumerate(texts):
            ids = list(str(t).encode("utf-8"))[:length]
            out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out
    tok = load_tokenizer(name)
    out.fill_(pad_id(name))
    for i, ids in enumerate(
        tok([str(t) for t in texts], truncation=True, max_length=length)["input_ids"]
    ):
        out[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def _check_table(cfg) -> None:
    _table_keys(cfg)
    _labels(cfg)
    if tokenizer_name(cfg) is not None:
        load_tokenizer(tokenizer_name(cfg))


@DATASETS.register(
    "table",
    "sequence classification on a local table of text and labels (.jsonl, .csv, .parquet)",
    check=_check_table,
    input_shape=None,
    num_classes=None,
    shape_of=table_shape,
)
def table(cfg) -> Arrays:
    length, fraction = _table_keys(cfg)
    text, label = (c for _, c in _columns(cfg))
    classes = _labels(cfg)
    index = {str(c): i for i, c in enumerate(classes)}

    def split(key):
        t = _table_at(cfg, key)
        y = torch.tensor([index[str(v)] for v in t[label]], dtype=torch.long)
        return _encode(t[text], cfg, length), y

    x, y = split("dataset.path")
    if cfg.get("test_path") not in (None, ""):
        xt, yt = split("dataset.test_path")
    else:
        g = torch.Generator().manual_seed(int(cfg.get("split_seed", 0)) + 15485863)
        order = torch.randperm(len(y), generator=g)
        cut = len(y) - max(1, int(round(len(y) * fraction)))
        (x, xt), (y, yt) = (x[order[:cut]], x[order[cut:]]), (y[order[:cut]], y[order[cut:]])
    return Arrays(x, y, xt, yt, len(classes))
