"""Flower's simulation engine against the runner's in-process rounds, on the same client update.

The question behind ``federated.engine=flower``: does Flower (``flwr[simulation]``, its Ray
backend) run our client update within 1.3x of the in-process loop, with the same results? Both
sides run the same FedSAM setup: MNIST-1D (4000 samples), the default model, K clients, all of
them every round (participation 1: Flower samples clients with its own generator, so only full
participation gives both the same clients), s local steps of SAM at batch 32, one CPU thread.

- in process: ``FederatedLoop.train_epoch`` (sam_runner/federated/rounds.py) on a ``Run`` in
  this process;
- Flower: a ``ClientApp`` whose train handler is ``FederatedLoop.client_update`` on a ``Run``
  built once per Ray actor (the same config and seed, so the same shards and batches per
  (client, round)),
  the global weights going out and back as ``ArrayRecord`` messages, and Flower's ``FedAvg``
  strategy (weighted by ``num-examples``: the shard sizes) on the server, or with ``--ordered``
  a subclass that sums the mean in client order as the runner does; Ray given one CPU, so one
  actor runs the clients one after another, as the in-process loop does.

The two alternate: between two Flower rounds (its ``evaluate_fn``) the in-process round of the
same number runs, so both are timed under the same load. Printed: the median seconds of a round
of each and of their per-round ratio (the first round, which builds the actor's run, left out),
Flower's whole wall time (Ray's start included) and the largest difference between the two
global models at the end. Run with an interpreter that has ``flwr[simulation]`` (not a
dependency of the runner, docs/federated.md#the-engine):

    python scripts/bench_flower.py --clients 5 --rounds 6 --local-steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the runner, its test helpers and this module, importable by name in Flower's Ray actors too
PATHS = [str(ROOT), str(ROOT / "tests"), str(ROOT / "scripts")]
sys.path[:0] = PATHS
os.environ["PYTHONPATH"] = os.pathsep.join([*PATHS, os.environ.get("PYTHONPATH", "")])


def overrides(clients: int, local_steps: int) -> list[str]:
    return [
        "federated=fedavg", "optimizer=sam", f"federated.clients={clients}",
        "federated.participation=1", f"federated.local_steps={local_steps}",
        "federated.rounds=1000000", "federated.eval_every=1000000",  # no round measures ε
        "dataset.batch_size=32", "dataset.num_samples=4000", "metrics=off",
        "trainer.progress=none", "scheduler=constant",
    ]  # fmt: skip


def build_run(over: list[str]):
    """A set-up ``Run`` of the runner (its data, model, optimizer and federation), in a
    temporary folder."""
    import torch
    from conftest import compose

    from sam_runner.train import Run

    torch.set_num_threads(1)
    run = Run(compose(*over), Path(tempfile.mkdtemp(prefix="bench-flower-")), [])
    run.setup()
    return run


def float_keys(model) -> list[str]:
    return [n for n, t in model.state_dict().items() if t.is_floating_point()]


_ACTOR_RUN = {}  # the Run a Ray actor builds once and serves every client message with


def client_app(over: list[str]):
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from sam_runner.federated.rounds import float_state
    from sam_runner.training.evaluation import EpochStats

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        import bench_flower  # this module by name: its cache lives as long as the actor

        cache = bench_flower._ACTOR_RUN
        if "run" not in cache:
            cache["run"] = build_run(over)
        run = cache["run"]
        k = int(context.node_config["partition-id"])
        r = int(msg.content["config"]["server-round"])
        state = msg.content["arrays"].to_torch_state_dict()
        floats, _, _ = float_state(run.model)
        global_ = [state[n].to(floats[0].dtype) for n in float_keys(run.model)]
        run.loop.client_update(k, r, floats, global_, EpochStats(run.device, run.dist))
        metrics = {"num-examples": run.loop.fed.sizes[k], "partition-id": k}
        content = RecordDict({
            "arrays": ArrayRecord(run.model.state_dict()), "metrics": MetricRecord(metrics),
        })  # fmt: skip
        return Message(content=content, reply_to=msg)

    return app


def ordered_fedavg(base):
    """Flower's FedAvg whose mean is the runner's to the bit: the replies summed in client order
    by the same torch operation (Flower's own sums numpy arrays in the order replies arrive,
    which agrees to float rounding, and float rounding grows over rounds of SAM)."""
    import torch
    from flwr.app import ArrayRecord, MetricRecord

    class OrderedFedAvg(base):
        def aggregate_train(self, server_round, replies):  # noqa: ARG002 (Flower's signature)
            replies = sorted(replies, key=lambda m: m.content["metrics"]["partition-id"])
            sizes = [m.content["metrics"]["num-examples"] for m in replies]
            mean = None
            for m, n in zip(replies, sizes):
                state = m.content["arrays"].to_torch_state_dict()
                floats = [t for t in state.values() if t.is_floating_point()]
                mean = mean or [torch.zeros_like(t) for t in floats]
                torch._foreach_add_(mean, floats, alpha=n / sum(sizes))
            keys = [k for k, t in state.items() if t.is_floating_point()]
            return ArrayRecord(dict(zip(keys, mean))), MetricRecord({})

    return OrderedFedAvg


def server_app(initial: dict, clients: int, rounds: int, out: Path, between, ordered: bool):
    """Flower's server: FedAvg over every client for warm-up + ``rounds`` rounds; between two
    rounds (where Flower calls its ``evaluate_fn``), ``between(r)`` runs the in-process round
    r + 1, so both engines are timed alternately under the same load."""
    import torch
    from flwr.app import ArrayRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:  # noqa: ARG001 (Flower's signature)
        marks = []  # (Flower's round ended, the in-process round ended), once a round and before

        def interleave(server_round, arrays):  # noqa: ARG001 (Flower's signature)
            ended = time.perf_counter()
            if server_round <= rounds:
                between(server_round)
            marks.append((ended, time.perf_counter()))

        strategy = (ordered_fedavg(FedAvg) if ordered else FedAvg)(
            fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
            min_available_nodes=clients,
        )  # fmt: skip
        result = strategy.start(
            grid=grid, initial_arrays=ArrayRecord(initial), num_rounds=rounds + 1,
            evaluate_fn=interleave,
        )  # fmt: skip
        state = result.arrays.to_torch_state_dict()
        torch.save({"state": state, "marks": marks}, out / "flower.pt")

    return app


def compare(clients: int, rounds: int, local_steps: int, ordered: bool = False) -> dict:
    """Warm-up + ``rounds`` rounds on both engines, alternately; their medians, the median of
    the per-round ratios, and the largest weight difference at the end."""
    import torch
    from flwr.simulation import run_simulation

    over = overrides(clients, local_steps)
    run = build_run(over)  # the in-process side, in this process (Flower's server thread)
    initial = {k: v.clone() for k, v in run.model.state_dict().items()}
    ours = []

    def between(_):
        started = time.perf_counter()
        run.loop.train_epoch()
        ours.append(time.perf_counter() - started)

    out = Path(tempfile.mkdtemp(prefix="bench-flower-out-"))
    started = time.perf_counter()
    run_simulation(
        server_app=server_app(initial, clients, rounds, out, between, ordered),
        client_app=client_app(over),
        num_supernodes=clients,
        backend_config={  # one CPU: one actor runs the clients one after another
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 1, "num_gpus": 0},
        },
    )
    wall = time.perf_counter() - started
    saved = torch.load(out / "flower.pt", weights_only=False)
    marks = saved["marks"]  # marks[r]: after Flower's round r (r = 0: before round 1)
    theirs = [marks[r][0] - marks[r - 1][1] for r in range(1, len(marks))]
    # round 1 builds the actor's run (Flower) and warms up (in process): not timed
    ours, theirs = ours[1:], theirs[1:]
    mine, their_state = run.model.state_dict(), saved["state"]
    keys = [k for k, v in mine.items() if v.is_floating_point()]
    gap = lambda k: float((mine[k] - their_state[k].to(mine[k].dtype)).abs().max())
    return {
        "clients": clients,
        "local_steps": local_steps,
        "rounds_timed": len(theirs),
        "aggregation": "ordered (the runner's)" if ordered else "Flower's FedAvg",
        "in_process_s_per_round": round(statistics.median(ours), 4),
        "flower_s_per_round": round(statistics.median(theirs), 4),
        "flower_over_in_process": round(statistics.median(t / o for t, o in zip(theirs, ours)), 3),
        "flower_wall_s": round(wall, 2),
        "max_abs_weight_diff": max(gap(k) for k in keys),
        "max_abs_weight": max(float(mine[k].abs().max()) for k in keys),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--rounds", type=int, default=6, help="rounds timed, after a warm-up one")
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--ordered", action="store_true", help="aggregate as the runner does")
    a = p.parse_args(argv)
    import bench_flower  # by name, not __main__: what Flower sends its actors refers to it

    print(json.dumps(bench_flower.compare(a.clients, a.rounds, a.local_steps, a.ordered), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
