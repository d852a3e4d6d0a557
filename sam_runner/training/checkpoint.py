"""What a checkpoint must match to be resumed, the RNG state it holds, and the summary a run
reads back before training."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ..errors import RunFolderConflict, UserError
from ..rundir import CHECKPOINT, METRICS, SHARDS, SUMMARY
from ..runfiles import json_problem, read_json, write_json
from ..settings import require_same_config, result_config


def fingerprint(cfg, model, world: int = 1) -> dict:
    """What a checkpoint must match to be resumed by this run: its structure, its settings and
    its number of data-parallel processes (per-process batches, ε and dropout depend on it)."""
    return {
        "model": str(cfg.model.arch),
        "dataset": str(cfg.dataset.name),
        "optimizer": str(cfg.optimizer.name),
        "base_optimizer": str(cfg.base_optimizer.name),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "world_size": int(world),
        "config": result_config(cfg),
    }


def require_resumable(saved: dict, now: dict, path: Path, run_dir: Path) -> None:
    require_same_config(saved.get("config"), now["config"], f"checkpoint {path}", run_dir)
    # checkpoints from before it was recorded: accepted
    world = saved.get("world_size", now["world_size"])
    if world != now["world_size"]:
        raise RunFolderConflict(
            f"checkpoint {path} was written by {world} data-parallel process(es) and this run has "
            f"{now['world_size']}: resume with {world} (trainer.devices, torchrun or SLURM tasks), "
            "or use another run folder"
        )
    structure = {k: v for k, v in now.items() if k not in ("config", "world_size")}
    if {k: saved.get(k) for k in structure} != structure:
        raise RunFolderConflict(
            f"checkpoint {path} belongs to a different run ({saved}); this run is {structure}: use "
            "another run folder or delete the checkpoint"
        )


def read_summary(run_dir: Path) -> dict | None:
    """summary.json, or None. A corrupt one is named in one line and rebuilt by this run from
    its checkpoint and metrics lines (``Run.resume``); without a checkpoint the job fails with
    that reason rather than train again over a result it cannot read."""
    path = run_dir / SUMMARY
    done = read_json(path)
    problem = None if done is not None else json_problem(path)
    if problem is None or problem == "missing":
        return done
    if not (run_dir / CHECKPOINT).exists():
        raise UserError(
            f"{path} is {problem} and there is no checkpoint to rebuild it from; restore it, or "
            "delete it to train the job again"
        )
    print(
        f"sam-run: {path} is {problem}; rebuilding it from {CHECKPOINT} and {METRICS}",
        file=sys.stderr,
    )
    return None


def write_failure(run_dir: Path, summary: dict) -> None:
    try:
        write_json(run_dir / SUMMARY, summary)
    except OSError:
        pass  # an unwritable run folder is reported by the error that got us here


class RNGState:
    """The global RNG states a resumed run must continue from (dropout, and anything else
    drawing)."""

    def __init__(self, device):
        self.device = device

    def state_dict(self) -> dict:
        cuda = self.device.type == "cuda"
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(self.device) if cuda else None,
        }

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        if self.device.type == "cuda" and state.get("cuda") is not None:
            torch.cuda.set_rng_state(state["cuda"], self.device)


def rank_seed(seed: int, epoch: int, rank: int) -> int:
    """The global RNG's seed of one data-parallel process for one epoch (one process: never
    reseeded)."""
    return ((int(seed) * 1_000_003 + int(epoch)) * 10_007 + int(rank) + 1) % (2**63)


# ---------------------------------------------------------------- sharded checkpoints (fsdp)


def local_state(value):
    """``value`` (nested dicts, lists, tuples) with each DTensor replaced by this process's local
    shard: what one process of a sharded run keeps of its optimizer's state."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.to_local().detach()
    if isinstance(value, dict):
        return {k: local_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(local_state(v) for v in value)
    return value


def save_sharded(checkpoint, state: dict, model, dist, step: int) -> None:
    """A sharded checkpoint, written by every process: the model's shards through
    ``torch.distributed.checkpoint`` into ``checkpoints/last.shards-<step>/`` (any number of
    processes can assemble it), each process's own state (optimizer shards, RNG, the parts') in
    ``rank<r>.pt`` there; then rank 0 points ``last.pt`` at it (the commit: a stop before leaves
    the previous checkpoint whole) and removes the older ones."""
    import shutil

    import torch.distributed.checkpoint as dcp

    folder = Path(checkpoint.path).parent
    name = f"{SHARDS}{step}"
    tmp = folder / f".{name}.tmp"
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp))
    torch.save(local_state(state), tmp / f"rank{dist.rank}.pt")
    dist.barrier()
    if dist.is_main:
        final = folder / name
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        pointer = {k: state[k] for k in ("fingerprint", "clock") if k in state}
        checkpoint.save({**pointer, "model": {}, "sharded": name, "world_size": dist.world})
        for old in folder.glob(f"{SHARDS}*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load_sharded(checkpoint, pointer: dict, model, rank: int) -> dict:
    """This process's part of the sharded checkpoint ``pointer`` (``last.pt``) names: its own
    state, and the model's shards read in place (every process of the run calls it)."""
    import torch.distributed.checkpoint as dcp

    folder = Path(checkpoint.path).parent / pointer["sharded"]
    state = torch.load(folder / f"rank{rank}.pt", map_location="cpu", weights_only=True)
    model_state = model.state_dict()
    dcp.load({"model": model_state}, checkpoint_id=str(folder))
    return {**state, "model": model_state}
