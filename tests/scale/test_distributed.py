"""Data parallelism over gloo on the CPU, 2 real processes (sam_runner.distributed)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import nn

from sam_runner import distributed
from sam_runner.errors import UserError
from sam_runner.optim import SAM
from sam_runner.paths import config_dir
from sam_runner.sweep.jobs import run_parallel
from sam_runner.train import train

CPU = torch.device("cpu")


def compose_cfg(*overrides):
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ---------------------------------------------------------------- probes run in the started
# processes
def _steps(opt, net, rank: int, steps: int = 3):
    """``steps`` optimizer steps of ``net`` on this process's own shard of random data; yields after
    each."""
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)

        def closure():
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            return loss

        opt.step(closure)
        yield


def _perturbation_probe():
    """Per step: how far the two processes' ε and parameters are apart, for both sync modes."""
    topo = distributed.current()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
    cfg = OmegaConf.create({"trainer": {"sync_batchnorm": False}})
    out = {}
    for sync in (False, True):
        m = copy.deepcopy(model)
        opt = SAM(m.parameters(), torch.optim.SGD, rho=0.1, lr=0.1, sync_perturbation=sync)
        net = topo.wrap(m, cfg)
        opt.bind(model=net)
        seen, perturb = {}, opt.perturb_

        def recording(params, pgrads, perturb=perturb, seen=seen):
            # ε as applied: SAM builds it in the gradients' storage, which the next pass reuses
            theta = [p.detach().clone() for p in params]
            perturb(params, pgrads)
            seen["eps"] = [p.detach() - t for p, t in zip(params, theta)]

        opt.perturb_ = recording
        eps_gap, param_gap = [], []
        for _ in _steps(opt, net, topo.rank):
            eps = torch.cat([e.flatten() for e in seen["eps"]])
            params = torch.cat([p.detach().flatten() for p in m.parameters()])
            both_eps, both_params = topo.gather(eps[None]), topo.gather(params[None])
            eps_gap.append(float((both_eps[0] - both_eps[1]).abs().max()))
            param_gap.append(float((both_params[0] - both_params[1]).abs().max()))
        out[sync] = {"eps_gap": eps_gap, "param_gap": param_gap, "eps_norm": float(eps.norm())}
    out["uneven_gather"] = topo.gather(torch.arange(topo.rank + 1)).tolist()
    out["sum"] = float(topo.sum(torch.tensor(float(topo.rank + 1))))
    return out


def _rank1_fails():
    topo = distributed.current()
    if topo.rank == 1:
        raise UserError("rank 1 refuses")
    torch.distributed.barrier()  # rank 0 would wait here forever without the launcher ending it
    return "unreachable"


def _sgs_probe():
    """Each process observes its own losses for one step; the epoch's class weights after it."""
    from sam_runner.samplers import SGSSampler

    topo = distributed.current()
    g = torch.Generator().manual_seed(7 + topo.rank)
    targets = torch.tensor([0, 0, 1, 2, 2, 2] if topo.rank == 0 else [0, 1, 1, 1, 2, 0])
    sampler = SGSSampler(3)
    loss0 = torch.rand(6, generator=g)
    sampler.observe(0, None, targets, loss0)
    sampler.observe(1, None, targets, loss0 + torch.rand(6, generator=g))
    sampler.end_epoch(None)  # S and n from both processes' sums
    return {
        name: topo.gather(t[None]).tolist()
        for name, t in (
            ("weights", sampler.class_weights),
            ("s", sampler.sharpness),
            ("n", sampler.counts),
        )
    }


def _openmp_work(threads: int) -> float:
    """Elementwise kernels on a large tensor: OpenMP work with ``threads`` threads."""
    torch.set_num_threads(threads)
    x = torch.linspace(0, 1, 1_000_000)
    for _ in range(10):
        x = (x * 1.0001).exp().log()
    return float(x.sum())


def _openmp_then_wait(pid_dir):
    """This process's pid in ``pid_dir``, OpenMP work with 2 threads (it hangs in a process forked
    after the launcher's own OpenMP work), a ``.ready`` file, then wait to be ended."""
    rank = distributed.current().rank
    Path(pid_dir, f"{rank}.pid").write_text(str(os.getpid()))
    _openmp_work(2)
    Path(pid_dir, f"{rank}.ready").touch()
    time.sleep(600)


def _train_failing_on_rank1(cfg, run_dir, overrides, trial=None):
    """train(), with process 1's evaluation failing: process 0 then fails too, a moment later, in
    the collective process 1 left ("Connection closed by peer")."""
    import sam_runner.training.evaluation as evaluation  # where the run's evaluation looks it up

    if distributed.current().rank == 1:

        def evaluate(*_args, **_kwargs):
            raise RuntimeError("boom on rank 1")

        evaluation.evaluate = evaluate
    # the real one (a test replaces sam_runner.train.train by this)
    return train(cfg, run_dir, overrides, trial)


def _stateful_variants_probe():
    """Per-process data and perturbations (sync_perturbation=False): GEAR-SAM's block energies
    and PrecondSAM's F after a few steps, from both processes."""
    from sam_runner.optim import GEARSAM, PrecondSAM

    topo = distributed.current()
    cfg = OmegaConf.create({"trainer": {"sync_batchnorm": False}})
    out = {}
    for name, make in (
        ("gear_sam", lambda ps: GEARSAM(ps, torch.optim.SGD, rho=0.1, lr=0.1, blocks="tensor")),
        (
            "precond_sam",
            lambda ps: PrecondSAM(ps, torch.optim.SGD, rho=0.1, lr=0.1, refresh_every=2),
        ),
    ):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
        opt = make(model.parameters())
        net = topo.wrap(model, cfg)
        opt.bind(model=net)
        for _ in _steps(opt, net, topo.rank):
            pass
        if name == "gear_sam":
            state = opt.block_energy
        else:
            state = torch.cat([opt.state[p]["fisher"].flatten() for p in model.parameters()])
        out[name] = topo.gather(state[None]).tolist()
    return out


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


LAUNCHER = """
import sys, torch
sys.path.insert(0, {tests!r})
from sam_runner import distributed
from test_distributed import _openmp_then_wait, _openmp_work
_openmp_work(2)  # this process's own OpenMP work first (a job trained here before the launch)
distributed.launch(_openmp_then_wait, ({pid_dir!r},), 2, torch.device("cpu"))
"""


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],  # CI's time
    ids=["SIGTERM", "SIGKILL"],
)
def test_processes_start_after_openmp_work_and_die_with_the_launcher(sig, tmp_path):
    """A launcher that ran OpenMP work starts processes that can run OpenMP work (forked ones
    hang); SIGTERM (the launcher ends them) or SIGKILL (they notice) leaves none running."""
    code = LAUNCHER.format(tests=str(Path(__file__).parent), pid_dir=str(tmp_path))
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"{rank}.ready").exists() for rank in (0, 1)):
            assert launcher.poll() is None, launcher.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the processes never got through their OpenMP work"
            time.sleep(0.05)
        pids = [int((tmp_path / f"{rank}.pid").read_text()) for rank in (0, 1)]
        launcher.send_signal(sig)
        assert launcher.wait(30) == -sig
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)], "processes outlived their launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for f in tmp_path.glob("*.pid"):
            if f.read_text() and _alive(int(f.read_text())):
                os.kill(int(f.read_text()), signal.SIGKILL)


def test_sgs_statistics_are_global_and_the_same_in_every_process():
    """S and n are those of the global batch (each step's class sums all-reduced), identical on
    every process, so the processes draw alike and rank 0's checkpoint is the global state."""
    out = distributed.launch(_sgs_probe, (), 2, CPU)
    weights, s, n = (torch.tensor(out[k], dtype=torch.float64) for k in ("weights", "s", "n"))
    assert (
        torch.equal(weights[0], weights[1]) and torch.equal(s[0], s[1]) and torch.equal(n[0], n[1])
    )
    # the union of both processes' samples, recomputed here: Δ_c = mean over class c of the rise
    targets, rises = [], []
    for rank, t in ((0, [0, 0, 1, 2, 2, 2]), (1, [0, 1, 1, 1, 2, 0])):
        g = torch.Generator().manual_seed(7 + rank)
        torch.rand(6, generator=g)  # the first-pass losses
        targets.append(torch.tensor(t))
        rises.append(torch.rand(6, generator=g))
    targets, rises = torch.cat(targets), torch.cat(rises).double()
    delta = torch.stack([rises[targets == c].mean() for c in range(3)])
    torch.testing.assert_close(s[0], delta, rtol=1e-6, atol=0)
    assert n[0].tolist() == [4, 4, 4]
    z = (delta - delta.mean()) / delta.std(unbiased=False)
    torch.testing.assert_close(
        weights[0], (n[0] + 1) ** -0.5 * torch.exp(-0.5 * z), rtol=1e-5, atol=0
    )


def test_sync_false_gives_per_process_perturbations_and_identical_parameters():
    out = distributed.launch(_perturbation_probe, (), 2, CPU)
    per_process, synced = out[False], out[True]
    # false (the SAM paper's per-accelerator ε): the first pass really ran without all-reduce
    assert all(gap > 1e-4 for gap in per_process["eps_gap"]), per_process
    # ... yet the second pass is synchronised, so parameters never drift apart
    assert all(gap == 0.0 for gap in per_process["param_gap"]), per_process
    # true: the first-pass gradient is averaged, so ε is the same everywhere
    assert all(gap < 1e-6 for gap in synced["eps_gap"]), synced
    assert all(gap == 0.0 for gap in synced["param_gap"]), synced
    assert synced["eps_norm"] == pytest.approx(0.1, rel=1e-4)  # ‖ε‖ = ρ
    assert out["uneven_gather"] == [0, 0, 1]
    assert out["sum"] == 3.0


def test_two_processes_match_one_at_the_same_global_batch(tmp_path):
    cfg = compose_cfg(
        "model=mlp",
        "dataset.num_samples=600",
        "dataset.batch_size=64",
        "trainer.epochs=2",
        "trainer.device=cpu",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
        "optimizer.sync_perturbation=true",
    )
    one, two = tmp_path / "one", tmp_path / "two"
    s1 = train(cfg, one, ["x"])
    s2 = distributed.launch(train, (cfg, str(two), ["x"]), 2, CPU)
    assert s1["status"] == s2["status"] == "completed"
    rows1 = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    rows2 = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(rows1) == len(rows2) == 2
    for r1, r2 in zip(rows1, rows2):
        for key in (
            "step",
            "train_loss",
            "train_acc",
            "test_loss",
            "test_acc",
            "test_ece",
            "test_nll",
        ):
            assert r2[key] == pytest.approx(r1[key], abs=1e-5), key
    m1 = torch.load(one / "checkpoints" / "last.pt", weights_only=True)["model"]
    m2 = torch.load(two / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert m1.keys() == m2.keys()
    for k in m1:
        assert torch.allclose(m1[k], m2[k], atol=1e-5), k
    # rank 0 alone wrote the run's files
    assert sorted(p.name for p in two.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in one.iterdir() if not p.name.startswith(".")
    )


def test_a_failing_process_ends_the_others_and_reports_its_error():
    with pytest.raises(UserError, match="rank 1 refuses"):
        distributed.launch(_rank1_fails, (), 2, CPU, grace_s=2.0)


def test_the_earliest_failure_is_raised_and_recorded_not_its_echo(tmp_path, monkeypatch):
    """Process 1 fails; process 0 fails after it ("Connection closed by peer") and writes its own
    summary.json. The error raised, and the one in summary.json, are process 1's."""
    import sam_runner.train

    cfg = compose_cfg(
        "model=mlp",
        "dataset.num_samples=600",
        "dataset.batch_size=64",
        "trainer.epochs=1",
        "trainer.device=cpu",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
        "trainer.devices=2",
    )
    # run_parallel starts sam_runner.train.train in each process; here, the wrapper above
    monkeypatch.setattr(sam_runner.train, "train", _train_failing_on_rank1)
    with pytest.raises(
        RuntimeError, match=r"^data-parallel process 1 failed: RuntimeError: boom on rank 1$"
    ):
        run_parallel(cfg, tmp_path, ["x=1"])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {
        "status": "failed",
        "error": "data-parallel process 1 failed: RuntimeError: boom on rank 1",
        "overrides": ["x=1"],
    }


def test_a_requeue_signal_to_the_launcher_is_an_interruption_not_a_failure(tmp_path):
    """submitit requeues on SIGUSR2, then sys.exit()s: the processes are ended, and no failed
    summary.json is written (the requeued job resumes from the checkpoint)."""
    from test_train import requeue_signal_once

    cfg = compose_cfg(
        "model=mlp",
        "dataset.num_samples=600",
        "dataset.batch_size=64",
        "trainer.epochs=50",
        "trainer.device=cpu",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
        "trainer.devices=2",
    )
    ckpt = tmp_path / "checkpoints" / "last.pt"
    with requeue_signal_once(ckpt), pytest.raises(SystemExit):
        run_parallel(cfg, tmp_path, ["x=1"])
    assert ckpt.exists() and not (tmp_path / "summary.json").exists()


def test_stateful_variants_keep_one_global_state_under_per_process_perturbations():
    out = distributed.launch(_stateful_variants_probe, (), 2, CPU)
    for name in ("gear_sam", "precond_sam"):
        state = torch.tensor(out[name])
        assert torch.equal(state[0], state[1]), name
        assert state.abs().sum() > 0, name


@pytest.mark.slow  # 10-30 s: outside CI's 30-minute budget; run with -m slow
def test_resume_under_ddp_with_per_process_perturbations_is_exact(tmp_path):
    """1 epoch, then a resume to 2, equals 2 epochs straight (gear_sam, sync_perturbation=false:
    its block energies are global, so rank 0's checkpoint holds every process's state).
    Resuming it in one process is refused."""
    from conftest import stopped_early_of

    common = [
        "model=mlp",
        "dataset.num_samples=600",
        "dataset.batch_size=64",
        "trainer.device=cpu",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
        "scheduler=constant",
        "optimizer=gear_sam",
        "optimizer.sync_perturbation=false",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    distributed.launch(
        train, (compose_cfg(*common, "trainer.epochs=2"), str(straight), ["x"]), 2, CPU
    )
    distributed.launch(
        train, (compose_cfg(*common, "trainer.epochs=1"), str(resumed), ["x"]), 2, CPU
    )
    stopped_early_of(resumed, 2)
    with pytest.raises(
        UserError, match=r"written by 2 data-parallel process\(es\) and this run has 1"
    ) as e:
        train(compose_cfg(*common, "trainer.epochs=2"), resumed, ["x"])
    assert "\n" not in str(e.value)
    distributed.launch(
        train, (compose_cfg(*common, "trainer.epochs=2"), str(resumed), ["x"]), 2, CPU
    )
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
        torch.load(d / "checkpoints" / "last.pt", weights_only=True)["model"]
        for d in (straight, resumed)
    )
    assert all(torch.equal(m1[k], m2[k]) for k in m1)


def test_more_devices_than_gpus_is_a_one_line_error():
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(UserError, match=r"trainer\.device") as e:
        distributed.check_devices(have + 1, "cuda")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"trainer\.devices=0"):
        distributed.check_devices(0, "cpu")
    assert distributed.check_devices(4, "cpu") == CPU  # gloo processes: any number on the CPU


def test_rank_and_world_from_torchrun_and_slurm_environments():
    assert distributed.from_env({}) is None
    assert distributed.from_env({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert distributed.from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == (3, 4, 1)
    slurm = {
        "SLURM_PROCID": "2",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "4",
    }
    assert distributed.from_env(slurm) == (2, 4, 0)
    # the batch script of a 4-task allocation is one process, not rank 0 of 4
    assert distributed.from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None
    # an array job's single task
    assert distributed.from_env({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}) is None


def test_one_process_topology_is_the_identity():
    topo = distributed.Topology()
    t = torch.arange(3.0)
    assert topo.is_main and topo.sum(t) is t and topo.gather(t) is t and topo.max(t) is t
    model = nn.Linear(2, 2)
    assert topo.wrap(model, OmegaConf.create({"trainer": {}})) is model


@pytest.mark.slow
def test_torchrun_starts_the_same_code_with_rank_and_world_from_the_environment(tmp_path):
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    port = distributed.free_port()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            f"--master-port={port}",
            "-m",
            "sam_runner.cli",
            "model=mlp",
            "dataset.num_samples=800",
            "trainer.epochs=2",
            "metrics.hessian.enabled=false",
            "trainer.progress=lines",
            "trainer.device=cpu",
            f"hydra.run.dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("completed: test_acc=") == 1  # rank 0 alone reports
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert [
        json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ] == [1, 2]
