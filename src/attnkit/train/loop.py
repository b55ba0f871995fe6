"""A generic training loop: any model, any loss, any map-style dataset; DDP under torchrun.

What a run directory holds (all written by rank 0, each atomically: temporary
file + `os.replace`, so Ctrl-C or a crash leaves the last good version):

    config.json      the caller's `run_info` and the `TrainConfig`
    checkpoint.pt    model, optimizer, scheduler, epoch, step, history (after every epoch)
    metrics.json     the latest epoch's row at top level, per-epoch history,
                     parameter count, world size

Resuming (`resume=True`) restarts at the epoch after the last checkpoint, or inside the
last epoch where `max_steps` or `max_time` cut it short (its remaining batches, in the same
order, with the random state every rank had at the cut), and runs until the steps asked
for are done: ``min(epochs x batches per epoch, max_steps)``.
The global RNG is reseeded at the start of every epoch from (seed, epoch, rank),
so a resumed run draws the same shuffles and augmentations as an uninterrupted one.

`max_time` (seconds of this invocation's training) ends a run after the step during
which the time ran out, with a checkpoint there; it does not change the schedule, whose
end stays where the epochs and `max_steps` put it, so that a run stopped and resumed
takes the steps of one that never stopped. Cut inside an epoch, the run adds no history
row (the epoch's row comes when a resumed run finishes it: its train metrics so far are
in the checkpoint); metrics.json then holds the state at the stop, evaluated, at top
level, with ``"stopped": "max-time"``. Under DDP rank 0's clock decides, and one
one-element broadcast per step (only when `max_time` is set) makes every rank stop at
the same step: cheap beside the gradients' all-reduce, and a rank cannot run past it.
A `train_set` with a `set_epoch(epoch)` method is told the epoch before each
pass (as DistributedSampler is), so a dataset generated from a seed can give
fresh examples every epoch.

An "epoch" is simply the unit of evaluation and checkpointing: a step-budgeted
trainer sets the dataset's length to K batches to evaluate every K steps, caps
the run with `max_steps` and ends it early with `stop_when`.

Distributed: launch under `torchrun`; wrap the call in `distributed()` (which
runs `init_process_group`: gloo on CPU, nccl on GPU). `fit` then wraps the
model in DistributedDataParallel (gradients averaged over ranks), shards the
data with a DistributedSampler and splits `batch_size` (global) over ranks.

The loop's helpers: checkpoints in `_checkpoint`, the process group and DDP in `_ddp`,
the progress bar and epoch lines in `_progress`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from attnkit._io import atomic_write_json
from attnkit.train._checkpoint import (
    FORMAT,
    carry_over,
    cut_state,
    json_safe,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from attnkit.train._ddp import agree, distributed, rank_world, wrap_ddp
from attnkit.train._progress import print_row, progress_bar

__all__ = [
    "FORMAT",
    "FitResult",
    "StepResult",
    "TrainConfig",
    "TrainingDiverged",
    "distributed",
    "fit",
    "read_checkpoint",
]

CHECKPOINT, METRICS, CONFIG = "checkpoint.pt", "metrics.json", "config.json"


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; training stopped (the files written so far stay)."""


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (AdamW, linear warm-up then cosine decay per step)."""

    epochs: int = 40  # passes over the training set
    batch_size: int = 64  # global batch; each of W processes takes batch_size / W
    lr: float = 2e-3  # peak learning rate
    weight_decay: float = 0.05  # AdamW decoupled weight decay
    warmup: float = 0.05  # fraction of all steps spent warming up linearly
    grad_clip: float | None = 1.0  # max global gradient norm, None = no clipping
    seed: int = 0  # data order and augmentation; the caller seeds model init
    max_steps: int | None = None  # at most this many optimizer steps; the schedule ends there
    max_time: float | None = None  # seconds of training, then stop after the step (and save)


class StepResult(NamedTuple):
    """What a step function returns for one batch."""

    loss: Tensor  # scalar, the mean over the batch's `count` items
    count: int  # items the loss averages over (examples, tokens, ...)
    correct: int | None = None  # correctly predicted items, if accuracy means something


StepFn = Callable[[nn.Module, Any], StepResult]


@dataclass
class FitResult:
    history: list[dict[str, float]]  # one dict per epoch: train_loss, train_acc, eval metrics, ...
    params: int  # trainable parameters
    seconds: float  # wall-clock training time of this process (this invocation)
    # the latest metrics when `max_time` ended the run with steps left (an epoch cut short:
    # the state at the stop, not in `history`), else None
    stopped: dict[str, float] | None = None
    total_steps: int = 0  # the steps the run asked for (the schedule's length)


_clock = time.perf_counter  # the time source of `max_time` (a test may replace it)


# --------------------------------------------------------------------------- the loop


def fit(
    model: nn.Module,
    step: StepFn,
    train_set: Dataset,
    *,
    config: TrainConfig,
    out_dir: str | Path | None = None,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    collate_fn: Callable | None = None,
    resume: bool = False,
    run_info: dict | None = None,
    device: torch.device | str = "cpu",
    progress: bool = True,
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
    stop_when: Callable[[dict[str, float]], bool] | None = None,
) -> FitResult:
    """Train `model` with AdamW; return the history (and write a run directory if `out_dir`).

    Args:
        step: `step(model, batch) -> StepResult`, the loss of one batch (the
            model is in train mode; batches are moved to `device` first).
        train_set: map-style dataset; `collate_fn` as for DataLoader.
        evaluate: `evaluate(model) -> {"test_acc": ..., ...}` after every
            epoch, on rank 0, in eval mode under `torch.no_grad()`.
        resume: continue from `out_dir/checkpoint.pt` (an error if missing, or if it has
            done all the steps asked for already) until all of them are done. Without it,
            an `out_dir` that already holds a checkpoint is refused.
        run_info: JSON-able description of the run (model config, data) saved
            in config.json; a resumed run must have the same run_info.
        optimizer: `optimizer(params) -> torch.optim.Optimizer`; default AdamW
            with `config.lr` and `config.weight_decay`. The schedule scales its lr.
        stop_when: `stop_when(row) -> bool` on rank 0 with each epoch's history
            row (train and eval metrics, after the checkpoint is written); True
            ends training there on every rank, e.g. `lambda r: r["exact_match"] >= 1`.
    """
    rank, world = rank_world()
    if config.max_time is not None and not 0 < config.max_time < math.inf:
        raise ValueError(f"max_time must be a finite number of seconds > 0, got {config.max_time}")
    if config.batch_size % world:
        raise ValueError(
            f"batch_size must be a multiple of the {world} processes, got {config.batch_size}"
        )
    out = Path(out_dir) if out_dir is not None else None
    ckpt_path = out / CHECKPOINT if out is not None else None
    run_info = dict(run_info or {})
    model.to(device)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    sampler = DistributedSampler(train_set, world, rank, shuffle=True, seed=config.seed)
    loader = DataLoader(
        train_set, batch_size=config.batch_size // world, sampler=sampler, collate_fn=collate_fn
    )
    per_epoch = len(loader)
    total = config.epochs * per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    if optimizer is None:
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    else:
        opt = optimizer(list(model.parameters()))
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine(total, config.warmup))
    start_epoch, skip, done_steps, history, carried = 0, 0, 0, [], None
    if resume:
        state = load_checkpoint(ckpt_path, model, opt, scheduler, run_info)
        start_epoch, done_steps, history = state["epoch"], state["step"], state["history"]
        if done_steps >= total:
            raise ValueError(
                f"resume: {ckpt_path} has already done {start_epoch} epochs ({done_steps} "
                f"steps) of the {config.epochs} epochs ({total} steps) asked for: ask for more "
                "epochs or steps to continue training"
            )
        # An epoch cut short by max_steps or max_time is finished first (its batches come in
        # the same order again: the sampler's is fixed by seed and epoch), so that the epochs
        # and evaluations stay where an uninterrupted run has them.
        cut = state.get("epoch_steps", per_epoch)
        if state.get("epoch_length") == per_epoch and 0 < cut < per_epoch:
            start_epoch, skip, carried = start_epoch - 1, cut, state
    elif ckpt_path is not None and ckpt_path.exists():
        raise ValueError(
            f"out_dir {out} already holds {CHECKPOINT}; pass resume=True (--resume) to continue "
            "or choose another directory"
        )
    if out is not None and rank == 0:
        atomic_write_json(out / CONFIG, {"run": run_info, "train": dataclasses.asdict(config)})
    net = wrap_ddp(model, device, world)
    show = progress and rank == 0
    started = _clock()
    deadline = None if config.max_time is None else started + config.max_time

    def time_up() -> bool:  # rank 0's clock decides for every rank
        return deadline is not None and agree(_clock() >= deadline, device)

    stopped = None
    # One bar over all the run's steps, so that its ETA is the time to the end of training.
    with progress_bar(total, done_steps, show) as bar:
        # Until the steps asked for are done (every epoch takes at least one), not until
        # `config.epochs`: a run resumed from a checkpoint of other settings (another
        # max_steps or batch size) may need one epoch more than the count says.
        for epoch in itertools.count(start_epoch):
            if done_steps >= total or stopped is not None:
                break
            torch.manual_seed(_epoch_seed(config.seed, epoch, rank))
            sampler.set_epoch(epoch)
            if hasattr(train_set, "set_epoch"):
                train_set.set_epoch(epoch)
            bar.set_description(f"epoch {epoch + 1}/{config.epochs}", refresh=False)
            before = done_steps - skip
            batches = iter(loader)
            for _ in range(skip):  # already trained on
                next(batches)
            sums = carry_over(carried, rank, world, device)  # zeros if none
            skip, carried = 0, None
            sums, done_steps, out_of_time = _train_epoch(
                net, step, batches, opt, scheduler, config, device, done_steps, total, bar,
                sums, time_up,
            )  # fmt: skip
            where = {"epoch": epoch + 1, "step": done_steps, "epoch_steps":
                     done_steps - before, "epoch_length": per_epoch}  # fmt: skip
            cut = where["epoch_steps"] < per_epoch
            if cut:  # what finishing this epoch exactly needs (before evaluation draws any)
                where.update(cut_state(sums, world, device))
            row = {"epoch": epoch + 1, "step": done_steps, "lr": scheduler.get_last_lr()[0]}
            row.update(_train_stats(sums))
            # out of time inside the epoch: no history row, the epoch goes on after --resume
            partial = out_of_time and cut
            stop = False
            if rank == 0:
                if evaluate is not None:
                    row.update(_evaluate(model, evaluate))
                row["seconds"] = round(_clock() - started, 3)
                if partial:
                    row["epoch_steps"] = where["epoch_steps"]
                else:
                    history.append(row)
                if out is not None:
                    save_checkpoint(ckpt_path, model, opt, scheduler, where, history, run_info)
                stop = stop_when is not None and not partial and bool(stop_when(row))
                timed = out_of_time and not stop  # a run that reached its goal is done
                if out is not None:
                    why = "max-time" if timed else None
                    metrics = {**row, "stopped": why, "history": history, "params": params,
                               "world_size": world}  # fmt: skip
                    atomic_write_json(out / METRICS, json_safe(metrics))
                if show:
                    print_row(row, total if timed else None)
            if stop_when is not None and not partial and agree(stop, device):
                break
            if out_of_time:
                stopped = row
    seconds = _clock() - started
    return FitResult(history, params, seconds, stopped, total)


def _train_stats(sums: Tensor) -> dict[str, float]:
    """Mean train loss (and accuracy, if the steps count correct items) from the sums."""
    stats = {"train_loss": (sums[0] / sums[1]).item()}
    if sums[3] > 0:
        stats["train_acc"] = (sums[2] / sums[1]).item()
    return stats


def _train_epoch(net, step, batches, optimizer, scheduler, config, device, done, total, bar,
                 sums, time_up):  # fmt: skip
    """One pass over this rank's shard (or its rest); returns (train sums over all ranks:
    loss·count, count, correct, 1 if accuracy counts; the steps done; whether `time_up()`
    said to stop, asked after every step but the run's last)."""
    net.train()
    out_of_time = False
    for batch in batches:
        if done >= total:
            break
        result = step(net, _to_device(batch, device))
        loss = result.loss.item()
        if not math.isfinite(loss):
            raise TrainingDiverged(
                f"the training loss is {loss} at step {done + 1}; nothing after the last "
                "finite epoch was saved: lower the learning rate (--lr) and train again"
            )
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()  # DDP averages the gradients over ranks here
        if config.grad_clip is not None:
            nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip)
        optimizer.step()
        scheduler.step()
        done += 1
        has_acc = result.correct is not None
        sums += torch.tensor(
            [loss * result.count, result.count, result.correct or 0, 0],
            dtype=torch.float64,
        )
        sums[3] = float(has_acc)
        postfix = {"loss": f"{sums[0] / sums[1]:.4f}"}
        if has_acc:
            postfix["acc"] = f"{sums[2] / sums[1]:.2%}"
        bar.set_postfix(postfix, refresh=False)
        bar.update()
        if done < total and time_up():
            out_of_time = True
            break
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums)
    sums[3] = float(sums[3] > 0)
    return sums, done, out_of_time


def _evaluate(model: nn.Module, evaluate) -> dict[str, float]:
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            return dict(evaluate(model))
    finally:
        model.train(was)


def _warmup_cosine(total: int, warmup: float) -> Callable[[int], float]:
    """Learning-rate factor at step t: linear warm-up, then cosine decay to 0."""
    warm = max(1, int(total * warmup))

    def factor(t: int) -> float:
        if t < warm:
            return (t + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (t - warm) / max(1, total - warm))))

    return factor


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 1_009 + rank) % (2**63)


def _to_device(batch, device):
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch
