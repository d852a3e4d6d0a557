"""Data parallelism over gloo on the CPU, 2 real processes (sam_runner.distributed)."""
from __future__ import annotations

import copy
import json
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
from sam_runner.train import train

CPU = torch.device("cpu")


def compose_cfg(*overrides):
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return compose("config", overrides=list(overrides))


# ---------------------------------------------------------------- probes run in the spawned processes
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
        g = torch.Generator().manual_seed(100 + topo.rank)  # each process its own shard
        eps_gap, param_gap = [], []
        for _ in range(3):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)

            def closure():
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(net(x), y)
                loss.backward()
                return loss

            opt.step(closure)
            eps = torch.cat([e.flatten() for e in opt._cache["eps"]])
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
    sampler.end_epoch(None)  # S and n stay this process's own; the weights come from the pooled ones
    return {name: topo.gather(t[None]).tolist()
            for name, t in (("weights", sampler.class_weights), ("s", sampler.sharpness), ("n", sampler.counts))}


# ---------------------------------------------------------------- tests
def test_sgs_class_weights_are_the_same_in_every_process_from_pooled_statistics():
    """S averaged and counts summed over processes before the weights: both draw alike."""
    out = distributed.launch(_sgs_probe, (), 2, CPU)
    weights, s, n = (torch.tensor(out[k], dtype=torch.float64) for k in ("weights", "s", "n"))
    assert torch.equal(weights[0], weights[1])
    s, n = s.mean(0), n.sum(0)     # every class was seen by some process
    z = (s - s.mean()) / s.std(unbiased=False)
    want = (n + 1) ** -0.5 * torch.exp(-0.5 * z)
    torch.testing.assert_close(weights[0], want, rtol=1e-5, atol=0)
    # the pooled weights are not what either process would have drawn alone
    alone = (torch.tensor(out["n"][0], dtype=torch.float64) + 1) ** -0.5
    assert not torch.allclose(weights[0] / weights[0].sum(), alone / alone.sum(), rtol=1e-3)
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
    cfg = compose_cfg("model=mlp", "dataset.num_samples=600", "dataset.batch_size=64", "trainer.epochs=2",
                      "trainer.device=cpu", "trainer.progress=none", "metrics.hessian.enabled=false",
                      "optimizer.sync_perturbation=true")
    one, two = tmp_path / "one", tmp_path / "two"
    s1 = train(cfg, one, ["x"])
    s2 = distributed.launch(train, (cfg, str(two), ["x"]), 2, CPU)
    assert s1["status"] == s2["status"] == "completed"
    rows1 = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    rows2 = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert len(rows1) == len(rows2) == 2
    for r1, r2 in zip(rows1, rows2):
        for key in ("step", "train_loss", "train_acc", "test_loss", "test_acc", "test_ece", "test_nll"):
            assert r2[key] == pytest.approx(r1[key], abs=1e-5), key
    m1 = torch.load(one / "checkpoints" / "last.pt", weights_only=True)["model"]
    m2 = torch.load(two / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert m1.keys() == m2.keys()
    for k in m1:
        assert torch.allclose(m1[k], m2[k], atol=1e-5), k
    # rank 0 alone wrote the run's files
    assert sorted(p.name for p in two.iterdir() if not p.name.startswith(".")) == \
        sorted(p.name for p in one.iterdir() if not p.name.startswith("."))


def test_a_failing_process_ends_the_others_and_reports_its_error():
    with pytest.raises(UserError, match="rank 1 refuses"):
        distributed.launch(_rank1_fails, (), 2, CPU, grace_s=2.0)


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
    slurm = {"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4"}
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
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                          f"--master-port={port}", "-m", "sam_runner.cli", "model=mlp", "dataset.num_samples=800",
                          "trainer.epochs=2", "metrics.hessian.enabled=false", "trainer.progress=lines",
                          "trainer.device=cpu", f"hydra.run.dir={run_dir}"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("completed: test_acc=") == 1  # rank 0 alone reports
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert [json.loads(line)["epoch"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
