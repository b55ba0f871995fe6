"""Training a seq2seq model (Transformer, RNN, Universal Transformer) on a synthetic task,
with checkpoints, metrics and resume.

The loop is the shared `attnkit.train.fit` (progress bar, atomic checkpoints,
resume, Ctrl-C safety, DDP under torchrun); this module only maps the
step-budgeted recipe onto it: one fit "epoch" is `eval_every` steps over a
`TaskDataset` of `eval_every * batch_size` examples, freshly generated from the
seed every epoch; `max_steps` is `steps`; `stop_when` ends the run once the
held-out exact match reaches `stop_at`; `max_time` stops it after the step during which
that many seconds have passed (the schedule still ends at `steps`, so that a resumed run
goes on step for step).

Files in `out` (rank 0, each written atomically): ``checkpoint.pt`` (model,
optimizer, schedule, step, history; model kind, config and task in its run_info),
``config.json`` (model, task, held-out set, training), ``metrics.json`` (the
latest held-out exact match, step and seconds at top level, the history,
world size), ``alignment_<i>.png`` (cross-attention of a few held-out
examples, after training; none for an RNN without attention).

The model kinds are in `attnkit.seq2seq.kinds`; a Universal Transformer with adaptive
computation time adds its ponder cost times `ponder_weight` to the loss.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from attnkit.models.decoding import greedy
from attnkit.seq2seq.alignment import write_alignments
from attnkit.seq2seq.kinds import (
    ModelConfig,
    config_from_dict_of,
    kind_of,
    make_config,
    make_model,
)
from attnkit.seq2seq.tasks import (
    BOS,
    EOS,
    PAD,
    Task,
    TaskDataset,
    collate,
    exact_match,
    heldout,
)
from attnkit.train import loop

__all__ = [
    "TrainConfig",
    "build_model",
    "evaluate",
    "evaluate_by_length",
    "has_attention",
    "load_checkpoint",
    "predict",
    "train",
]


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and evaluation settings (defaults reach 99% on reverse in minutes)."""

    steps: int = 1500  # optimizer steps (the cosine schedule ends here)
    batch_size: int = 64  # examples per step (global: each of W processes takes 1/W)
    lr: float = 1e-3  # peak AdamW learning rate
    warmup: int = 200  # linear warm-up steps
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    clip: float = 1.0  # gradient-norm clipping
    eval_every: int = 250  # steps between held-out evaluations
    eval_size: int = 500  # held-out examples
    stop_at: float = 1.0  # stop early once held-out exact match reaches this
    seed: int = 0  # model init, data stream and dropout
    max_time: float | None = None  # seconds of training, then stop after the step (and save)

    def __post_init__(self) -> None:
        for f in ("steps", "batch_size", "eval_every", "eval_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.max_time is not None and not 0 < self.max_time < math.inf:
            raise ValueError(f"max_time must be a finite number > 0, got {self.max_time}")
        if self.lr <= 0 or self.warmup < 0:
            raise ValueError(f"need lr > 0 and warmup >= 0, got lr={self.lr}, warmup={self.warmup}")


def build_model(
    task: Task, name: str = "tiny", *, kind: str = "transformer", **overrides
) -> nn.Module:
    """A model of `kind` sized for `task` (see `attnkit.seq2seq.kinds.make_config`); for a
    Transformer, preset `name` with shared embeddings and a tied generator."""
    return make_model(make_config(task, kind, name, **overrides))


def predict(model: nn.Module, task: Task, src: torch.Tensor, batch: int = 250) -> torch.Tensor:
    """Greedy outputs (B, T) for sources (B, S), decoded `batch` rows at a time."""
    was_training = model.training
    model.eval()
    src = src.to(next(model.parameters()).device)
    outs = [
        greedy(model, src[i : i + batch], bos=BOS, eos=EOS, pad=PAD, max_len=task.longest_target)
        for i in range(0, src.shape[0], batch)
    ]
    model.train(was_training)
    width = max(o.shape[1] for o in outs)
    outs = [F.pad(o, (0, width - o.shape[1]), value=PAD) for o in outs]
    return torch.cat(outs).cpu()


def evaluate(model: nn.Module, task: Task, src: torch.Tensor, tgt: torch.Tensor) -> dict:
    """Held-out exact sequence match of greedy decoding: {"exact_match": float in [0, 1]}."""
    return {"exact_match": exact_match(predict(model, task, src), tgt).float().mean().item()}


def evaluate_by_length(
    model: nn.Module, task: Task, per_length: int, seed: int = 1234
) -> dict[int, float]:
    """Held-out exact match per source length n = task.min_len .. task.max_len, from
    `per_length` examples of each length (copy, reverse and sort)."""
    if task.name == "add":
        raise ValueError("evaluate_by_length: for copy, reverse and sort (add has no length)")
    result = {}
    for n in range(task.min_len, task.max_len + 1):
        sub = dataclasses.replace(task, min_len=n, max_len=n)
        src, tgt = heldout(sub, per_length, seed=seed + n)
        result[n] = evaluate(model, sub, src, tgt)["exact_match"]
    return result


def _step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> loop.StepResult:
    """Teacher-forced token cross-entropy of src (B, S), tgt (B, T) = BOS y1 ... EOS PAD...

    `model` may be DDP-wrapped, so the loss is computed here from `model(...)`
    (a call to the wrapped module's own `loss` would skip the gradient sync).
    """
    src, tgt = batch
    out = model(src, tgt[:, :-1])  # logits (B, T-1, V), or UniversalOutput
    logits = out if isinstance(out, torch.Tensor) else out.logits
    labels = tgt[:, 1:]  # (B, T-1)
    real = labels != PAD
    cfg = getattr(model, "module", model).cfg
    loss = F.cross_entropy(
        logits.flatten(0, 1),
        labels.flatten(),
        ignore_index=PAD,
        label_smoothing=cfg.label_smoothing,
    )  # mean over the real tokens, as Transformer.loss
    if not isinstance(out, torch.Tensor) and getattr(cfg, "act", False):
        loss = loss + cfg.ponder_weight * out.ponder_cost  # ACT (Graves 2016, eq. 12)
    correct = ((logits.argmax(-1) == labels) & real).sum().item()
    return loop.StepResult(loss, int(real.sum()), int(correct))


def fit_config(cfg: TrainConfig) -> loop.TrainConfig:
    """The `attnkit.train.fit` settings of `cfg`: one epoch per evaluation, `steps` as budget."""
    return loop.TrainConfig(
        epochs=math.ceil(cfg.steps / cfg.eval_every),
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        warmup=cfg.warmup / cfg.steps,  # fit takes the warm-up as a fraction of the budget
        grad_clip=cfg.clip,
        seed=cfg.seed,
        max_steps=cfg.steps,
        max_time=cfg.max_time,
    )


def train(
    task: Task,
    model_cfg: ModelConfig | None = None,
    cfg: TrainConfig | None = None,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    alignments: int = 3,
    device: torch.device | str = "cpu",
) -> tuple[nn.Module, dict]:
    """Train on `task` and return the model and its final metrics.

    With `out`, writes the files listed in the module docstring after every
    evaluation; with `resume`, continues from ``out/checkpoint.pt`` (the model,
    task and held-out set must match the checkpoint's; training settings may
    change). Under torchrun (inside `attnkit.train.distributed()`) the run is
    data-parallel; rank 0 evaluates, writes the files and gets the metrics,
    the other ranks get ``{}``.
    """
    cfg = cfg or TrainConfig()
    torch.manual_seed(cfg.seed)
    model = make_model(model_cfg) if model_cfg is not None else build_model(task)
    src_eval, tgt_eval = heldout(task, cfg.eval_size, seed=cfg.seed + 1)
    run_info = {
        "kind": kind_of(model),
        "model": model.cfg.to_dict(),
        "task": task.to_dict(),
        "heldout": {"size": cfg.eval_size, "seed": cfg.seed + 1},
    }
    result = loop.fit(
        model,
        _step,
        TaskDataset(task, cfg.eval_every * cfg.batch_size, seed=cfg.seed),
        config=fit_config(cfg),
        out_dir=out,
        evaluate=lambda m: evaluate(m, task, src_eval, tgt_eval),
        collate_fn=collate,
        resume=resume,
        run_info=run_info,
        device=device,
        progress=progress,
        optimizer=lambda params: torch.optim.AdamW(
            params, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay
        ),
        stop_when=lambda row: row["exact_match"] >= cfg.stop_at,
    )
    model.eval().cpu()
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return model, {}
    if out is not None and alignments > 0 and has_attention(model):
        src = src_eval[:alignments]
        write_alignments(
            model, task.vocab, src, predict(model, task, src), out, eos=EOS, bos=BOS, pad=PAD
        )
    history = result.history
    last = result.stopped or (history[-1] if history else {})  # a stop inside an interval
    metrics = {
        "exact_match": last.get("exact_match"),
        "step": last.get("step"),
        "steps": cfg.steps,
        "stopped": "max-time" if result.stopped else None,
        "seconds": round(result.seconds, 2),
        "eval_size": cfg.eval_size,
        "params": result.params,
        "history": history,
    }
    return model, metrics


def has_attention(model: nn.Module) -> bool:
    """Whether the decoder attends to the source (all but the RNN without attention)."""
    return getattr(model, "attention", True) is not None


def load_checkpoint(path: str | Path) -> tuple[nn.Module, Task]:
    """Model (eval mode) and task from a training directory or a checkpoint file."""
    path = Path(path)
    file = path / loop.CHECKPOINT if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"checkpoint: no file {file} (expected a training --out directory)")
    # ValueError for a file that is not ours; the earlier seq2seq-only loop wrote no marker
    ckpt = loop.read_checkpoint(file, legacy_keys=("model", "model_config", "task"))
    try:
        kind = "transformer"  # checkpoints written before the other kinds existed
        if "run_info" in ckpt:  # written by attnkit.train.fit
            info = ckpt["run_info"]
            model_dict, task_dict = info["model"], info["task"]
            kind = info.get("kind", kind)
        else:
            model_dict, task_dict = ckpt["model_config"], ckpt["task"]
        model = make_model(config_from_dict_of(kind, model_dict))
        model.load_state_dict(ckpt["model"])
        task = Task(**task_dict)
    except (KeyError, RuntimeError, OSError, EOFError, TypeError, AttributeError) as e:
        raise ValueError(f"checkpoint: {file} is not an attnkit seq2seq checkpoint ({e})") from e
    return model.eval(), task


def train_config_from(args: dict) -> TrainConfig:
    """`TrainConfig` from a mapping, ignoring keys that are not its fields."""
    names = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in args.items() if k in names and v is not None})
