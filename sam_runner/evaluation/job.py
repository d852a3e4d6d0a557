"""One job measured at its final weights, into ``<job>/eval.json``.

The model is rebuilt by the run-folder reader (``rebuild.load``) from the job's
own stored config and its ``checkpoints/last.pt`` (loaded weights-only; its stored settings must
be the config's) or, with ``eval.weights=averaged``, its ``checkpoints/averaged.pt``, on the data
the job trained on (``build_data``: the same split, label noise and seed). Then, all in
float32, eval mode, without augmentation and with the plain cross-entropy (no label smoothing),
so that every job is measured alike:

- ``train_loss``, ``train_acc``: the whole training set, against the labels the job trained on
  (with label noise: the noisy ones), and ``train_loss_clean``, ``train_acc_clean`` against the
  clean labels when ``dataset.label_noise`` > 0;
- ``test_loss``, ``test_acc`` and the ECE family (``evaluate``: ``test_ece``,
  ``test_ece_adaptive``, ``test_mce``, ``test_brier``, ``test_nll``);
- ``gen_gap`` = train_acc − test_acc, ``gen_gap_loss`` = test_loss − train_loss;
- λ_max and every enabled measure of the ``metrics`` settings, by the run's own
  ``CurvatureTracker`` (its fixed seeded subset of the training set, its BatchNorm mode, the
  loss the job trained on), as at a run's final measurement;
- with ``metrics.corruptions.enabled``: the corruption keys (``robustness.corruption_values``).

eval.json (``eval_averaged.json`` for the averaged weights) is one flat object: these values,
``status`` (``completed`` or ``failed``, with the one-line ``error``), ``eval_time_s`` and
``eval_settings`` (the settings that produced it). It is written atomically, once, at the end;
nothing else in the job folder is touched.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf
from torch import nn

from ..errors import one_line, require
from ..lock import held_by, job_lock
from ..metrics.sharpness_dim import step_for
from ..rebuild import load
from ..rundir import INIT_WEIGHTS, RunDir, eval_file
from ..runfiles import InitialWeights, writable, write_json

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from omegaconf import DictConfig

    from ..data import Data


def measure_job(job_dir: Path | str, settings: dict) -> dict:
    """Measure one job and write its eval.json (a failure too: status failed, the error).

    Measured by several processes together (``sam-eval trainer.devices=N``): rank 0 takes the
    job's lock and writes, the others measure beside it (the curvature's samples split among
    them) and return nothing; rank 0 tells them whether the job is measured at all."""
    from .. import distributed

    job_dir, start = Path(job_dir), time.perf_counter()
    topo = distributed.current()
    if not topo.is_main:
        if _go(topo, False):
            measure(job_dir, settings)
        return {}
    if not writable(job_dir):  # this job fails alone, before measuring; the others go on
        _go(topo, False)
        return {"status": "failed", "error": f"job folder {job_dir} is not writable"}
    # a second sam-eval on the same folder measures the other jobs
    with job_lock(job_dir, "eval", "skip", "sam-eval") as held:
        if not _go(topo, held):
            return {"status": "skipped", "error": f"measured by {held_by(job_dir, 'eval')}"}
        return _measure_job(job_dir, settings, start)


def _go(topo, ok: bool) -> bool:
    """Rank 0's ``ok``, in every process measuring the job (one process: ``ok``)."""
    import torch

    return bool(topo.sum(torch.tensor(int(bool(ok) and topo.is_main), device=topo.device)))


def _measure_job(job_dir: Path, settings: dict, start: float) -> dict:
    try:
        record = {"status": "completed", **measure(job_dir, settings)}
    except Exception as e:  # Ctrl-C and SystemExit pass: nothing is written, a rerun redoes it
        record = {"status": "failed", "error": one_line(e)}
    record["eval_time_s"] = time.perf_counter() - start
    record["eval_settings"] = settings["eval_settings"]
    target = job_dir / eval_file(weights_of(settings))
    if record["status"] == "failed" and _completed(target):  # a good measurement is not lost
        record["error"] += f"; {target.name} keeps the measurement made before"
        return record
    try:
        write_json(target, record)
    except OSError as e:  # this job fails, in one line; the others are measured
        return {"status": "failed", "error": f"{target} cannot be written ({e.strerror or e})"}
    return record


def _completed(path: Path) -> bool:
    import json

    try:
        return json.loads(path.read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


def measure(job_dir: Path, settings: dict) -> dict:
    """The values of one job (see the module docstring); errors raised."""
    from .. import distributed
    from ..metrics import robustness

    metrics = OmegaConf.create(settings["metrics"])
    topo = distributed.current()  # several processes: each its own device
    device = topo.device or distributed.resolve_device(str(settings["trainer"]["device"]))
    say = phase_lines(job_dir, settings) if topo.is_main else (lambda _what: None)
    require(  # a density model has no accuracy: its measures are logged in training
        RunDir(job_dir).get("model.arch") != "pc",
        "a probabilistic circuit's run (model=pc): sam-eval measures classifiers; its "
        "train_ll, test_ll, test_bpd and hessian_trace_exact are in summary.json",
    )
    run = load(RunDir(job_dir), device, weights_of(settings), "sam-eval", strict=True)
    cfg, data, model = run.cfg, run.data, run.model
    say("the training and test sets")
    out = set_values(model, data, metrics, cfg.dataset, bars(settings))
    loss = str(OmegaConf.select(cfg, "trainer.loss", default="cross_entropy"))
    start = InitialWeights(job_dir / INIT_WEIGHTS).load()
    out.update(
        curvature_values(
            model, data, metrics, int(cfg.seed), loss, say, step_for(metrics, cfg), start
        )
    )
    if robustness.enabled(metrics):
        say("corruptions (metrics.corruptions)")
        values, sources = robustness.corruption_values(
            model, data, metrics, cfg.dataset, int(cfg.seed)
        )
        out.update(values)
        out["corruptions_source"] = "+".join(sources)
    return out


def phase_lines(job_dir: Path, settings: dict) -> Callable[[str], None]:
    """``say(what)``: with progress lines, one line as a job starts each part of its measurement
    (a job of ``metrics=full`` takes minutes: the log shows where it is); else nothing."""
    from ..progress import resolve_mode

    if resolve_mode(str(settings["trainer"]["progress"])) != "lines":
        return lambda _what: None
    root = settings.get("root")  # PATH of the command: jobs are named as on its other lines
    name = os.path.relpath(job_dir, root) if root else job_dir.name
    start = time.perf_counter()

    def say(what: str) -> None:
        took = time.perf_counter() - start
        print(f"sam-eval: {name}: {what} ... ({took:.0f}s)", file=sys.stderr, flush=True)

    return say


def bars(settings: dict) -> bool:
    """Batch bars within a job: only as a bar on a terminal (lines would flood the log)."""
    from ..progress import resolve_mode

    return resolve_mode(str(settings["trainer"]["progress"])) == "bar"


def weights_of(settings: dict) -> str:
    """``eval.weights``: last (checkpoints/last.pt) or averaged (checkpoints/averaged.pt)."""
    return str(settings["eval"].get("weights", "last"))


def set_values(
    model: nn.Module, data: Data, metrics: DictConfig, dataset_cfg: DictConfig, bar: bool = False
) -> dict:
    """Loss and accuracy of the whole training set and of the test set, the test set's ECE
    family, and the generalization gaps (see the module docstring)."""
    from .. import distributed
    from ..data.loaders import TensorLoader
    from ..metrics.evaluate import evaluate, predict

    dist, plain = distributed.current(), contextlib.nullcontext()
    ce = nn.CrossEntropyLoss(reduction="none")
    # token windows: the fixed training windows of train_plain (the pool of the measurement
    # subset would hold its logits, windows x tokens x vocabulary, all at once)
    if data.train_tensors is not None and len(data.input_shape) != 1:
        x, y = data.train_tensors
        loader = TensorLoader(x, y, 512, shuffle=False, transform=data.prepare)
    else:  # an image folder: streamed through its DataLoader, in order, without augmentation
        loader = data.train_plain
    logits, labels = predict(model, with_bar(loader, "sam-eval train", bar), plain, dist)
    out = {
        "train_loss": float(ce(logits, labels).mean()),
        "train_acc": float((logits.argmax(1) == labels).float().mean()),
    }
    if float(dataset_cfg.get("label_noise", 0.0) or 0.0) > 0:
        clean = data.clean_train_labels
        out["train_loss_clean"] = float(ce(logits, clean).mean())
        out["train_acc_clean"] = float((logits.argmax(1) == clean).float().mean())
    test = evaluate(
        model,
        with_bar(data.test, "sam-eval test", bar),
        ce,
        plain,
        dist,
        metrics,
        data.class_counts,
    )
    test.pop("reliability", None)
    out.update(test)
    out["gen_gap"] = out["train_acc"] - out["test_acc"]
    out["gen_gap_loss"] = out["test_loss"] - out["train_loss"]
    return out


def with_bar(loader: Iterable, desc: str, bar: bool = False) -> Iterator:
    """The loader's batches, with a progress bar on stderr when ``bar``."""
    from ..progress import Counter

    counter = Counter(len(loader), desc, "bar" if bar else "none", unit="batches")
    try:
        for batch in loader:
            yield batch
            counter.update(1)
    finally:
        counter.close()


def curvature_values(
    model: nn.Module,
    data: Data,
    metrics: DictConfig,
    seed: int,
    loss: str = "cross_entropy",
    say: Callable[[str], None] | None = None,
    step: dict | None = None,
    init_state: dict | None = None,
) -> dict:
    """λ_max and the enabled measures, as the run's final measurement takes them: of the loss
    the job trained on (``trainer.loss``: an MSE job's Hessian is the MSE's), without an
    optimizer (no eos_ratio, a property of training, not of the weights); ``say``: told as
    each measure starts; ``step``: the job's SGD step (sharpness_dim), ``init_state``: its
    weights at step 0 (dist_from_init)."""
    from ..losses import mean_loss
    from ..metrics.tracker import CurvatureTracker

    tracker = CurvatureTracker(metrics, model, data, None, seed, loss_fn=mean_loss(loss))
    if not tracker.enabled:
        return tracker.summary_extras()
    tracker.note, tracker.step, tracker.init_state = say, step, init_state
    if say is not None:
        say(f"the Hessian's top eigenvalue(s) on {tracker.num_samples()} training samples")
    out = tracker.measure(final=True)
    out.update(tracker.summary_extras())
    return out
