"""The SGS sampler (sam_runner/samplers.py): Δ_c from the two passes, its EMA, the class
weights (n_c + 1)^(−α) exp(−λ ẑ(S_c)), the loader's per-example weights, resume, and the
statistics pooled over 2 real processes (gloo)."""

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sam_runner.data.loaders import TensorLoader
from sam_runner.distributed import free_port
from sam_runner.errors import UserError
from sam_runner.samplers import SGSSampler, build_sampler


def _loader(y):
    return TensorLoader(torch.zeros(len(y), 1), y, 4, shuffle=True, drop_last=True)


def _step(s, targets, loss0, loss1, micro=1):
    """One SAM step as the runner reports it: every micro-batch of pass 0, then of pass 1."""
    for p, losses in ((0, loss0), (1, loss1)):
        for t, l in zip(
            targets.chunk(micro), torch.as_tensor(losses, device=targets.device).chunk(micro)
        ):
            s.observe(p, None, t, l)


def test_sgs_weights_follow_the_formula():
    y = torch.tensor([0, 0, 0, 1, 1, 2])
    s = SGSSampler(3, alpha=0.5, lam=0.5, beta=0.9)
    t1, t2 = torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 0])
    _step(s, t1, [1.0, 2.0, 1.0, 1.0], [1.5, 2.5, 1.2, 3.0])  # Δ = (0.5, 0.2, 2.0)
    _step(s, t2, [1.0, 1.0, 1.0, 1.0], [1.1, 1.4, 1.0, 1.3], micro=2)  # Δ = (0.2, 0.2, —)
    loader = _loader(y)
    s.end_epoch(loader)
    S = torch.tensor([0.9 * 0.5 + 0.1 * 0.2, 0.9 * 0.2 + 0.1 * 0.2, 2.0])
    n = torch.tensor([4.0, 3.0, 1.0])
    z = (S - S.mean()) / S.std(unbiased=False)
    w = (n + 1) ** -0.5 * torch.exp(-0.5 * z)
    torch.testing.assert_close(s.class_weights, w)
    torch.testing.assert_close(loader.weights, w[y])
    assert s.log_values()["sgs_weight_ratio"] == pytest.approx((w.max() / w.min()).item())


def test_sgs_pairs_a_perturbing_step_with_its_own_first_pass():
    """Plain steps (interval > 1) leave pass-0 records only: they count but teach no Δ."""
    s = SGSSampler(2, beta=0.0)
    s.observe(0, None, torch.tensor([0, 1]), torch.tensor([9.0, 9.0]))  # a plain step
    _step(s, torch.tensor([0, 1]), [1.0, 1.0], [2.0, 1.5])
    s.end_epoch(None)
    torch.testing.assert_close(s.sharpness, torch.tensor([1.0, 0.5]))
    torch.testing.assert_close(s.counts, torch.tensor([2.0, 2.0]))


def _draws(loader):
    return [idx.tolist() for _, _, idx in loader]


def test_sgs_resume_through_a_cpu_checkpoint_continues_as_if_uninterrupted(tmp_path):
    y = torch.tensor([0, 1, 1, 1])
    steps = [
        (torch.tensor([0, 1]), [1.0, 1.0], [2.0, 1.5]),
        (torch.tensor([1, 1]), [1.0, 2.0], [1.25, 2.0]),
    ]
    whole = SGSSampler(2, loader=_loader(y))
    for step in steps:
        _step(whole, *step)
        whole.end_epoch(whole.loader)
    first = SGSSampler(2, loader=_loader(y))
    _step(first, *steps[0])
    first.end_epoch(first.loader)
    torch.save(first.state_dict(), tmp_path / "last.pt")
    resumed = SGSSampler(2, loader=_loader(y))
    resumed.load_state_dict(torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=True))
    # the weighted loader still yields full batches
    assert _draws(resumed.loader) == _draws(first.loader)
    _step(resumed, *steps[1])
    resumed.end_epoch(resumed.loader)
    torch.testing.assert_close(resumed.loader.weights, whole.loader.weights)


def test_sgs_state_read_onto_the_cpu_moves_to_the_loaders_device(tmp_path):
    """Checkpoints load with map_location="cpu"; a GPU run's next step must not mix devices.
    The meta device stands in for the GPU (same dispatch checks, no data)."""
    s = SGSSampler(2)
    _step(s, torch.tensor([0, 1]), [1.0, 1.0], [2.0, 1.5])
    s.end_epoch(None)
    torch.save(s.state_dict(), tmp_path / "last.pt")
    y = torch.tensor([0, 1, 1, 1], device="meta")
    resumed = SGSSampler(
        2, loader=TensorLoader(torch.zeros(4, 1, device="meta"), y, 4, shuffle=True)
    )
    resumed.load_state_dict(torch.load(tmp_path / "last.pt", map_location="cpu", weights_only=True))
    assert {t.device.type for t in resumed.state_dict().values()} == {"meta"}
    _step(resumed, y[:2], [1.0, 1.0], [2.0, 1.5])
    resumed.end_epoch(resumed.loader)  # mixing cpu state with meta losses raised here
    assert resumed.loader.weights.device == y.device


def test_weighted_draw_is_the_cpu_draw_of_the_loaders_generator():
    """The order comes from CPU weights and the loader's CPU generator, wherever the weights
    live."""
    y = torch.tensor([0, 1, 1, 1, 2, 2, 2, 2])
    loader = _loader(y)
    loader.set_epoch(3)
    loader.weights = torch.tensor([4.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    want = torch.multinomial(
        loader.weights.cpu(), len(y), replacement=True, generator=loader.generator()
    )
    assert _draws(loader) == want.view(-1, 4).tolist()


@pytest.mark.cuda
def test_sgs_on_cuda_draws_as_on_the_cpu_and_resumes_from_a_cpu_checkpoint(tmp_path):
    y = torch.tensor([0, 1, 1, 1, 2, 2, 2, 2])
    draws = {}
    for dev in ("cpu", "cuda"):
        s = SGSSampler(3, loader=_loader(y.to(dev)))
        _step(s, torch.tensor([0, 1, 2, 2], device=dev), [1.0] * 4, [2.0, 1.5, 1.0, 1.25])
        s.end_epoch(s.loader)
        torch.save(s.state_dict(), tmp_path / f"{dev}.pt")
        resumed = SGSSampler(3, loader=_loader(y.to(dev)))
        resumed.load_state_dict(
            torch.load(tmp_path / f"{dev}.pt", map_location="cpu", weights_only=True)
        )
        _step(resumed, torch.tensor([1, 1, 2, 0], device=dev), [1.0] * 4, [1.5, 1.0, 2.0, 1.0])
        resumed.end_epoch(resumed.loader)
        draws[dev] = _draws(resumed.loader)
    assert draws["cuda"] == draws["cpu"]


# ------------------------------------------------------------------- 2 processes (gloo)
C = 4
# two epochs of two steps; a global batch of 8, rank r takes positions r, r + 2, ... (TensorLoader's
# split)
EPOCHS = [
    [[0, 1, 2, 0, 3, 1, 0, 0], [2, 2, 1, 3, 0, 0, 1, 0]],
    [[1, 0, 3, 2, 0, 1, 2, 1], [0, 3, 0, 1, 1, 2, 0, 0]],
]
Y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 3])


def _epoch(sampler, e, rank=0, world=1):
    """Epoch ``e`` of SAM steps with dyadic losses (sums are exact in any order), then its end."""
    g = torch.Generator().manual_seed(e)
    for targets in EPOCHS[e]:
        loss0 = torch.randint(0, 8, (8,), generator=g) / 4
        loss1 = loss0 + torch.randint(0, 8, (8,), generator=g) / 8
        _step(sampler, torch.tensor(targets)[rank::world], loss0[rank::world], loss1[rank::world])
    sampler.end_epoch(sampler.loader)


def _state(sampler):
    return {k: sampler.state_dict()[k] for k in ("sharpness", "counts")} | {
        "weights": sampler.loader.weights
    }


def _sgs_worker(rank, port, path, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        whole, first = SGSSampler(C, loader=_loader(Y)), SGSSampler(C, loader=_loader(Y))
        _epoch(whole, 0, rank, 2)
        after_one = _state(whole)
        _epoch(whole, 1, rank, 2)
        _epoch(first, 0, rank, 2)
        if rank == 0:  # as the runner does: rank 0 writes, every rank reads it onto the CPU
            torch.save(first.state_dict(), path)
        dist.barrier()
        resumed = SGSSampler(C, loader=_loader(Y))
        resumed.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        _epoch(resumed, 1, rank, 2)
        out[rank] = {"one": after_one, "two": _state(whole), "resumed": _state(resumed)}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # CI's time (~11 s)
def test_sgs_statistics_over_two_processes_are_the_global_ones_and_resume_exactly(tmp_path):
    """S and n are those of one process seeing every global batch (a class one process did not
    see is not averaged in as 0), on every process; rank 0's checkpoint resumes both exactly."""
    single = SGSSampler(C, loader=_loader(Y))
    _epoch(single, 0)
    want_one = _state(single)
    _epoch(single, 1)
    want_two = _state(single)
    out = mp.Manager().dict()
    mp.spawn(_sgs_worker, args=(free_port(), str(tmp_path / "last.pt"), out), nprocs=2, join=True)
    for rank in (0, 1):
        for got, want in (
            (out[rank]["one"], want_one),
            (out[rank]["two"], want_two),
            (out[rank]["resumed"], want_two),
        ):
            for k in want:
                torch.testing.assert_close(got[k], want[k], msg=f"rank {rank}: {k}")


def test_sgs_rarely_sampled_and_sharp_classes_are_drawn_less_or_more_as_designed():
    """Equal sharpness: the rarer class gets the larger weight. Equal counts: the sharper one the
    smaller."""
    s = SGSSampler(2)
    _step(s, torch.tensor([0, 0, 0, 1]), [1.0] * 4, [1.1] * 4)
    s.end_epoch(None)
    assert s.class_weights[1] > s.class_weights[0]
    s = SGSSampler(2)
    _step(s, torch.tensor([0, 1]), [1.0, 1.0], [1.1, 3.0])
    s.end_epoch(None)
    assert s.class_weights[1] < s.class_weights[0]
    assert math.isclose(
        float(s.class_weights[0] / s.class_weights[1]), math.exp(0.5 * 2), rel_tol=1e-5
    )


class _Cfg(dict):
    def __getattr__(self, k):
        return self[k]


def test_sgs_config_errors():
    data = type("D", (), {"train": _loader(torch.tensor([0, 1])), "num_classes": 2})()
    with pytest.raises(UserError, match="unknown keys"):
        build_sampler(_Cfg(name="mnist1d", sampler="sgs", sgs={"alpah": 1.0}), data)
    with pytest.raises(UserError, match="alpha"):
        build_sampler(_Cfg(name="mnist1d", sampler="sgs", sgs={"alpha": -1.0}), data)
    with pytest.raises(UserError, match="dataset.sgs.lam='x' must be a number"):
        build_sampler(_Cfg(name="mnist1d", sampler="sgs", sgs={"lam": "x"}), data)
    with pytest.raises(UserError, match="samples by index"):
        build_sampler(
            _Cfg(name="image_folder", sampler="sgs"),
            type("D", (), {"train": object(), "num_classes": 2})(),
        )
    assert isinstance(build_sampler(_Cfg(name="mnist1d", sampler="sgs"), data), SGSSampler)
