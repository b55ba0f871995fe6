"""Training a Transformer on a synthetic task, with checkpoints, metrics and resume.

The shared training loop (`attnkit.train.loop.fit`: progress bar, atomic
checkpoints, resume, DDP) was not on main when this was written (it is on the
`vision` branch). `_Loop` below is the minimal stand-in: it only knows "a
step", "an evaluation" and "a state to save", so swapping it touches `train()`
alone: `fit(model, step, TaskDataset(task, eval_every * batch_size),
collate_fn=collate, evaluate=lambda m: evaluate(m, task, src, tgt), ...)`
with one epoch per evaluation and `max_steps` for the budget (`fit` has no
early stop at a target exact match).

Files in `out`: ``checkpoint.pt`` (model, optimizer, schedule, data RNG,
step), ``config.json`` (model, task, training), ``metrics.json`` (held-out
exact match, history, seconds), ``alignment_<i>.png`` (cross-attention of a
few held-out examples). All are written atomically.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from tqdm import tqdm

from attnkit._io import atomic_save, atomic_write_json
from attnkit.models.decoding import greedy
from attnkit.models.transformer import Transformer, TransformerConfig, config_from_dict, preset
from attnkit.seq2seq.alignment import write_alignments
from attnkit.seq2seq.tasks import BOS, EOS, PAD, Task, exact_match, heldout, make_batch

__all__ = ["TrainConfig", "build_model", "evaluate", "load_checkpoint", "predict", "train"]

CHECKPOINT, CONFIG, METRICS = "checkpoint.pt", "config.json", "metrics.json"


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation and evaluation settings (defaults reach 99% on reverse in minutes)."""

    steps: int = 1500  # optimizer steps (the cosine schedule ends here)
    batch_size: int = 64  # examples per step
    lr: float = 1e-3  # peak AdamW learning rate
    warmup: int = 200  # linear warm-up steps
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    clip: float = 1.0  # gradient-norm clipping
    eval_every: int = 250  # steps between held-out evaluations
    eval_size: int = 500  # held-out examples
    stop_at: float = 1.0  # stop early once held-out exact match reaches this
    seed: int = 0  # model init, data stream and dropout

    def __post_init__(self) -> None:
        for f in ("steps", "batch_size", "eval_every", "eval_size"):
            if getattr(self, f) < 1:
                raise ValueError(f"{f} must be >= 1, got {getattr(self, f)}")
        if self.lr <= 0 or self.warmup < 0:
            raise ValueError(f"need lr > 0 and warmup >= 0, got lr={self.lr}, warmup={self.warmup}")


def build_model(task: Task, name: str = "tiny", **overrides) -> Transformer:
    """A `Transformer` sized for `task` from preset `name` (shared embeddings, tied generator)."""
    size = len(task.vocab)
    longest = max(task.longest_source, task.longest_target)
    overrides = {"share_embeddings": True, "max_len": max(256, longest), **overrides}
    return Transformer(preset(name, src_vocab=size, tgt_vocab=size, pad_id=PAD, **overrides))


def predict(model: Transformer, task: Task, src: torch.Tensor, batch: int = 250) -> torch.Tensor:
    """Greedy outputs (B, T) for sources (B, S), decoded `batch` rows at a time."""
    was_training = model.training
    model.eval()
    outs = [
        greedy(model, src[i : i + batch], bos=BOS, eos=EOS, pad=PAD, max_len=task.longest_target)
        for i in range(0, src.shape[0], batch)
    ]
    model.train(was_training)
    width = max(o.shape[1] for o in outs)
    return torch.cat([torch.nn.functional.pad(o, (0, width - o.shape[1]), value=PAD) for o in outs])


def evaluate(model: Transformer, task: Task, src: torch.Tensor, tgt: torch.Tensor) -> dict:
    """Held-out exact sequence match of greedy decoding: {"exact_match": float in [0, 1]}."""
    return {"exact_match": exact_match(predict(model, task, src), tgt).float().mean().item()}


def _schedule(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to 0 at `cfg.steps`."""

    def factor(step: int) -> float:
        warm = (step + 1) / cfg.warmup if cfg.warmup else 1.0
        progress = min(step, cfg.steps) / cfg.steps
        return min(warm, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return factor


class _Loop:
    """Step, evaluate every `eval_every` steps, save, stop early: the loop to swap out."""

    def __init__(self, total: int, eval_every: int, stop_at: float, progress: bool) -> None:
        self.total, self.eval_every, self.stop_at, self.progress = (
            total,
            eval_every,
            stop_at,
            progress,
        )

    def run(self, start: int, step_fn, eval_fn, save_fn) -> None:
        bar = tqdm(total=self.total, initial=start, disable=not self.progress, desc="train")
        try:
            for step in range(start + 1, self.total + 1):
                loss = step_fn(step)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
                if step % self.eval_every == 0 or step == self.total:
                    metrics = eval_fn(step)
                    bar.set_postfix(loss=f"{loss:.4f}", exact=f"{metrics['exact_match']:.3f}")
                    save_fn(step)
                    if metrics["exact_match"] >= self.stop_at:
                        break
        finally:
            bar.close()


def train(
    task: Task,
    model_cfg: TransformerConfig | None = None,
    cfg: TrainConfig | None = None,
    *,
    out: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    alignments: int = 3,
) -> tuple[Transformer, dict]:
    """Train on `task` and return the model and its final metrics.

    With `out`, writes the files listed in the module docstring after every
    evaluation; with `resume`, continues from ``out/checkpoint.pt`` (the model
    and task must match the checkpoint's; training settings may change).
    """
    cfg = cfg or TrainConfig()
    torch.manual_seed(cfg.seed)
    model = Transformer(model_cfg) if model_cfg is not None else build_model(task)
    model_cfg = model.cfg
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(cfg))
    rng = random.Random(cfg.seed)
    state = {"step": 0, "seconds": 0.0, "history": []}
    out = Path(out) if out is not None else None
    if not resume and out is not None and (out / CHECKPOINT).exists():
        raise ValueError(
            f"out {out} already holds {CHECKPOINT}; pass --resume (resume=True) to continue "
            "or choose another directory"
        )
    if resume:
        if out is None or not (out / CHECKPOINT).exists():
            raise ValueError(f"resume: no checkpoint at {out and out / CHECKPOINT}; train first")
        ckpt = torch.load(out / CHECKPOINT, map_location="cpu", weights_only=False)
        _check_same(ckpt, model_cfg, task)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        rng.setstate(ckpt["data_rng"])
        torch.set_rng_state(ckpt["torch_rng"])
        state = ckpt["state"]
    src_eval, tgt_eval = heldout(task, cfg.eval_size, seed=cfg.seed + 1)
    started = time.perf_counter() - state["seconds"]
    model.train()

    def step_fn(step: int) -> float:
        src, tgt = make_batch(task, rng, cfg.batch_size)
        loss = model.loss(src, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        sched.step()
        state["step"] = step
        return loss.item()

    def eval_fn(step: int) -> dict:
        metrics = evaluate(model, task, src_eval, tgt_eval)
        state["seconds"] = time.perf_counter() - started
        state["history"].append({"step": step, "seconds": round(state["seconds"], 2), **metrics})
        return metrics

    def save_fn(step: int) -> None:
        if out is None:
            return
        ckpt = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "data_rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(),
            "state": state,
            "model_config": model_cfg.to_dict(),
            "task": task.to_dict(),
        }
        atomic_save(out / CHECKPOINT, ckpt)
        config = {"model": model_cfg.to_dict(), "task": task.to_dict(), "train": asdict(cfg)}
        atomic_write_json(out / CONFIG, config)
        atomic_write_json(out / METRICS, _metrics(state, cfg))

    if state["step"] < cfg.steps:
        _Loop(cfg.steps, cfg.eval_every, cfg.stop_at, progress).run(
            state["step"], step_fn, eval_fn, save_fn
        )
    if not state["history"] or state["history"][-1]["step"] != state["step"]:
        eval_fn(state["step"])
        save_fn(state["step"])
    model.eval()
    if out is not None and alignments > 0:
        src = src_eval[:alignments]
        write_alignments(
            model, task.vocab, src, predict(model, task, src), out, eos=EOS, bos=BOS, pad=PAD
        )
    return model, _metrics(state, cfg)


def _metrics(state: dict, cfg: TrainConfig) -> dict:
    last = state["history"][-1] if state["history"] else {}
    return {
        "exact_match": last.get("exact_match"),
        "step": state["step"],
        "seconds": round(state["seconds"], 2),
        "eval_size": cfg.eval_size,
        "history": state["history"],
    }


def _check_same(ckpt: dict, model_cfg: TransformerConfig, task: Task) -> None:
    for name, saved, now in (
        ("task", ckpt["task"], task.to_dict()),
        ("model config", ckpt["model_config"], model_cfg.to_dict()),
    ):
        diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        if diff:
            got = {k: now.get(k) for k in diff}
            want = {k: saved.get(k) for k in diff}
            raise ValueError(
                f"resume: {name} differs from the checkpoint's: got {got}, wanted {want}"
            )


def load_checkpoint(path: str | Path) -> tuple[Transformer, Task]:
    """Model (eval mode) and task from a training directory or a checkpoint file."""
    path = Path(path)
    file = path / CHECKPOINT if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"checkpoint: no file {file} (expected a training --out directory)")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=False)
        model = Transformer(config_from_dict(ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
        task = Task(**ckpt["task"])
    except (KeyError, RuntimeError, OSError, EOFError, TypeError) as e:
        raise ValueError(f"checkpoint: {file} is not an attnkit seq2seq checkpoint ({e})") from e
    return model.eval(), task


def train_config_from(args: dict) -> TrainConfig:
    """`TrainConfig` from a mapping, ignoring keys that are not its fields."""
    names = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in args.items() if k in names and v is not None})
