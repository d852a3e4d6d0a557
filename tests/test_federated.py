"""federated=fedavg|fedfft|fedvssam: the properties that would fail on a wrong simulation, on a
tiny MLP over MNIST-1D, trained in process by the real train(cfg)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT, compose, run_cli
from folder_files import CLASSES, write_tree

from sam_runner.data import build_data
from sam_runner.errors import UserError
from sam_runner.federated import rounds
from sam_runner.federated.algorithms import FedAvg, low_frequency_removed_
from sam_runner.federated.measures import Observer
from sam_runner.federated.split import histograms, skew, split_clients
from sam_runner.models import build_model
from sam_runner.registry import FEDERATED
from sam_runner.rundir import CHECKPOINT, CLIENTS, INIT_WEIGHTS, METRICS, SUMMARY
from sam_runner.train import train

FAST = [
    "dataset.num_samples=1000",
    "model=mlp",
    "model.hidden=[32]",
    "metrics=off",
    "trainer.progress=none",
    "scheduler=constant",
]
FED = ["federated.clients=4", "federated.rounds=2", "federated.local_steps=3"]


def _train(tmp_path, name, *overrides):
    cfg = compose(*FAST, *overrides)
    summary = train(cfg, tmp_path / name)
    return summary, _weights(tmp_path / name)


def _weights(run_dir):
    return torch.load(run_dir / CHECKPOINT, weights_only=True)["model"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_config_group_is_the_registry():
    from conftest import ROOT

    assert {p.stem for p in (ROOT / "conf" / "federated").glob("*.yaml")} == set(FEDERATED)
    assert compose().federated.name == "none"


@pytest.mark.parametrize("momentum,epochs", [(0.0, 2), (0.9, 1)])
def test_fedavg_with_one_client_is_centralized_training_bit_for_bit(tmp_path, momentum, epochs):
    # momentum persists across a centralized run's epochs; a client's starts afresh each round
    common = ["optimizer=sam", f"base_optimizer.momentum={momentum}", "dataset.batch_size=100"]
    central, w_central = _train(tmp_path, "c", *common, f"trainer.epochs={epochs}")
    steps = central["step"] // epochs  # the batches of one epoch
    fed = ["federated=fedavg", "federated.clients=1", "federated.participation=1"]
    one, w_one = _train(
        tmp_path, "f", *common, *fed, f"federated.rounds={epochs}", f"federated.local_steps={steps}"
    )
    assert _same(w_central, w_one)
    assert one["test_acc"] == central["test_acc"] and one["step"] == central["step"]


def test_one_client_is_not_centralized_training_under_a_schedule_that_moves(tmp_path):
    """#58 item 4: the exactness needs scheduler=constant; the default cosine steps once a
    round in a federated run and every step in a centralized one, and the weights part."""
    common = ["optimizer=sam", "base_optimizer.momentum=0", "dataset.batch_size=100"]
    common += ["scheduler=cosine", "trainer.epochs=2"]
    central, w_central = _train(tmp_path, "c", *common)
    fed = ["federated=fedavg", "federated.clients=1", "federated.participation=1"]
    fed += ["federated.rounds=2", f"federated.local_steps={central['step'] // 2}"]
    _, w_one = _train(tmp_path, "f", *common, *fed)
    assert not _same(w_central, w_one)
    page = (ROOT / "docs" / "federated.md").read_text()
    said = " ".join(page[page.index("**Exactness.**") :].split("\n\n")[0].split())
    assert "`scheduler=constant`" in said and "once a round" in said


def _full_batch_step(run_dir, cfg):
    """θ − η∇L(θ) on the whole training set, from the run's θ⁰ (by hand)."""
    data = build_data(cfg.dataset, torch.device("cpu"), cfg.seed)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    model.load_state_dict(torch.load(run_dir / INIT_WEIGHTS, weights_only=True))
    x, y = data.train_tensors
    x = data.prepare(x, None) if data.prepare is not None else x
    loss = torch.nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    lr = float(cfg.base_optimizer.lr)
    names = [n for n, _ in model.named_parameters()]
    return {n: (p - lr * g).detach() for n, p, g in zip(names, model.parameters(), grads)}


@pytest.mark.parametrize("alpha", ["null", "0.5"])  # equal shards, then unequal ones
def test_one_sgd_step_per_client_averaged_by_size_is_one_full_batch_step(tmp_path, alpha):
    over = [
        "federated=fedavg", "federated.clients=4", "federated.participation=1",
        "federated.rounds=1", "federated.local_steps=1", f"federated.dirichlet_alpha={alpha}",
        "optimizer=base", "base_optimizer.momentum=0", "base_optimizer.weight_decay=0",
        "dataset.batch_size=800",  # the training set; each client's one batch is its whole shard
    ]  # fmt: skip
    _train(tmp_path, "f", *over)
    sizes = json.loads((tmp_path / "f" / CLIENTS).read_text())["sizes"]
    assert (len(set(sizes)) == 1) == (alpha == "null")
    want, got = _full_batch_step(tmp_path / "f", compose(*FAST, *over)), _weights(tmp_path / "f")
    for n, w in want.items():
        torch.testing.assert_close(got[n], w, rtol=1e-5, atol=1e-6)


def test_the_server_step_is_the_size_weighted_mean_moved_by_the_server_lr():
    theta = [torch.tensor([1.0, 2.0])]
    mean = [torch.tensor([3.0, 0.0])]
    cfg = compose("federated=fedavg", "federated.server_lr=0.25").federated
    new = FedAvg(cfg).server_update([theta[0].clone()], mean, ["w"], 0.1)
    torch.testing.assert_close(new[0], torch.tensor([1.5, 1.5]))


def test_the_dirichlet_split_is_disjoint_covering_seeded_and_skewed_as_alpha_falls():
    y = torch.arange(10).repeat_interleave(100)
    skews = []
    for alpha in (None, 100.0, 1.0, 0.1):
        shards = split_clients(y, 10, alpha, seed=3)
        everything = torch.cat(shards)
        assert len(everything) == len(y) and set(everything.tolist()) == set(range(len(y)))
        assert all(len(s) > 0 for s in shards)
        again = split_clients(y, 10, alpha, seed=3)
        assert all(torch.equal(a, b) for a, b in zip(shards, again))
        other = split_clients(y, 10, alpha, seed=4)
        assert not all(torch.equal(a, b) for a, b in zip(shards, other))
        skews.append(skew(histograms(y, shards, 10)))
    assert skews[0] < 0.15 and skews[1] < skews[2] < skews[3]


def test_the_split_refuses_more_clients_than_samples():
    with pytest.raises(UserError, match=r"federated.clients=11 is more than the 10 training"):
        split_clients(torch.arange(10), 11, None, 0)


def test_the_low_frequency_filter_removes_the_lowest_bins_only():
    t = torch.randn(4, 25, dtype=torch.float64)
    before = torch.fft.rfft(t.reshape(-1))
    low_frequency_removed_(t, 0.2)
    after = torch.fft.rfft(t.reshape(-1))
    k = -(-before.numel() * 2 // 10)
    assert after[:k].abs().max() < 1e-10
    torch.testing.assert_close(after[k:], before[k:])


def test_the_pairwise_cosine_from_the_unit_sum_is_the_mean_over_pairs():
    vs = [torch.randn(7, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    obs = Observer(0.1)
    obs.begin(None, True)
    for v in vs:
        obs.applied([None], [v])
    cos = torch.nn.functional.cosine_similarity
    pairs = [float(cos(a, b, 0)) for i, a in enumerate(vs) for b in vs[i + 1 :]]
    assert obs.values()["eps_pairwise_cos"] == pytest.approx(sum(pairs) / len(pairs))


def test_fedfft_with_cutoff_zero_is_fedsam_exactly(tmp_path):
    _, fedsam = _train(tmp_path, "a", "federated=fedavg", "optimizer=sam", *FED)
    _, zero = _train(tmp_path, "b", "federated=fedfft", "federated.fft_cutoff=0", *FED)
    _, some = _train(tmp_path, "c", "federated=fedfft", "federated.fft_cutoff=0.3", *FED)
    assert _same(fedsam, zero) and not _same(fedsam, some)


def test_fedvssam_at_zero_correction_and_momentum_is_fedsam_exactly(tmp_path):
    _, fedsam = _train(tmp_path, "a", "federated=fedavg", "optimizer=sam", *FED)
    neutral = ["federated.correction=0", "federated.server_momentum=0"]
    _, zero = _train(tmp_path, "b", "federated=fedvssam", *neutral, *FED)
    _, vs = _train(tmp_path, "c", "federated=fedvssam", *FED)
    assert _same(fedsam, zero) and not _same(fedsam, vs)


def _lines(run_dir):
    rows = [json.loads(x) for x in (run_dir / METRICS).read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("time_s")} for r in rows]  # wall times


def test_a_run_killed_mid_round_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch):
    over = ["federated=fedvssam", "federated.dirichlet_alpha=0.5", "federated.rounds=4", *FED[:1]]
    over += ["federated.local_steps=3", "metrics=default", "metrics.hessian.num_samples=128"]
    whole, w_whole = _train(tmp_path, "whole", *over)
    batches = rounds.Federation.batches

    def killed(self, k, r):
        if r == 3 and k == self.sampled(r)[-1]:  # the round's last client, mid-round
            raise KeyboardInterrupt
        return batches(self, k, r)

    monkeypatch.setattr(rounds.Federation, "batches", killed)
    with pytest.raises(KeyboardInterrupt):
        _train(tmp_path, "resumed", *over)
    monkeypatch.setattr(rounds.Federation, "batches", batches)
    again, w_again = _train(tmp_path, "resumed", *over)
    assert _same(w_whole, w_again)
    assert _lines(tmp_path / "whole") == _lines(tmp_path / "resumed")
    assert [r["round"] for r in _lines(tmp_path / "whole")] == [1, 2, 3, 4]
    assert again["lambda_max"] == whole["lambda_max"] is not None


@pytest.mark.parametrize(
    "override,message",
    [
        ("federated.clients=0", "federated.clients=0 must be an integer >= 1"),
        ("federated.participation=0", "federated.participation=0 must be a number in (0, 1]"),
        ("federated.participation=1.5", "federated.participation=1.5 must be a number in (0, 1]"),
        ("federated.local_steps=0", "federated.local_steps=0 must be an integer >= 1"),
        ("federated.rounds=0", "federated.rounds=0 must be an integer >= 1"),
        ("federated.dirichlet_alpha=0", "federated.dirichlet_alpha=0 must be null (IID)"),
        ("federated.dirichlet_alpha=-1", "federated.dirichlet_alpha=-1 must be null (IID)"),
        ("optimizer=base", "federated=fedfft filters or adjusts the SAM perturbation"),
        ("trainer.devices=2", "trainer.devices=2 with federated=fedfft"),
        ("dataset=text model=gpt", "dataset=text has no labels per example"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, override, message):
    run = tmp_path / "run"
    code, _, err = run_cli(["federated=fedfft", *override.split(), f"hydra.run.dir={run}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not run.exists()


@pytest.mark.parametrize(
    "overrides,message",
    [  # MNIST-1D of 1000 samples: 800 to train on (80%), 80 a class
        (["federated.clients=801"], "federated.clients=801 is more than the 800 training samples"),
        (["dataset.val_split=100", "federated.clients=701"], "is more than the 700 training"),
        (
            ["federated.clients=50", "federated.dirichlet_alpha=0.001"],
            "federated.dirichlet_alpha=0.001 left a client with no sample in 100 seeded draws of "
            "federated.clients=50 over 800 training samples",
        ),
    ],
)
def test_a_split_the_data_cannot_make_is_refused_before_anything_is_written(
    tmp_path, capsys, overrides, message
):
    # the split is made up front on the labels the run would train on (after the validation
    # split); before, each job of a sweep failed at data loading and left a failed summary.json
    sweep = tmp_path / "sweep"
    argv = ["-m", "federated=fedavg", "dataset.num_samples=1000", "seed=0,1", *overrides]
    code, _, err = run_cli([*argv, f"hydra.sweep.dir={sweep}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not sweep.exists()


def test_the_split_made_up_front_is_the_one_the_run_makes():
    from sam_runner.data.planned import planned_labels

    cfg = compose(*FAST, "dataset.val_split=0.1", "dataset.label_noise=0.2", "seed=3")
    labels = planned_labels(cfg.dataset, 3)
    data = build_data(cfg.dataset, torch.device("cpu"), 3)
    assert torch.equal(labels, data.train.y)
    assert [s.tolist() for s in split_clients(labels, 7, 0.5, 3)] == [
        s.tolist() for s in split_clients(data.train.y, 7, 0.5, 3)
    ]


def test_a_dataset_still_to_download_is_split_by_the_run_not_fetched_up_front(tmp_path):
    from sam_runner.data.planned import planned_labels

    empty = tmp_path / "data"
    empty.mkdir()
    cfg = compose("dataset=cifar10", f"dataset.data_dir={empty}", "dataset.download=true")
    assert planned_labels(cfg.dataset, 0) is None
    assert list(empty.iterdir()) == []  # nothing downloaded, nothing written


def test_a_federated_run_writes_its_split_and_lines_carry_the_round(tmp_path):
    summary, _ = _train(tmp_path, "r", "federated=fedavg", "federated.dirichlet_alpha=0.3", *FED)
    split = json.loads((tmp_path / "r" / CLIENTS).read_text())
    assert sum(split["sizes"]) == sum(map(sum, split["class_histograms"]))
    rows = _lines(tmp_path / "r")
    assert [r["round"] for r in rows] == [1, 2] and all(r["clients_sampled"] == 2 for r in rows)
    assert {"eps_pairwise_cos", "eps_low_freq_share", "eps_global_cos"} <= rows[-1].keys()
    assert summary["federated"] == "fedavg" and (tmp_path / "r" / SUMMARY).exists()


def test_sam_report_draws_the_rounds_and_tables_the_methods(tmp_path):
    from sam_runner.results.report import main

    sweep = tmp_path / "sweep"
    _train(sweep, "0", "federated=fedavg", "optimizer=base", *FED)
    _train(sweep, "1", "federated=fedfft", "federated.dirichlet_alpha=0.3", *FED)
    assert (sweep / "0" / "clients.png").exists()
    assert main([str(sweep)]) == 0
    text = (sweep / "report.md").read_text()
    assert "## Federated" in text and (sweep / "federated.png").exists()
    rows = [line for line in text.splitlines() if line.startswith(("| IID", "| Dirichlet"))]
    assert [r.split(" | ")[1] for r in rows] == ["fedfft", "fedavg+base"]


def test_batchnorm_statistics_are_the_clients_mean_whatever_the_server_step(tmp_path):
    # a server momentum or server_lr > 1 applied to running variances could drive them below 0
    over = ["federated=fedvssam", "federated.server_lr=3", "federated.server_momentum=0.9"]
    plain = [o for o in FAST if not o.startswith("model")]  # the default model: BatchNorm
    cfg = compose(*plain, *over, *FED[:2], "federated.local_steps=2")
    summary, w = train(cfg, tmp_path / "bn"), _weights(tmp_path / "bn")
    variances = [v for k, v in w.items() if k.endswith("running_var")]
    assert summary["status"] == "completed" and variances
    assert all(bool((v > 0).all()) for v in variances)


def test_sam_eval_measures_the_global_model_the_run_checkpointed(tmp_path):
    from sam_runner.evaluation.cli import main
    from sam_runner.rundir import eval_file

    one_round = ["federated.rounds=1", "federated.local_steps=2"]
    summary, _ = _train(tmp_path, "r", "federated=fedavg", "optimizer=sam", *FED[:1], *one_round)
    assert main([str(tmp_path / "r"), "metrics.hessian.enabled=false"]) == 0
    measured = json.loads((tmp_path / "r" / eval_file()).read_text())
    assert measured["test_acc"] == summary["test_acc"]


def test_lambda_max_of_the_global_model_every_n_rounds(tmp_path):
    # every_n_rounds counts rounds; every_n_epochs is not read by a federated run
    over = ["federated=fedavg", "optimizer=base", *FED[:2], "federated.local_steps=1"]
    curvature = ["metrics.hessian.enabled=true", "metrics.hessian.num_samples=128"]
    every = ["federated.eval_every=2", "metrics.hessian.every_n_rounds=1"]
    few = ["metrics.hessian.max_iter=20", "metrics.hessian.every_n_epochs=2"]
    summary, _ = _train(tmp_path, "r", *over, *curvature, *every, *few)
    rows = _lines(tmp_path / "r")
    assert [(r["round"], "test_acc" in r) for r in rows if "lambda_max" in r] == [
        (1, False),  # a curvature line of its own: no evaluation due at round 1
        (2, True),
    ]
    assert summary["lambda_max"] > 0


def test_the_curvature_period_a_run_does_not_read_is_noticed():
    from sam_runner.preflight import idle_settings

    fed = ["federated=fedavg", "metrics.hessian.every_n_epochs=5"]
    (note,) = idle_settings(fed, compose(*fed), False)
    assert note.startswith("metrics.hessian.every_n_epochs=5 does nothing in a federated run")
    central = ["metrics.hessian.every_n_rounds=5"]
    (note,) = idle_settings(central, compose(*central), False)
    assert note.startswith("metrics.hessian.every_n_rounds=5 does nothing without a federated")
    assert idle_settings(["metrics=full"], compose("federated=fedavg", "metrics=full"), False) == []


def _folder(tmp_path):
    root = write_tree(tmp_path / "tree", per_class=8, val_per_class=2, size=10)
    return [
        "dataset=image_folder", f"dataset.root={root}", "dataset.image_size=8",
        "dataset.num_workers=0", "dataset.batch_size=6", "model=cnn", "model.channels=4",
        "metrics=off", "trainer.progress=none", "scheduler=constant", "optimizer=sam",
        "base_optimizer.momentum=0",
    ]  # fmt: skip


@pytest.mark.slow  # two trainings (about 10 s on a shared CPU)
def test_one_client_over_an_image_folder_is_its_centralized_run_bit_for_bit(tmp_path):
    # a client's images come through a loader of its own: the same order and augmentation seeds
    folder = _folder(tmp_path)
    central = train(compose(*folder, "trainer.epochs=1"), tmp_path / "c")
    one = ["federated=fedavg", "federated.clients=1", "federated.participation=1"]
    rounds = ["federated.rounds=1", "federated.local_steps=4"]  # 24 images: 4 batches of 6
    alone = train(compose(*folder, *one, *rounds), tmp_path / "f")
    assert _same(_weights(tmp_path / "c"), _weights(tmp_path / "f"))
    assert alone["test_acc"] == central["test_acc"] and alone["step"] == central["step"] == 4


def test_an_image_folder_is_split_on_its_labels_and_each_client_reads_its_own(tmp_path):
    from sam_runner.data.planned import planned_labels
    from sam_runner.federated import build_federation

    skewed = ["federated=fedavg", "federated.clients=3", "federated.dirichlet_alpha=0.5"]
    cfg = compose(*_folder(tmp_path), *skewed, "federated.local_steps=2")
    data = build_data(cfg.dataset, torch.device("cpu"), cfg.seed)
    labels = planned_labels(cfg.dataset, cfg.seed)  # from the file names, before the run
    assert torch.equal(labels, data.train.y)
    fed = build_federation(cfg, data)
    assert [sum(h[c] for h in fed.hist) for c in range(len(CLASSES))] == [8, 8, 8]
    assert fed.hist == histograms(labels, split_clients(labels, 3, 0.5, cfg.seed), len(CLASSES))
    for k, shard in enumerate(fed.shards):
        seen = torch.cat([y for _, y, _ in fed.batches(k, 1)])
        assert len(seen) == 2 * min(6, len(shard))  # two local steps of full batches
        assert set(seen.tolist()) <= set(labels[shard].tolist())
