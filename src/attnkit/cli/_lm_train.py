"""The training loop of `attnkit lm train` (imported only when it runs: it needs torch)."""

from __future__ import annotations

import math
import sys
import time

import torch

from attnkit._io import atomic_save, atomic_write_json
from attnkit.models import GPT, GPTConfig
from attnkit.train.packing import Packed, pack, paragraphs

__all__ = ["train"]

EVAL_WINDOWS = 64  # held-out windows scored each epoch (fixed: the same every epoch)


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


def train(args, text: str, source: str, split: int, fmt: str, files: tuple[str, str]) -> dict:
    """Train a character-level GPT on text[:split], score text[split:] each epoch, save."""
    from tqdm.auto import tqdm

    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return _train(args, text, source, split, fmt, files, tqdm)
    finally:
        torch.set_num_threads(threads)  # main() may run in-process (tests)


def _train(args, text, source, split, fmt, files, tqdm) -> dict:
    started = time.perf_counter()
    vocab = "".join(sorted(set(text)))
    index = {ch: i for i, ch in enumerate(vocab)}
    data = torch.tensor([index[ch] for ch in text], dtype=torch.long)  # (chars,)
    train_ids, held = data[:split], data[split:]
    torch.manual_seed(args.seed)
    cfg = GPTConfig(
        len(vocab), args.layers, args.heads, args.d_model, args.context,
        rotary=getattr(args, "rotary", False),
    )  # fmt: skip
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
    bar = tqdm(total=total, desc="lm train", unit="step", disable=args.quiet, file=sys.stderr)
    history: list[dict] = []
    path, hist_path = (args.out / name for name in files)
    done = 0
    with bar:
        for epoch in range(1, args.epochs + 1):
            losses = []
            for _ in range(min(args.steps_per_epoch, total - done)):
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
            held_out = (
                held_out_packed_loss(model, held_rows)
                if packed
                else held_out_loss(model, held, args.context)
            )
            record = {
                "epoch": epoch,
                "steps": done,
                "train_loss": sum(losses) / len(losses),
                "held_out_loss": held_out,
                "seconds": time.perf_counter() - started,
            }
            history.append(record)
            if not args.quiet:
                bar.write(
                    f"[lm] epoch {epoch}/{args.epochs}: train loss {record['train_loss']:.3f}, "
                    f"held-out loss {record['held_out_loss']:.3f}",
                    file=sys.stderr,
                )
            state = {"format": fmt, "config": cfg.to_dict(), "vocab": vocab,
                     "model": model.state_dict(), "history": history, "source": source}  # fmt: skip
            atomic_save(path, state)
            summary = {"source": source, "chars": len(text), "vocab_size": len(vocab),
                       "pack": packed}  # fmt: skip
            atomic_write_json(hist_path, {**summary, "history": history})
            if done == total:
                break
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
        "held_out_loss": history[-1]["held_out_loss"],
        "seconds": time.perf_counter() - started,
    }
