"""The training loop of `attnkit lm train` (imported only when it runs: it needs torch).

The checkpoint holds what continuing needs (--resume): weights, optimizer and schedule (its
length included), the tokenizer, the step, the epoch and how far into it, the window
generator's and torch's random states, and the settings the run was started with. It is written
at the end of every epoch, at the schedule's end and when --max-time runs out; a resumed run
then takes step for step the path of one that was never stopped (`tests/cli/test_lm_cli.py`),
as long as --epochs and --max-steps stay the same: they set where the learning-rate schedule
ends.

The schedule's length is --max-steps when given (nanoGPT's max_iters), else --epochs ×
--steps-per-epoch. With --max-time, a new run measures its step time over `PROBE_STEPS` steps
(after one warm-up step) and the cost of a held-out evaluation, then shortens the schedule to
the steps that fit in the time (`fit_steps`), so a timed run ends with its learning rate
decayed instead of cut off early in its cosine; the time limit still stops a run whose steps
turn out slower.
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
from attnkit.train.corpus import Corpus, cut_documents
from attnkit.train.packing import Packed, pack
from attnkit.train.text_tokenizer import from_state, train_tokenizer

__all__ = ["RESUME_KEYS", "fit_steps", "read_resume", "train"]

EVAL_WINDOWS = 64  # held-out windows scored each epoch (fixed: the same every epoch)
PROBE_STEPS = 5  # steps timed (after a warm-up step) to fit the schedule to --max-time
TIME_MARGIN = 0.97  # of the time left, what the fitted schedule plans to use
# The options a resumed run must share with the checkpoint (the model's own are its config).
RESUME_KEYS = ("steps_per_epoch", "batch_size", "lr", "seed", "pack", "max_chars", "tokenizer",
               "vocab_size", "doc_sep", "text_field")  # fmt: skip


def _clock() -> float:
    """The training clock (tests replace it with a fake one)."""
    return time.perf_counter()


def fit_steps(done: int, total: int, left_s: float, step_s: float, eval_s: float, spe: int) -> int:
    """The schedule length that fits `left_s` seconds: `done` steps taken, each further step
    `step_s` seconds, a held-out evaluation of `eval_s` at the end of every `spe` steps (and
    one at the end); never past `total`, never before `done`."""
    per_step = step_s + eval_s / spe
    more = int((TIME_MARGIN * left_s - eval_s) // per_step) if per_step > 0 else total
    return max(done, min(total, done + max(more, 0)))


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


def packed_rows(documents: list[str], tokenizer, width: int) -> Packed:
    """`documents` as token ids, packed into rows of `width`."""
    return pack([tokenizer.encode(doc) for doc in documents], width)


def read_resume(path, fmt: str, settings: dict) -> dict:
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
    return state


def train(args, corpus: Corpus, split: int, fmt: str, files: tuple[str, str],
          kept: dict) -> dict:  # fmt: skip
    """Train a GPT on the corpus text before character `split`, score the rest each epoch,
    save. `kept` is filled with the path, step and epoch of each checkpoint as it is written
    (and of the one --resume starts from), for the Ctrl-C message."""
    from tqdm.auto import tqdm

    with torch_threads(args.threads):  # and back afterwards: main() may run in-process
        return _train(args, corpus, split, fmt, files, kept, tqdm)


def settings_of(args, corpus: Corpus) -> dict:
    """What a resumed run must share with its checkpoint, besides the model's config."""
    import hashlib

    text = corpus.text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return {"source": corpus.source, "chars": len(text), "text_sha256": digest,
            **{k: getattr(args, k, None) for k in RESUME_KEYS}}  # fmt: skip


def _tokenized(args, corpus: Corpus, split: int, tokenizer, width: int, packed: bool):
    """(training rows or ids, held-out rows or ids, training tokens): packed documents or
    the text's ids; UsageError when either part is too short for one row of `width`."""
    text = corpus.text
    if packed:  # documents back to back with document ids; `split` may cut one in two
        parts = [
            packed_rows(docs, tokenizer, width) for docs in cut_documents(corpus.documents, split)
        ]
        sizes = [len(rows) for rows in parts]
        tokens = parts[0].ids.numel()
    else:
        parts = [
            torch.tensor(tokenizer.encode(t), dtype=torch.long)
            for t in (text[:split], text[split:])
        ]
        sizes = [len(ids) - width + 1 for ids in parts]
        tokens = len(parts[0])
    if min(sizes) < 1:
        raise UsageError(
            f"--text has too few tokens for --context {args.context}: the held-out 10% "
            f"needs at least {width} {tokenizer.kind} tokens (give more text or a shorter context)"
        )
    return parts[0], parts[1], tokens


def _documents_line(corpus) -> str:
    st = corpus.stats()
    kind = {"files": "files", "records": "JSON Lines records", "separated": "--doc-sep pieces",
            "paragraphs": "paragraphs"}[corpus.kind]  # fmt: skip
    skipped = f"; {corpus.skipped} files skipped (not UTF-8 text)" if corpus.skipped else ""
    return (f"[lm] {st['documents']} documents ({kind}) from {corpus.source}: "
            f"{st['min']}-{st['max']} characters, median {st['median']:g}, mean {st['mean']:g}"
            f"{skipped}")  # fmt: skip


def _train(args, corpus, split, fmt, files, kept, tqdm) -> dict:
    started = _clock()
    text = corpus.text
    path, hist_path = (args.out / name for name in files)
    settings = settings_of(args, corpus)
    resumed = read_resume(path, fmt, settings) if args.resume else None
    kind = getattr(args, "tokenizer", None) or "char"
    if resumed is not None:
        tokenizer = from_state(resumed.get("tokenizer", resumed.get("vocab")))
    elif kind == "char":  # every character of the text, held-out part included
        tokenizer = train_tokenizer("char", [text])
    else:  # subwords learnt from the training part only
        tokenizer = train_tokenizer(
            kind, cut_documents(corpus.documents, split)[0], args.vocab_size
        )
    width = args.context + 1
    packed = getattr(args, "pack", False)
    # packed rows (Packed) with --pack, else the text's ids (1-D tensors)
    train, held, train_tokens = _tokenized(args, corpus, split, tokenizer, width, packed)
    if not args.quiet and not args.json:  # the checks have passed: say what will be trained on
        print(_documents_line(corpus), file=sys.stderr)
    torch.manual_seed(args.seed)
    cfg = GPTConfig(
        tokenizer.size, args.layers, args.heads, args.d_model, args.context,
        rotary=getattr(args, "rotary", False),
    )  # fmt: skip
    if resumed is not None and resumed["config"] != cfg.to_dict():
        differ = sorted(k for k, v in cfg.to_dict().items() if resumed["config"].get(k) != v)
        raise UsageError(f"--resume: {path} holds a model with other {', '.join(differ)}")
    model = GPT(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.1)
    asked = args.epochs * args.steps_per_epoch
    if getattr(args, "max_steps", None) is not None:
        asked = args.max_steps  # the schedule's length (nanoGPT's max_iters)
    plan = {"total": asked}  # the schedule's length: `asked`, or fitted to --max-time
    if resumed is not None and resumed.get("schedule", {}).get("asked") == asked:
        plan["total"] = resumed["schedule"]["total"]

    # linear warm-up, then cosine decay to a tenth of the peak (nanoGPT's schedule shape)
    def schedule(step: int) -> float:
        total = plan["total"]
        warmup = max(1, min(100, total // 10))
        decay = 0.55 + 0.45 * math.cos(math.pi * min(step, total) / total)
        return min(1.0, (step + 1) / warmup) * decay

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    gen = torch.Generator().manual_seed(args.seed)
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
        if done >= plan["total"]:
            raise UsageError(
                f"--resume: {path} has done {done} steps, all of the {plan['total']} of its "
                "schedule: ask for more --epochs (or --max-steps) to train on"
            )
    max_time = getattr(args, "max_time", None)
    # a new timed run fits its schedule once it has timed PROBE_STEPS steps after a warm-up one
    fit_at = done + 1 + PROBE_STEPS if max_time is not None and resumed is None else None
    probe_start = [0.0]

    now = _clock

    def elapsed() -> float:  # this run's seconds and those of the runs it continues
        return before + now() - started

    def save(held_out: float | None = None) -> None:
        state = {"format": fmt, "config": cfg.to_dict(), "tokenizer": tokenizer.state(),
                 "schedule": {"asked": asked, "total": plan["total"]},
                 "model": model.state_dict(), "history": history, "source": corpus.source,
                 "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                 "generator": gen.get_state(), "rng": torch.get_rng_state(), "run": settings,
                 "step": done, "epoch": epoch, "epoch_steps": epoch_steps,
                 "epoch_losses": list(losses), "seconds": elapsed()}  # fmt: skip
        summary = {"source": corpus.source, "chars": len(text), "vocab_size": tokenizer.size,
                   "tokenizer": tokenizer.kind, "documents": corpus.stats(), "pack": packed,
                   "step": done}  # fmt: skip
        if held_out is not None:  # stopped inside an epoch: no row, its loss at the stop
            summary["stopped"] = {"step": done, "epoch": epoch, "held_out_loss": held_out}
        atomic_write_json(hist_path, {**summary, "history": history})
        atomic_save(path, state)  # last: what Ctrl-C names is the checkpoint
        kept.update(path=path, step=done, epoch=epoch, epoch_steps=epoch_steps, per=spe)

    last = [float("nan")]  # the latest held-out loss, for the summary

    def score() -> float:
        if packed:
            last[0] = held_out_packed_loss(model, held)
        else:
            last[0] = held_out_loss(model, held, args.context)
        return last[0]

    def fit() -> None:  # shorten the schedule to what --max-time leaves room for
        step_s = (now() - probe_start[0]) / PROBE_STEPS
        t0 = now()
        score()  # what one held-out evaluation costs
        eval_s = now() - t0
        left = max_time - (now() - started)
        plan["total"] = fit_steps(done, plan["total"], left, step_s, eval_s, spe)
        bar.total = plan["total"]
        bar.refresh()
        if not args.quiet:
            bar.write(
                f"[lm] --max-time {max_time:g}s: {step_s:.3g} s per step, {eval_s:.2g} s per "
                f"evaluation: the schedule fitted to {plan['total']} of {asked} steps",
                file=sys.stderr,
            )

    bar = tqdm(total=plan["total"], initial=done, desc="lm train", unit="step",
               disable=args.quiet, file=sys.stderr)  # fmt: skip
    stopped = None
    this_run = done  # steps this run takes, for its tokens per second
    with bar:
        while done < plan["total"] and stopped is None:
            while epoch_steps < args.steps_per_epoch and done < plan["total"]:
                if packed:
                    pick = torch.randint(0, len(train), (args.batch_size,), generator=gen)
                    loss = model.loss(train.ids[pick], document_ids=train.document_ids[pick])
                else:
                    starts = torch.randint(
                        0, len(train) - width + 1, (args.batch_size,), generator=gen
                    )
                    loss = model.loss(_windows(train, starts, width))  # (B, context + 1)
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
                if fit_at is not None and done == fit_at - PROBE_STEPS:
                    probe_start[0] = now()  # after the warm-up step
                elif fit_at is not None and done == fit_at and done < plan["total"]:
                    fit()
                if max_time is not None and now() - started >= max_time and done < plan["total"]:
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
            if done < plan["total"] and stopped is None:
                epoch, epoch_steps, losses = epoch + 1, 0, []
    seconds = now() - started
    return {
        "command": "lm train",
        "files": [str(path), str(hist_path)],
        "source": corpus.source,
        "chars": len(text),
        "documents": corpus.stats(),
        "tokenizer": tokenizer.kind,
        "vocab_size": tokenizer.size,
        "train_tokens": train_tokens,
        "params": sum(p.numel() for p in model.parameters()),
        "pack": packed,
        "epochs": len(history),
        "steps": done,
        "total_steps": plan["total"],
        "asked_steps": asked,
        "stopped": stopped,
        "held_out_loss": last[0],
        "tokens_per_second": (done - this_run)
        * args.batch_size
        * args.context
        / max(seconds, 1e-9),
        "seconds": elapsed(),
    }
