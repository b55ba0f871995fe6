"""What `attnkit.train.fit` writes into a run directory and reads back: the checkpoint
(`read_checkpoint`, the format marker, the state that finishes an epoch cut short step for
step) and JSON-safe metrics. Private: `attnkit.train.loop` re-exports the public names."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from attnkit._io import UnreadableFile, atomic_save, load_weights_only

# Written into every checkpoint, so that a file that is not one of ours (or is damaged) is
# told apart from an attnkit checkpoint before anything is loaded into a model.
FORMAT = "attnkit-checkpoint/1"


def read_checkpoint(path: str | Path, legacy_keys: tuple[str, ...] = ()) -> dict:
    """The dict `fit` saved at `path`, read with weights_only=True; ValueError naming the file
    if it cannot be read or carries no attnkit format marker (a dict holding all of
    `legacy_keys`, the layout of an older writer, is accepted without one)."""
    try:
        state = load_weights_only(path)
    except UnreadableFile as e:
        raise ValueError(
            f"{path} is not a readable attnkit checkpoint ({e}); "
            "point at the folder of an `attnkit train` run"
        ) from None
    legacy = isinstance(state, dict) and bool(legacy_keys) and all(k in state for k in legacy_keys)
    if not legacy and (not isinstance(state, dict) or state.get("format") != FORMAT):
        raise ValueError(
            f"{path} is not an attnkit checkpoint (no {FORMAT!r} marker); "
            "point at the folder of an `attnkit train` run"
        )
    return state


def json_safe(obj):
    """`obj` with NaN and infinities as None, so that the JSON written is valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def cut_state(sums: Tensor, world: int, device) -> dict:
    """The checkpoint's part that finishes an epoch cut short step for step: the train sums
    so far (over all ranks) and every rank's random state at the cut (a collective)."""
    mine = {"cpu": torch.get_rng_state()}
    if torch.device(device).type == "cuda":
        mine["cuda"] = torch.cuda.get_rng_state(device)
    rng = [mine]
    if world > 1:
        rng = [None] * world
        dist.all_gather_object(rng, mine)
    return {"epoch_sums": sums.tolist(), "rng": rng}


def carry_over(state: dict | None, rank: int, world: int, device) -> Tensor:
    """The train sums an epoch resumed inside starts from (rank 0 holds those of all ranks,
    since they are summed over ranks once more), with each rank's random state restored."""
    sums = torch.zeros(4, dtype=torch.float64)
    if state is None:
        return sums
    if "epoch_sums" in state and rank == 0:
        sums += torch.tensor(state["epoch_sums"], dtype=torch.float64)
    rng = state.get("rng") or []
    if len(rng) == world:  # else another world size: the epoch's seed stands
        torch.set_rng_state(rng[rank]["cpu"])
        if "cuda" in rng[rank] and torch.device(device).type == "cuda":
            torch.cuda.set_rng_state(rng[rank]["cuda"], device)
    return sums


def save_checkpoint(path, model, optimizer, scheduler, where: dict, history, run_info) -> None:
    """`where`: epoch (epochs begun), step (optimizer steps done), epoch_steps (steps of
    the last epoch done, of its epoch_length: fewer when max_steps or max_time cut it
    short, and then epoch_sums and rng, see `cut_state`)."""
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        **where,
        "history": history,
        "run_info": run_info,
        "format": FORMAT,
    }
    atomic_save(path, state)


def load_checkpoint(path, model, optimizer, scheduler, run_info) -> dict:
    if path is None or not path.exists():
        raise ValueError(f"resume: no checkpoint at {path}; train without --resume first")
    state = read_checkpoint(path)
    if state.get("run_info") != run_info:
        saved = state.get("run_info") or {}
        keys = sorted(k for k in set(saved) | set(run_info) if saved.get(k) != run_info.get(k))
        raise ValueError(f"resume: {path} was trained with different settings for {keys}")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state
