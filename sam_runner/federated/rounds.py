"""The federated simulation: ``Federation`` holds the clients and the server's algorithm;
``FederatedLoop`` is the loop a run with ``federated != none`` runs in place of the epoch loop
(the federation part names it, ``Part.loop_class``).

One model instance serves every client, one after another: a client starts from the global
weights (copied in), its base optimizer's per-parameter state starts empty (clients are
stateless, as in FedAvg), it takes ``local_steps`` steps of the run's own optimizer through
``EpochLoop.optimizer_step`` (the shared engine, the closure, mixing, precision as in any run), and
its weights are added, weighted by its data size, to a running mean. The server's update is the
algorithm's. Round r's clients and batches depend on (seed, r, client) alone, so a run resumed
at a checkpointed round boundary, or killed mid-round and replayed from the last one, trains as
the uninterrupted run does, bit for bit. The run's clock counts rounds as its epochs.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING

import torch

from ..data.loaders import FolderLoader, Shard, TensorLoader
from ..errors import require
from ..module_state import frozen_running_stats
from ..part import Part
from ..registry import FEDERATED
from ..rundir import CLIENTS
from ..runfiles import write_json
from ..training.evaluation import EpochStats
from ..training.lengths import Lengths
from ..training.loop import EpochLoop
from .algorithms import FedAvg, check
from .measures import Observer
from .split import histograms, skew, split_clients

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from omegaconf import DictConfig
    from torch import nn

    from ..data import Data
    from ..part import Run

CLIENT_SEED = 7919  # client k's batches: TensorLoader seed = run seed + CLIENT_SEED·k


class Federation(Part):
    """The clients (their shards and loaders), the round's sampling and the algorithm: the run's
    ``federated`` part, whose loop is ``FederatedLoop``."""

    name = "federated"

    def __init__(self, cfg: DictConfig, algorithm: FedAvg, data: Data, seed: int) -> None:
        f = cfg.federated
        require(  # checked before the run (federated/split.py): token windows have no labels
            isinstance(data.train, FolderLoader) or hasattr(data.train, "x"),
            f"federated={f.name} needs a labelled training set; dataset={cfg.dataset.name} has "
            "none",
        )
        self.cfg, self.algorithm, self.seed = f, algorithm, int(seed)
        self.rounds, self.local_steps = int(f.rounds), int(f.local_steps)
        self.eval_every = int(f.eval_every)
        train = data.train
        self.shards = split_clients(train.y, int(f.clients), f.dirichlet_alpha, seed)
        self.sizes = [len(s) for s in self.shards]
        self.hist = histograms(train.y, self.shards, data.num_classes)
        self.loaders = [self._loader(train, k, s) for k, s in enumerate(self.shards)]
        self.per_round = max(1, round(float(f.participation) * len(self.shards)))
        self.observer = Observer(float(f.measure_cutoff))
        self.round_values: dict = {}

    def _loader(self, train, k: int, shard: torch.Tensor):
        """Client k's batches: its shard, the run's batch size (at most its sample count),
        shuffled per epoch from (seed, k), the training augmentation. An image folder's client
        reads its images through workers of its own that end with each round's pass (kept
        across rounds, K clients' workers would be K times the run's)."""
        bs = min(train.batch_size, len(shard))
        if isinstance(train, FolderLoader):
            workers = train.kw["num_workers"]
            loader = FolderLoader(
                Shard(train.ds, shard), bs, train.shuffle, self.seed + CLIENT_SEED * k, workers,
                True, labels=train.labels[shard], persistent=False,
            )  # fmt: skip
            loader.device = train.device
            return loader
        idx = shard.to(train.y.device)
        return TensorLoader(
            train.x[idx], train.y[idx], bs, shuffle=train.shuffle,
            seed=self.seed + CLIENT_SEED * k, drop_last=True, transform=train.transform,
        )  # fmt: skip

    def sampled(self, r: int) -> list[int]:
        """Round r's clients, in client order: ``per_round`` of them drawn from (seed, r)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + r)
        return sorted(torch.randperm(len(self.shards), generator=g)[: self.per_round].tolist())

    def batches(self, k: int, r: int) -> Iterator[tuple]:
        """Client k's ``local_steps`` batches of round r: its loader's epochs (r−1)·E + 1, ...,
        E = ⌈local_steps / batches per epoch⌉ (one epoch a round when they are equal: a single
        client's round r is a centralized run's epoch r)."""
        loader = self.loaders[k]
        per_round = -(-self.local_steps // len(loader))
        taken = 0
        for e in range((r - 1) * per_round + 1, r * per_round + 1):
            loader.set_epoch(e)
            for batch in loader:
                if taken == self.local_steps:
                    return
                taken += 1
                yield batch

    def write_clients(self, path: Path) -> None:
        """The split, for the run folder: each client's size and class histogram."""
        write_json(path, {
            "clients": len(self.shards),
            "dirichlet_alpha": self.cfg.dirichlet_alpha,
            "sizes": self.sizes,
            "class_histograms": self.hist,
            "label_skew": skew(self.hist),
        })  # fmt: skip

    def attach(self, run: Run) -> None:
        """The algorithm's and the measures' hooks on the run's optimizer (the engine's declared
        hooks: the variant is untouched): ε filtered and observed after the variant computes
        it, the gradients ε is built from and the base step descends along adjusted. FedAvg's
        hooks change nothing: its client steps are the optimizer's own, bit for bit."""
        alg, obs = self.algorithm, self.observer

        def filtered(params, eps):
            if obs.watching:
                obs.raw(eps)
            alg.filter_(eps)
            if obs.watching:
                obs.applied(params, eps)

        run.optimizer.add_perturbation_filter(filtered)
        run.optimizer.add_gradient_adjuster(alg.adjust)
        if run.dist.is_main:
            self.write_clients(run.run_dir / CLIENTS)

    def evaluation_due(self, r: int) -> bool:
        """Whether round ``r`` ends with an evaluation (every ``eval_every`` rounds, and the
        last)."""
        return r >= self.rounds or r % self.eval_every == 0

    # ------------------------------------------------------------------ run parts
    def log_values(self) -> dict:
        """The last round's measures."""
        return dict(self.round_values)

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        """The federation's name, rounds and clients, for the summary."""
        return {
            "federated": str(self.cfg.name),
            "rounds": self.rounds,
            "clients": len(self.shards),
            "label_skew": skew(self.hist),
            **{k: v for k, v in self.round_values.items() if k != "round"},
        }

    def state_dict(self) -> dict:
        """The algorithm's state and the round's measures, for a checkpoint."""
        return {"algorithm": self.algorithm.state_dict(), "round_values": self.round_values}

    def load_state_dict(self, state: dict) -> None:
        """Restore the algorithm's state and the round's measures."""
        self.algorithm.load_state_dict(state["algorithm"])
        self.round_values = dict(state["round_values"])


def float_state(model: nn.Module) -> tuple[list, list, list]:
    """The model's floating-point state tensors (parameters and buffers, sharing storage), each
    one's parameter name (None for a buffer), and the other state tensors (counters)."""
    params = {id(p): n for n, p in model.named_parameters()}
    named = {n: p for n, p in model.named_parameters()}
    floats, names, others = [], [], []
    for n, t in model.state_dict().items():
        if t.is_floating_point():
            floats.append(t)
            names.append(n if n in named and id(named[n]) in params else None)
        else:
            others.append(t)
    return floats, names, others


class FederatedLoop(EpochLoop):
    """The rounds of a federated run, evaluated and checkpointed as a run's epochs are: a round
    is an epoch of the clock, its schedule steps once a round."""

    @staticmethod
    def lengths(cfg: DictConfig, data: Data) -> Lengths:  # noqa: ARG004 (the loop's signature)
        """A federated run's lengths: an epoch is a round of the participating clients' local
        steps."""
        f = cfg.federated
        rounds, clients = int(f.rounds), int(f.clients)
        per_round = max(1, round(float(f.participation) * clients))
        a_round = per_round * int(f.local_steps)  # every sampled client's local steps
        return Lengths(1, rounds, rounds * a_round, a_round)

    def say_notes(self) -> None:
        """Nothing to say: a federation evaluates by rounds."""
        pass  # a federation evaluates by rounds (federated.eval_every)

    def __init__(self, run: Run, steps_per_epoch: int) -> None:
        super().__init__(run, steps_per_epoch)
        run.clock.rounds = True  # the tracker's period: metrics.hessian.every_n_rounds
        self.fed = next(p for p in run.parts.all if isinstance(p, Federation))

    def train_epoch(self) -> bool:
        """One round: the sampled clients' local steps from the global weights, then the
        server's update; False when a loss became non-finite."""
        run, fed, opt = self.run, self.fed, self.run.optimizer
        started = self.begin_epoch()
        r = run.clock.epoch
        floats, names, _ = float_state(run.model)
        global_ = [t.clone() for t in floats]
        lr = opt.param_groups[0]["lr"]
        fed.algorithm.begin_round({id(p): n for n, p in run.model.named_parameters()}, lr)
        measuring = fed.evaluation_due(r) and opt.passes > 1
        fed.observer.begin(global_sam_direction(run) if measuring else None, measuring)
        stats = EpochStats(run.device, run.dist)
        chosen = fed.sampled(r)
        total = sum(fed.sizes[k] for k in chosen)
        mean = [torch.zeros_like(t) for t in floats]
        for k in chosen:
            self.client_update(k, r, floats, global_, stats, measuring)
            torch._foreach_add_(mean, floats, alpha=fed.sizes[k] / total)
        fed.observer.watching = False
        torch._foreach_copy_(floats, fed.algorithm.server_update(global_, mean, names, lr))
        run.scheduler.step()  # the learning rate's schedule counts rounds
        fed.round_values = {"round": r, "clients_sampled": len(chosen), **fed.observer.values()}
        return self.end_training_pass(stats, started)

    def client_update(
        self,
        k: int,
        r: int,
        floats: list[torch.Tensor],
        global_: list[torch.Tensor],
        stats: EpochStats,
        measuring: bool = False,
    ) -> None:
        """Client k's part of round r: from the global weights ``global_`` (copied into the
        model's float state tensors ``floats``), its base optimizer's state empty, its local
        steps; the model then holds its weights. What any engine runs for a client
        (scripts/bench_flower.py runs it in Flower's simulation)."""
        opt, fed = self.run.optimizer, self.fed
        torch._foreach_copy_(floats, global_)
        opt.base_optimizer.state.clear()  # stateless clients: momentum starts afresh
        opt.state.clear()
        for j, (x, y, idx) in enumerate(fed.batches(k, r)):
            fed.observer.watching = measuring and j == 0  # a client's ε at the global weights
            self.optimizer_step(x, y, idx, stats, schedule=False)

    def evaluation_due(self) -> bool:
        """Whether this round ends with an evaluation."""
        return self.run.clock.final or self.fed.evaluation_due(self.run.clock.epoch)

    def epoch_keys(self) -> dict:
        """The metrics line's round number."""
        return {"round": self.run.clock.epoch}


Federation.loop_class = FederatedLoop


def build_federation(cfg: DictConfig, data: Data) -> Federation | None:
    """The run's federation (None without one), its keys checked."""
    check(cfg)
    f = cfg.get("federated")
    algorithm = FEDERATED.build("none" if f is None else f.get("name", "none"), f)
    return Federation(cfg, algorithm, data, cfg.seed) if algorithm.enabled else None


def build_part(run: Run) -> Federation | None:
    """The run's federation part (None without ``federated``)."""
    return build_federation(run.cfg, run.data)


def global_sam_direction(run: Run) -> list | None:
    """∇L of the global model on a seeded subset of the clients' union (the measurement subset
    of ``metrics.hessian.num_samples`` samples), per parameter; train mode, running statistics
    untouched, gradients restored to none."""
    n = min(int(run.cfg.metrics.get("hessian", {}).get("num_samples", 1024)), run.data.train_size)
    x, y = run.data.train_subset(n, run.cfg.seed)
    autocast = run.loop.autocast
    params = [p for p in run.model.parameters() if p.requires_grad]
    grads = [torch.zeros_like(p) for p in params]
    loss_fn = torch.nn.functional.cross_entropy
    bs = run.data.train.batch_size
    with frozen_running_stats(list(run.model.modules())), torch.enable_grad():
        for a in range(0, len(y), bs):
            with autocast if autocast is not None else contextlib.nullcontext():
                loss = loss_fn(run.model(x[a : a + bs]), y[a : a + bs], reduction="sum")
            got = torch.autograd.grad(loss / len(y), params, allow_unused=True)
            for g, h in zip(grads, got):
                if h is not None:
                    g.add_(h.float() if g.dtype != h.dtype else h)
    norm = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
    return {id(p): g for p, g in zip(params, grads)} if norm > 0 else None
