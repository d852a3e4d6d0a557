"""SAMPa's two-process form under real data parallelism (gloo, started processes): ranks [0, N/2)
compute ∇f(x̃), ranks [N/2, N) ∇f(y), each half over the whole global batch. Over several steps
it takes the sequential form's steps on one process with the same global batches (parameters,
∇f(y) kept, the step's loss, BatchNorm statistics), the same on every process; an fp16 step
that overflows is skipped everywhere and leaves ∇f(y); the run's data share; a whole run of
``sam-run`` on 2 processes equals the sequential run on one."""

import json

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from optim_helpers import bn_net, build, flat, mlp
from oracle_helpers import batches

from sam_runner import distributed
from sam_runner.errors import UserError
from sam_runner.optim.build import training_share
from sam_runner.paths import config_dir
from sam_runner.train import train
from sam_runner.validate import validate_config

CPU = torch.device("cpu")
STEPS = 6
TOL = 1e-12  # float64: the halves' means and the all-reduce reorder a few sums


def _state(opt, model, loss) -> dict:
    """What one step leaves: parameters, ∇f(y), BatchNorm buffers, the step's loss."""
    gy = [opt.state[p]["sampa_gy"] for p in model.parameters() if "sampa_gy" in opt.state[p]]
    buffers = [b.double() for b in model.buffers()]
    return {
        "params": flat(model.parameters()),
        "gy": flat(gy) if gy else torch.zeros(0, dtype=torch.float64),
        "buffers": flat(buffers) if buffers else torch.zeros(0, dtype=torch.float64),
        "loss": float(loss),
    }


def _run(model, net, opt, share, world_batches, scaler=None, poison_at=None):
    """``STEPS`` steps of ``opt`` on this process's ``share`` (rank, world) of each global batch;
    the state after each. ``poison_at``: the step whose loss is made infinite (fp16)."""
    rank, size = share
    out = []
    for k, (x, y) in enumerate(world_batches):
        xs, ys = x[rank::size], y[rank::size]

        def closure(k=k, xs=xs, ys=ys):
            opt.zero_grad(set_to_none=True)
            out_ = net(xs.float() if scaler else xs)
            loss = F.cross_entropy(out_.double(), ys)
            if k == poison_at:
                loss = loss * float("inf")
            (scaler.scale(loss) if scaler else loss).backward()
            return loss.detach()

        loss = opt.step(closure)
        if scaler is not None:
            scaler.update()
        out.append(_state(opt, model, loss))
    return out


def _make(kind, fp16):
    model = bn_net() if kind == "bn" else mlp()
    return model.float() if fp16 else model


def _probe(kind: str, fp16: bool = False, poison_at=None):
    """In each started process: the two-process form's steps; every process's states (gathered)."""
    topo = distributed.current()
    model = _make(kind, fp16)
    net = torch.nn.parallel.DistributedDataParallel(model)
    opt = build("sampa", model, lr=0.05, momentum=0.9, sequential_fallback=False).bind(model=net)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if fp16 else None
    if scaler:
        opt.bind(grad_scaler=scaler)
    size = topo.world // 2
    states = _run(model, net, opt, (topo.rank % size, size), batches(STEPS), scaler, poison_at)
    gathered = []  # as lists: tensors would travel in shared memory that ends with the process
    for s in states:
        row = {k: topo.gather(v[None].double()).tolist() for k, v in s.items() if k != "loss"}
        row["loss"] = topo.gather(torch.tensor([s["loss"]], dtype=torch.float64)).tolist()
        gathered.append(row)
    return gathered


def _launch(*args, world=2):
    """``_probe(*args)`` on ``world`` processes: per step, each key's rows, one per process."""
    steps = distributed.launch(_probe, args, world, CPU)
    return [{k: torch.tensor(v, dtype=torch.float64) for k, v in row.items()} for row in steps]


def _sequential(kind: str, fp16: bool = False, poison_at=None):
    """The sequential form on one process over the whole global batches."""
    model = _make(kind, fp16)
    with pytest.warns(UserWarning, match="one after the other"):
        opt = build("sampa", model, lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8) if fp16 else None
    if scaler:
        opt.bind(grad_scaler=scaler)
    return _run(model, model, opt, (0, 1), batches(STEPS), scaler, poison_at)


def _worst(two, one, key):
    """The largest gap over steps and processes between the two forms."""
    gaps = [(row[key] - want[key]).abs() for row, want in zip(two, one)]
    return max((float(g.max()) for g in gaps if g.numel()), default=0.0)


@pytest.mark.parametrize(
    "kind, world",
    [("bn", 2), pytest.param("mlp", 4, marks=pytest.mark.slow)],  # 4 processes: CI's time
)
def test_the_two_process_form_takes_the_sequential_steps(kind, world):
    """2 processes with BatchNorm (each role one process: its statistics those of the pass at x̃
    on the global batch); 4 without (each role's two halves averaged)."""
    two = _launch(kind, world=world)
    one = _sequential(kind)
    for key in ("params", "gy", "buffers", "loss"):
        assert _worst(two, one, key) <= TOL, key
    # every process holds the same parameters, ∇f(y), statistics and loss
    for row in two:
        for key in ("params", "gy", "buffers", "loss"):
            assert all(torch.equal(row[key][0], other) for other in row[key][1:]), key
    assert float(two[-1]["params"][0].sub(two[0]["params"][0]).abs().max()) > 1e-3  # it moved


@pytest.mark.slow  # 2 processes, ~10 s (CI's time)
def test_an_overflowing_fp16_step_is_skipped_on_every_process_and_keeps_gy():
    two = _launch("mlp", True, 3)
    one = _sequential("mlp", True, 3)
    assert torch.equal(two[3]["params"][0], two[2]["params"][0])  # skipped
    assert torch.equal(two[3]["gy"][0], two[2]["gy"][0])  # ∇f(y) of the step before kept
    for key in ("params", "gy"):
        assert _worst(two, one, key) <= 1e-6, key  # float32


def _cfg(*overrides):
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose("config", overrides=["optimizer=sampa", *overrides])


def test_each_role_takes_a_share_of_every_global_batch_and_one_process_is_refused_or_falls_back():
    cfg = _cfg()
    assert [training_share(cfg, r, 4) for r in range(4)] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [training_share(cfg, r, 2) for r in range(2)] == [(0, 1), (0, 1)]
    assert training_share(cfg, 0, 1) == (0, 1)  # the fallback (default)
    assert [training_share(cfg, r, 3) for r in range(3)] == [(0, 3), (1, 3), (2, 3)]
    refused = _cfg("optimizer.sequential_fallback=false")
    for world, has in ((1, "1 process;"), (3, "3 processes;")):
        with pytest.raises(UserError, match=f"sequential_fallback=false .* this run has {has}"):
            training_share(refused, 0, world)
    fsdp = _cfg("optimizer.sequential_fallback=false", "trainer.strategy=fsdp")
    with pytest.raises(UserError, match="this run has sharded parameters"):
        training_share(fsdp, 0, 2)
    # the checks before a run (sam-run's, in the launching process) count the processes to come
    validate_config(_cfg("optimizer.sequential_fallback=false", "trainer.devices=2",
                         "trainer.device=cpu"))  # fmt: skip
    with pytest.raises(UserError, match="this run has 1 process;"):
        validate_config(_cfg("optimizer.sequential_fallback=false", "trainer.device=cpu"))


@pytest.mark.slow  # CI's time (~18 s; the two-process steps equal the sequential ones above)
def test_a_two_process_run_equals_the_sequential_run_on_one(tmp_path):
    common = [
        "model=mlp",
        "dataset.num_samples=600",
        "dataset.batch_size=64",
        "trainer.epochs=2",
        "trainer.device=cpu",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    with pytest.warns(UserWarning, match="one after the other"):
        s1 = train(_cfg(*common), one, ["x"])
    s2 = distributed.launch(
        train, (_cfg(*common, "optimizer.sequential_fallback=false"), str(two), ["x"]), 2, CPU
    )
    assert s1["status"] == s2["status"] == "completed"
    rows1, rows2 = (
        [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (one, two)
    )
    assert len(rows1) == len(rows2) == 2
    for r1, r2 in zip(rows1, rows2):
        for key in ("step", "train_loss", "train_acc", "test_loss", "test_acc", "grad_evals"):
            assert r2[key] == pytest.approx(r1[key], abs=1e-5), key
    m1, m2 = (torch.load(d / "checkpoints" / "last.pt", weights_only=True) for d in (one, two))
    for k in m1["model"]:
        assert torch.allclose(m1["model"][k], m2["model"][k], atol=1e-5), k


@pytest.mark.slow  # 3 runs of 2 processes: 20-40 s; run with -m slow
def test_a_two_process_run_resumes_exactly(tmp_path):
    """1 epoch, then a resume to 2, equals 2 epochs straight, on 2 processes (∇f(y) is in rank
    0's checkpoint, the same on every process)."""
    from conftest import stopped_early_of

    common = [
        "model=mlp",
        "dataset.num_samples=600",
        "dataset.batch_size=64",
        "trainer.device=cpu",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
        "scheduler=constant",
        "optimizer.sequential_fallback=false",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for run_dir, epochs in ((straight, 2), (resumed, 1)):
        distributed.launch(train, (_cfg(*common, f"trainer.epochs={epochs}"), str(run_dir), ["x"]),
                           2, CPU)  # fmt: skip
    stopped_early_of(resumed, 2)
    distributed.launch(train, (_cfg(*common, "trainer.epochs=2"), str(resumed), ["x"]), 2, CPU)
    rows = [
        [
            {k: v for k, v in json.loads(line).items() if k != "time_s"}
            for line in (d / "metrics.jsonl").read_text().splitlines()
        ]
        for d in (straight, resumed)
    ]
    assert [r["epoch"] for r in rows[1]] == [1, 2]
    assert rows[0] == rows[1]
    m1, m2 = (
        torch.load(d / "checkpoints" / "last.pt", weights_only=True) for d in (straight, resumed)
    )
    assert all(torch.equal(m1["model"][k], m2["model"][k]) for k in m1["model"])
