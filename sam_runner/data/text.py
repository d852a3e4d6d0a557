"""``dataset=text``: next-token prediction on a corpus (docs/language_models.md).

A corpus is a 1-D array of token ids: the bytes of a UTF-8 text file (byte-level, 256 ids), the
built-in corpus (the Python documentation topics that ship with Python, ``pydoc_data.topics``,
so the track runs offline anywhere), or a nanoGPT-style folder of ``train.bin``/``val.bin``
(uint16 ids, memory-mapped: never read whole). A text's contiguous tail
(``dataset.val_fraction``) is its test split; a folder's is ``val.bin``.

``dataset.train_path`` trains on a second corpus (its training split) while the test split stays
``dataset.path``'s: post-training on new text, measured on the old (``lm_midtraining_mini``).
``python_source`` there is the second built-in corpus, the source of a fixed list of standard
library modules: code rather than prose, shipped with every Python.

Training batches are windows of ``block_size`` + 1 tokens at random offsets, drawn from
``torch.Generator(seed * 100003 + epoch)``: an epoch's batches depend on (seed, epoch) alone, so a
resumed run sees the same ones. An "epoch" is as many steps as the training split has
batch-sized stretches of tokens. Evaluation, curvature and ``sam-eval`` use fixed windows
(non-overlapping, evenly spaced; at most ``dataset.eval_windows`` of the test split, by default
as many as fit a memory budget for their logits (``eval_windows``), and at most
``MEASURE_WINDOWS`` of the training split for the measurement subset).
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError, integer, number, require
from ..registry import DATASETS
from . import Data, tokenized
from .folder import subset_indices

BYTE_VOCAB = 256
EVAL_WINDOWS = 256  # test windows evaluated at most when dataset.eval_windows is unset
# ... and at most as many as keep their float32 logits (windows x block_size x vocabulary x 4
# bytes; metrics/evaluate.py holds them at once for the loss and ECE) within this: GPT-2's
# vocabulary at context 256 fits 20 windows, byte-level text 256 up to a context of 4,096
EVAL_LOGITS_BYTES = 1 << 30
MEASURE_WINDOWS = 4096  # training windows the measurement subset draws from (a fixed, even spread)
CHUNK = 1 << 24  # ids read at a time when a .bin file is scanned (range check, hash)


class Corpus:
    """The two splits of a corpus (numpy arrays or memmaps of ids), its vocabulary size, and
    what summary.json records of it (``corpus_bytes``, ``corpus_sha256``)."""

    def __init__(self, train, test, vocab_size: int, nbytes: int, sha256: str, source: str):
        self.train, self.test, self.vocab_size = train, test, vocab_size
        self.nbytes, self.sha256, self.source = nbytes, sha256, source
        self.trained_on = None  # dataset.train_path's summary, when training reads another corpus

    def summary(self) -> dict:
        out = {"corpus_bytes": self.nbytes, "corpus_sha256": self.sha256, "corpus": self.source}
        if self.trained_on:
            out.update({f"train_{k}": v for k, v in self.trained_on.items()})
        return out


def builtin_text() -> str:
    """The built-in corpus: every topic of Python's own help() pages, in key order."""
    from pydoc_data.topics import topics

    return "".join(topics[k] for k in sorted(topics))


PYTHON_SOURCE = "python_source"  # dataset.train_path: the second built-in corpus
SOURCE_MODULES = (  # pure-Python standard library modules, present on every CPython >= 3.10
    "argparse", "calendar", "configparser", "dataclasses", "difflib", "fractions", "heapq",
    "shlex", "statistics", "string", "textwrap",
)  # fmt: skip


def python_source_text() -> str:
    """The second built-in corpus: the source files of ``SOURCE_MODULES``, in that order."""
    import importlib

    return "".join(
        Path(importlib.import_module(m).__file__).read_text(encoding="utf-8")
        for m in SOURCE_MODULES
    )


def encode(text: str) -> np.ndarray:
    """Byte-level tokens: the UTF-8 bytes of ``text`` (ids 0-255)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def decode(ids) -> str:
    """The text of byte-level tokens (the inverse of ``encode``)."""
    return bytes(np.asarray(ids, dtype=np.uint8).tolist()).decode("utf-8")


def _byte_corpus(data: bytes, name: str, source: str, val_fraction: float) -> Corpus:
    require(len(data) > 0, f"{name} is empty; give a UTF-8 text file with some text in it")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(
            f"{name} is not UTF-8 text (invalid byte at offset {e.start}); give a UTF-8 file, "
            "or a folder with train.bin/val.bin token ids"
        ) from None
    ids = np.frombuffer(data, dtype=np.uint8)
    cut = len(ids) - int(round(len(ids) * val_fraction))
    digest = hashlib.sha256(data).hexdigest()
    return Corpus(ids[:cut], ids[cut:], BYTE_VOCAB, len(data), digest, source)


def _bin_vocab(folder: Path, cfg) -> int:
    given = cfg.get("vocab_size")
    meta = folder / "meta.pkl"
    if given is None and meta.is_file():
        with open(meta, "rb") as f:
            given = pickle.load(f).get("vocab_size")
    require(
        given is not None,
        f"dataset.path={folder}: no vocabulary size; put meta.pkl (with vocab_size) beside "
        "train.bin or set dataset.vocab_size",
    )
    return integer(
        "dataset.vocab_size", given, "an integer in [2, 65536] (uint16 ids)", lambda v: 2 <= v
    )


def _scan(ids: np.ndarray, vocab: int, name: Path, digest) -> None:
    """A pass over a memory-mapped split in chunks: ids below the vocabulary size, and the hash."""
    for start in range(0, len(ids), CHUNK):
        chunk = np.asarray(ids[start : start + CHUNK])
        digest.update(chunk.tobytes())
        top = int(chunk.max()) if len(chunk) else 0
        require(
            top < vocab,
            f"{name} holds token id {top} >= the vocabulary size {vocab}; set dataset.vocab_size "
            "(or meta.pkl) to the tokenizer's",
        )


_SCANNED: dict = {}  # (files' path, size, mtime, vocab) -> sha256: the preflight's pass, reused


def _scanned(folder: Path, splits: dict, vocab: int) -> str:
    key = tuple(
        (
            str(folder / f"{s}.bin"),
            (folder / f"{s}.bin").stat().st_size,
            (folder / f"{s}.bin").stat().st_mtime_ns,
        )
        for s in splits
    ) + (vocab,)
    if key not in _SCANNED:
        digest = hashlib.sha256()
        for split, ids in splits.items():
            _scan(ids, vocab, folder / f"{split}.bin", digest)
        _SCANNED[key] = digest.hexdigest()
    return _SCANNED[key]


def _bin_corpus(folder: Path, cfg) -> Corpus:
    splits = {}
    for split in ("train", "val"):
        f = folder / f"{split}.bin"
        require(
            f.is_file(),
            f"dataset.path={folder}: missing {f.name} (a token folder holds train.bin and "
            "val.bin, uint16 ids as nanoGPT's prepare.py writes them)",
        )
        size = f.stat().st_size
        require(
            size > 0 and size % 2 == 0,
            f"{f} has {size} bytes: uint16 token ids take 2 bytes each (a non-empty, even size)",
        )
        splits[split] = np.memmap(f, dtype=np.uint16, mode="r")
    vocab = _bin_vocab(folder, cfg)
    digest = _scanned(folder, splits, vocab)
    n = sum(ids.nbytes for ids in splits.values())
    return Corpus(splits["train"], splits["val"], vocab, n, digest, str(folder))


def val_fraction(cfg) -> float:
    return number(
        "dataset.val_fraction",
        cfg.get("val_fraction", 0.1),
        "a fraction in (0, 1) (the text's tail held out as the test split)",
        lambda f: 0 < f < 1,
    )


def load_corpus(cfg) -> Corpus:
    """The corpus ``dataset.path`` names (unset: the built-in one), checked; with
    ``dataset.train_path``, its training split replaced by that corpus's."""
    corpus = _corpus_at(cfg, cfg.get("path"), "dataset.path")
    other = cfg.get("train_path")
    if other in (None, ""):
        return corpus
    second = _corpus_at(cfg, other, "dataset.train_path")
    require(
        second.vocab_size == corpus.vocab_size,
        f"dataset.train_path={other} has {second.vocab_size} token ids and dataset.path "
        f"{corpus.vocab_size}; train and test on corpora of one tokenizer",
    )
    corpus.train, corpus.trained_on = second.train, second.summary()
    return corpus


def _corpus_at(cfg, path, key: str) -> Corpus:
    fraction = val_fraction(cfg)
    is_folder = path not in (None, "", PYTHON_SOURCE) and Path(str(path)).expanduser().is_dir()
    if not is_folder and tokenized.applies(cfg, path):  # a tokenizer, or a table of documents
        builtin = None
        if key == "dataset.train_path" and path == PYTHON_SOURCE:
            builtin = (python_source_text(), "builtin:python_source")
        elif path in (None, ""):
            builtin = (builtin_text(), "builtin:pydoc_data.topics")
        return Corpus(*tokenized.corpus(cfg, path, key, fraction, builtin))
    if key == "dataset.train_path" and path == PYTHON_SOURCE:
        data = python_source_text().encode("utf-8")
        return _byte_corpus(data, "the built-in source corpus", "builtin:python_source", fraction)
    if path in (None, ""):
        data = builtin_text().encode("utf-8")
        return _byte_corpus(data, "the built-in corpus", "builtin:pydoc_data.topics", fraction)
    p = Path(str(path)).expanduser()
    require(
        p.exists(),
        f"{key}={path} does not exist; give a UTF-8 text file or a folder with "
        "train.bin/val.bin"
        + (f" ({PYTHON_SOURCE}: the built-in source corpus)" if key != "dataset.path" else
           " (unset: the built-in corpus)"),
    )  # fmt: skip
    if p.is_dir():
        return _bin_corpus(p, cfg)
    return _byte_corpus(p.read_bytes(), f"{key}={path}", str(p), fraction)


def block_size(cfg) -> int:
    return integer(
        "dataset.block_size",
        cfg.get("block_size", 64),
        "an integer >= 1 (tokens per window)",
        lambda b: b >= 1,
    )


def _check_fits(corpus: Corpus, t: int) -> None:
    for split, ids in (("training", corpus.train), ("test", corpus.test)):
        require(
            len(ids) > t,
            f"dataset.block_size={t} is larger than the corpus's {split} split ({len(ids)} "
            f"tokens); use a block_size below {len(ids)} or a larger corpus",
        )


def fixed_windows(ids, t: int, cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """At most ``cap`` non-overlapping windows (inputs, next-token targets), evenly spaced over
    ``ids`` (deterministic: every run and sam-eval measure the same ones)."""
    count = (len(ids) - 1) // t
    starts = np.linspace(0, count - 1, min(cap, count)).round().astype(np.int64) * t
    return _gather(ids, torch.as_tensor(starts), t)


def _gather(ids, starts: torch.Tensor, t: int):
    rows = starts.numpy()[:, None] + np.arange(t + 1)
    w = torch.from_numpy(np.asarray(ids[rows]).astype(np.int64))
    return w[:, :-1], w[:, 1:]


class RandomWindows:
    """Training batches ``(x, y, idx)``: ``batch_size`` windows at random offsets (idx: the
    offsets), drawn from a generator seeded by (seed, epoch); under data parallelism each
    process takes its strided share of every global batch."""

    def __init__(self, ids, t, batch_size, steps, seed, rank=0, world=1):
        self.ids, self.t, self.batch_size, self.steps = ids, t, batch_size, steps
        self.seed, self.rank, self.world = seed, rank, world
        self.epoch, self.device, self.weights = 0, None, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def share(self, rank: int, world: int) -> None:
        """Take the ``rank``-th of ``world`` strided shares of every global batch from now on.

        Args:
            rank: this process's place among the processes that split each batch.
            world: how many processes split each batch.
        """
        self.rank, self.world = rank, world

    def __len__(self):
        return self.steps

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        for _ in range(self.steps):
            starts = torch.randint(0, len(self.ids) - self.t, (self.batch_size,), generator=g)
            starts = starts[self.rank :: self.world]
            x, y = _gather(self.ids, starts, self.t)
            yield x.to(self.device), y.to(self.device), starts.to(self.device)


class FixedWindows:
    """Evaluation batches ``(x, y, idx)`` over fixed windows, in order."""

    def __init__(self, x, y, batch_size, rank=0, world=1):
        self.x, self.y, self.batch_size, self.rank, self.world = x, y, batch_size, rank, world
        self.device = None

    def set_epoch(self, epoch: int) -> None:
        pass

    def __len__(self):
        return -(-len(self.y) // self.batch_size)

    def __iter__(self):
        for i in range(0, len(self.y), self.batch_size):
            idx = torch.arange(i, min(i + self.batch_size, len(self.y)))[self.rank :: self.world]
            yield self.x[idx].to(self.device), self.y[idx].to(self.device), idx.to(self.device)


def eval_windows(cfg, vocab: int) -> int:
    """``dataset.eval_windows``, or unset: ``EVAL_WINDOWS`` capped by the logits' memory
    (``EVAL_LOGITS_BYTES``), at least one window."""
    given = cfg.get("eval_windows")
    if given is not None:
        return integer(
            "dataset.eval_windows", given, "an integer >= 1 (or null: automatic)", lambda n: n >= 1
        )
    per_window = block_size(cfg) * vocab * 4
    return max(1, min(EVAL_WINDOWS, EVAL_LOGITS_BYTES // per_window))


CASES = {  # dataset.train_case: the ASCII letters' ids moved (a second task; the test split as is)
    "upper": (ord("a"), ord("z"), ord("A") - ord("a")),
    "lower": (ord("A"), ord("Z"), ord("a") - ord("A")),
}


def train_case(cfg) -> str | None:
    """``dataset.train_case``, checked: null (the text as written), upper or lower."""
    case = cfg.get("train_case")
    if case in (None, "", "none"):
        return None
    require(
        case in CASES,
        f"dataset.train_case={case!r} is unknown; choose null (as written), {' or '.join(CASES)}",
    )
    require(
        tokenized.tokenizer_name(cfg) is None,
        f"dataset.train_case={case} changes the letters of byte-level text; dataset.tokenizer "
        "makes other tokens (unset it)",
    )
    path = cfg.get("path")
    require(
        path in (None, "") or not Path(str(path)).is_dir(),
        f"dataset.train_case={case} changes the letters of byte-level text; dataset.path={path} "
        "holds token ids (train.bin/val.bin) whose letters are not known",
    )
    return str(case)


def recased(ids, case: str) -> np.ndarray:
    """Byte-level ids with the ASCII letters in ``case`` (a second task on the same corpus:
    fine-tuning on it, a model forgets the mixed-case text its test split still measures)."""
    first, last, shift = CASES[case]
    out = np.array(ids, dtype=np.int16)
    letters = (out >= first) & (out <= last)
    out[letters] += shift
    return out.astype(np.uint8)


def _text_keys(cfg) -> None:
    block_size(cfg)
    val_fraction(cfg)
    eval_windows(cfg, BYTE_VOCAB)
    train_case(cfg)
    require(
        cfg.get("val_split", 0) in (0, None),
        f"dataset.val_split={cfg.get('val_split')} does not apply to dataset=text (its test "
        "split is the corpus's tail, dataset.val_fraction); set it to 0",
    )
    require(
        cfg.batch_size != "full",
        "dataset.batch_size=full does not apply to dataset=text; give a number of windows",
    )
    _check_fits(load_corpus(cfg), block_size(cfg))  # the corpus itself, before anything is written


def text_shape(cfg) -> tuple[tuple, int]:
    """(input shape, vocabulary size) before anything is read but the vocabulary's source."""
    path = cfg.get("path")
    vocab = BYTE_VOCAB
    if path not in (None, "") and Path(str(path)).is_dir():
        vocab = _bin_vocab(Path(str(path)), cfg)
    elif tokenized.tokenizer_name(cfg) is not None:
        vocab = tokenized.vocab_size(cfg)
    return (block_size(cfg),), vocab


@DATASETS.register(
    "text",
    "next-token prediction on a text file, a train.bin/val.bin folder or the built-in corpus",
    check=_text_keys,
    tensors=False,
    input_shape=None,
    num_classes=None,
    shape_of=text_shape,
)
def text(cfg, seed, rank, world) -> Data:
    _text_keys(cfg)
    corpus, t = load_corpus(cfg), block_size(cfg)
    case = train_case(cfg)
    if case is not None:  # the training split alone: the test split stays the first task
        corpus.train = recased(corpus.train, case)
    bs = int(cfg.batch_size)
    steps = cfg.get("steps_per_epoch") or max(1, len(corpus.train) // (bs * t))
    cap = eval_windows(cfg, corpus.vocab_size)
    xt, yt = fixed_windows(corpus.test, t, cap)
    xm, ym = fixed_windows(corpus.train, t, MEASURE_WINDOWS)
    plain = subset_indices(len(ym), cap, seed)  # sam-eval's training-set numbers: these windows
    eval_bs = max(bs, 64)
    return Data(
        RandomWindows(corpus.train, t, bs, steps, seed, rank, world),
        FixedWindows(xt, yt, eval_bs, rank, world),
        corpus.vocab_size,
        (t,),
        steps * bs,
        train_tensors=(xm, ym),
        train_plain=FixedWindows(xm[plain], ym[plain], eval_bs, rank, world),
        corpus=corpus.summary(),
    )
