"""The training loop of `attnkit lm train` (imported only when it runs: it needs torch).

The checkpoint holds what continuing needs (--resume): weights, optimizer and schedule, the
step, the epoch and how far into it, the window generator's and torch's random states, and the
settings the run was started with. It is written at the end of every epoch, at --max-steps and
when --max-time runs out; a resumed run then takes step for step the path of one that was never
stopped (`tests/cli/test_lm_cli.py`), as long as --epochs and --max-steps stay the same:
they set where the learning-rate schedule ends.
"""

from __future__ import annotations

import math
import sys
import time

import torch

from attnkit._io import atomic_save, atomic_write_json
from attnkit.cli._errors import UsageError
from attnkit.cli._paths import load_torch
from attnkit.cli._threads import torch_threads
from attnkit.models import GPT, GPTConfig
from attnkit.train.packing import Packed, pack, paragraphs

__all__ = ["RESUME_KEYS", "read_resume", "train"]

EVAL_WINDOWS = 64  # held-out windows scored each epoch (fixed: the same every epoch)
# The options a resumed run must share with the checkpoint (the model's own are its config).
RESUME_KEYS = ("steps_per_epoch", "batch_size", "lr", "seed", "pack", "max_chars")


def _windows(ids: torch.Tensor, starts: torch.Tensor, width: int) -> torch.Tensor:
    """ids[s : s + width] for every start s -> (len(starts), width)."""
    return ids[starts[:, None] + torch.arange(width)]


@torch.no_grad()
def held_out_loss(model: GPT, held: torch.Tensor, context: int) -> float:
    """Mean next-character loss over up to EVAL_WINDOWS non-overlapping held-out windows."""
    model.eval()
    starts = torch.arange(0, len(held) - context, context + 1)[:EVAL_WINDOWS]
    batch = _windows(held, starts, context + 1)  # (W, context + 1)
    losses = [float(model.loss(chunk)) for chunk in batch.split(16)]
    sizes = [len(chunk) for chunk in batch.split(16)]
    model.train()
    return sum(loss * n for loss, n in zip(losses, sizes, strict=True)) / sum(sizes)


@torch.no_grad()
def held_out_packed_loss(model: GPT, held: Packed) -> float:
    """Mean next-character loss over the predictions inside the paragraphs of up to
    EVAL_WINDOWS held-out packed rows (each row's labels counted, boundaries left out)."""
    model.eval()
    rows = held[:EVAL_WINDOWS]
    total, count = 0.0, 0
    for start in range(0, len(rows), 16):
        chunk = rows[start : start + 16]
        docs = chunk.document_ids
        n = int((docs[:, 1:] == docs[:, :-1]).sum())  # labels inside a paragraph
        total += float(model.loss(chunk.ids, document_ids=docs)) * n
        count += n
    model.train()
    return total / max(count, 1)


def packed_rows(text: str, index: dict[str, int], width: int) -> Packed:
    """The paragraphs of `text` as character ids, packed into rows of `width`."""
    return pack([[index[ch] for ch in doc] for doc in paragraphs(text)], width)


def read_resume(path, fmt: str, settings: dict, vocab: str) -> dict:
    """The state of the checkpoint at `path` that --resume continues; UsageError when it
    cannot: missing, written before --resume existed, or trained with other settings or on
    another text."""
    if not path.is_file():
        raise UsageError(f"--resume: no checkpoint at {path}; train without --resume first")
    state = load_torch(path, "--resume")
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise UsageError(f"--resume: {path} is not an `attnkit lm` checkpoint")
    if "optimizer" not in state:
        raise UsageError(
            f"--resume: {path} has no optimizer state (written before --resume existed): "
            "train it again without --resume"
        )
    saved = state["run"]
    differ = sorted(k for k in set(saved) | set(settings) if saved.get(k) != settings.get(k))
    if differ:
        shown = ", ".join(f"{k} {saved.get(k)!r} there, {settings.get(k)!r} now" for k in differ)
        raise UsageError(f"--resume: {path} was trained with other settings ({shown})")
    if state["vocab"] != vocab:
        raise UsageError(f"--resume: {path} was trained on another text (its characters differ)")
    return state


def train(args, text: str, source: str, split: int, fmt: str, files: tuple[str, str],
          kept: dict) -> dict:  # fmt: skip
    """Train a character-level GPT on text[:split], score text[split:] each epoch, save.
    `kept` is filled with the path, step and epoch of each checkpoint as it is written (and
    of the one --resume starts from), for the Ctrl-C message."""
    from tqdm.auto import tqdm

    with torch_threads(args.threads):  # and back afterwards: main() may run in-process
        return _train(args, text, source, split, fmt, files, kept, tqdm)


def settings_of(args, source: str, chars: int) -> dict:
    """What a resumed run must share with its checkpoint, besides the model's config."""
    return {"source": source, "chars": chars, **{k: getattr(args, k) for k in RESUME_KEYS}}


def _train(args, text, source, split, fmt, files, kept, tqdm) -> dict:
    started = time.perf_counter()
    vocab = "".join(sorted(set(text)))
    index = {ch: i for i, ch in enumerate(vocab)}
    data = torch.tensor([index[ch] for ch in text], dtype=torch.long)  # (chars,)
    train_ids, held = data[:split], data[split:]
    path, hist_path = (args.out / name for name in files)
    settings = settings_of(args, source, len(text))
    resumed = read_resume(path, fmt, settings, vocab) if args.resume else None
    torch.manual_seed(args.seed)
    cfg = GPTConfig(
        len(vocab), args.layers, args.heads, args.d_model, args.context,
        rotary=getattr(args, "rotary", False),
    )  # fmt: skip
    if resumed is not None and resumed["config"] != cfg.to_dict():
        differ = sorted(k for k, v in cfg.to_dict().items() if resumed["config"].get(k) != v)
        raise UsageError(f"--resume: {path} holds a model with other {', '.join(differ)}")
    model = GPT(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.1)
    total = args.epochs * args.steps_per_epoch
    if getattr(args, "max_steps", None) is not None:
        total = min(total, args.max_steps)  # the schedule ends there too
    warmup = max(1, min(100, total // 10))

    # linear warm-up, then cosine decay to a tenth of the peak (nanoGPT's schedule shape)
    def schedule(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * (0.55 + 0.45 * math.cos(math.pi * step / total))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    gen = torch.Generator().manual_seed(args.seed)
    width = args.context + 1
    packed = getattr(args, "pack", False)
    if packed:  # paragraphs back to back with document ids; `split` may cut one in two
        rows, held_rows = (packed_rows(t, index, width) for t in (text[:split], text[split:]))
    history: list[dict] = []
    spe = args.steps_per_epoch
    done, epoch, epoch_steps, losses, before = 0, 1, 0, [], 0.0
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        opt.load_state_dict(resumed["optimizer"])
        sched.load_state_dict(resumed["scheduler"])
        gen.set_state(resumed["generator"])
        torch.set_rng_state(resumed["rng"])
        done, history, before = resumed["step"], resumed["history"], resumed["seconds"]
        epoch, epoch_steps = resumed["epoch"], resumed["epoch_steps"]
        kept.update(path=path, step=done, epoch=epoch, epoch_steps=epoch_steps, per=spe)
        if epoch_steps >= args.steps_per_epoch:
            epoch, epoch_steps = epoch + 1, 0
        else:  # an epoch ended early (--max-steps, --max-time): it goes on, its row comes again
            losses = list(resumed["epoch_losses"])
            history = [h for h in history if h["epoch"] != epoch]
        if done >= total:
            raise UsageError(
                f"--resume: {path} has done {done} steps, all of the {total} asked for: "
                "ask for more --epochs (or --max-steps) to train on"
            )
    max_time = getattr(args, "max_time", None)

    now = time.perf_counter

    def elapsed() -> float:  # this run's seconds and those of the runs it continues
        return before + now() - started

    def save(held_out: float | None = None) -> None:
        state = {"format": fmt, "config": cfg.to_dict(), "vocab": vocab,
                 "model": model.state_dict(), "history": history, "source": source,
                 "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "generator": gen.get_state(), "rng": torch.get_rng_state(), "run": settings,
                 "step": done, "epoch": epoch, "epoch_steps": epoch_steps,
                 "epoch_losses": list(losses), "seconds": elapsed()}  # fmt: skip
        summary = {"source": source, "chars": len(text), "vocab_size": len(vocab),
                   "pack": packed, "step": done}  # fmt: skip
        if held_out is not None:  # stopped inside an epoch: no row, its loss at the stop
            summary["stopped"] = {"step": done, "epoch": epoch, "held_out_loss": held_out}
        atomic_write_json(hist_path, {**summary, "history": history})
        atomic_save(path, state)  # last: what Ctrl-C names is the checkpoint
        kept.update(path=path, step=done, epoch=epoch, epoch_steps=epoch_steps, per=spe)

    last = [float("nan")]  # the latest held-out loss, for the summary

    def score() -> float:
        if packed:
            last[0] = held_out_packed_loss(model, held_rows)
        else:
            last[0] = held_out_loss(model, held, args.context)
        return last[0]

    bar = tqdm(total=total, initial=done, desc="lm train", unit="step", disable=args.quiet,
               file=sys.stderr)  # fmt: skip
    stopped = None
    with bar:
        while done < total and stopped is None:
            while epoch_steps < args.steps_per_epoch and done < total:
                if packed:
                    pick = torch.randint(0, len(rows), (args.batch_size,), generator=gen)
                    loss = model.loss(rows.ids[pick], document_ids=rows.document_ids[pick])
                else:
                    starts = torch.randint(
                        0, len(train_ids) - width + 1, (args.batch_size,), generator=gen
                    )
                    loss = model.loss(_windows(train_ids, starts, width))  # (B, context + 1)
                if not torch.isfinite(loss):
                    raise RuntimeError(
                        f"the loss is {float(loss)} at epoch {epoch}: lower --lr (now {args.lr})"
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                losses.append(loss.item())
                bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
                bar.update()
                done += 1
                epoch_steps += 1
                if max_time is not None and now() - started >= max_time and done < total:
                    stopped = "max-time"
                    break
            if stopped is not None and epoch_steps < args.steps_per_epoch:
                save(score())  # reported, not a row of the history: the epoch goes on
                break
            record = {
                "epoch": epoch,
                "steps": done,
                "train_loss": sum(losses) / len(losses),
                "held_out_loss": score(),
                "seconds": elapsed(),
            }
            history.append(record)
            if not args.quiet:
                bar.write(
                    f"[lm] epoch {epoch}/{args.epochs}: train loss {record['train_loss']:.3f}, "
                    f"held-out loss {record['held_out_loss']:.3f}",
                    file=sys.stderr,
                )
            save()
            if done < total and stopped is None:
                epoch, epoch_steps, losses = epoch + 1, 0, []
    return {
        "command": "lm train",
        "files": [str(path), str(hist_path)],
        "source": source,
        "chars": len(text),
        "vocab_size": len(vocab),
        "params": sum(p.numel() for p in model.parameters()),
        "pack": packed,
        "epochs": len(history),
        "steps": done,
        "total_steps": total,
        "stopped": stopped,
        "held_out_loss": last[0],
        "seconds": elapsed(),
    }
