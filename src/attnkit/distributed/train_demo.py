"""Train a small GPT on sequences longer than one process's memory budget: context parallelism.

    torchrun --nproc-per-node 4 -m attnkit.distributed.train_demo --out runs/cp \\
        --seq-len 16384 --budget-mib 512 --steps 200

Every rank holds N/P positions of every sequence (``--layout`` zigzag by default) and runs the
whole model on them; only attention needs the other positions, and `RingMultiHeadAttention`
(``--strategy ring``, or ``ulysses``) brings them. Legend: B batch, N sequence length, P ranks,
n = N/P, C width, V vocabulary, L layers.

* The loss of a step is the mean next-token cross-entropy over all B·N labels: each rank sums
  its own labels' losses and divides by B·N; summing the ranks' losses (and their parameter
  gradients, with one all-reduce) gives exactly what one process computes on the full
  sequence. Every rank then takes the same optimizer step, so the replicas stay equal.
* Data: a synthetic copy task. Each sequence is a pattern of ``--period`` tokens (default
  N/2), a walk of a fixed random Markov chain, repeated: the first period is predictable only
  as far as the chain is, the rest exactly, by attending ``--period`` positions back, across
  ranks. Batches come from (seed, step), so a resumed run and a single-process run see the
  same ones.
* ``--budget-mib``: the activation memory one process may use. The demo estimates what a
  training step keeps for backward (`activation_mib`, an approximation: the tensors autograd
  saves per token) for N/P tokens and stops with exit code 2 if that exceeds the budget; it
  prints how much N tokens would need in one process, and the summary reports the measured
  peak resident memory of each rank.
* Checkpoints: rank 0 writes ``checkpoint.pt`` (a plain `GPT` state dict: it loads into
  `attnkit.models.GPT` without any of this), ``config.json`` and ``metrics.json`` every
  ``--checkpoint-every`` steps and at the end, each atomically (`attnkit._io`); ``--resume``
  continues from the checkpoint.

Attention dropout is 0 (ring attention refuses it); ``--dropout`` acts on the residual
branches and embeddings only, where it is local to each position. Each rank draws its own
masks, so with ``--dropout`` > 0 the run is not step-for-step the single-process one.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from attnkit._io import atomic_save, atomic_write_json
from attnkit.distributed import RingMultiHeadAttention, positions, shard
from attnkit.distributed.ring import group_info
from attnkit.models.gpt import GPT, GPTConfig
from attnkit.train.loop import FORMAT, read_checkpoint

__all__ = ["activation_mib", "batch", "build", "context_parallel", "cp_loss", "main"]


def build(args: argparse.Namespace) -> GPT:
    """The model, initialised from ``args.seed`` (the same on every rank and in one process)."""
    torch.manual_seed(args.seed)
    cfg = GPTConfig(
        vocab_size=args.vocab, n_layer=args.layers, n_head=args.heads, d_model=args.width,
        context=args.seq_len, dropout=args.dropout,
    )  # fmt: skip
    return GPT(cfg)


def batch(seed: int, step: int, b: int, n: int, vocab: int, period: int) -> Tensor:
    """ids (B, N + 1) of step ``step``: a pattern of ``period`` tokens, repeated.

    The pattern is a walk of a Markov chain whose transitions depend on ``seed`` only (a few
    likely successors per token): a model learns those in a few steps (the loss falls at
    once), then learns to copy the previous period, which needs attention across ranks.
    """
    g = torch.Generator().manual_seed(seed)
    trans = (3 * torch.randn(vocab, vocab, generator=g, dtype=torch.float64)).softmax(-1)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 1)
    pattern = torch.empty(b, period, dtype=torch.long)  # (B, period)
    pattern[:, 0] = torch.randint(vocab, (b,), generator=g)
    for i in range(1, period):
        pattern[:, i] = torch.multinomial(trans[pattern[:, i - 1]], 1, generator=g).squeeze(1)
    reps = -(-(n + 1) // period)
    return pattern.repeat(1, reps)[:, : n + 1]  # (B, N + 1)


def context_parallel(model: GPT, *, group=None, layout: str = "zigzag", strategy: str = "ring"):
    """Swap every block's attention for a `RingMultiHeadAttention` built as `GPTBlock` builds
    it, with the same weights, in place (the state dict keys do not change). Attention
    dropout is left at 0: ring attention refuses it in training."""
    cfg = model.cfg
    for block in model.blocks:
        ring = RingMultiHeadAttention(
            cfg.d_model, cfg.n_head, qkv_bias=cfg.bias, out_bias=cfg.bias, group=group,
            layout=layout, strategy=strategy,
        ).to(block.attn.fn.proj.weight.device)  # fmt: skip
        ring.load_state_dict(block.attn.fn.state_dict())
        block.attn.fn = ring
    return model


def cp_loss(model: GPT, ids: Tensor, rank: int, world: int, layout: str) -> Tensor:
    """This rank's share of the mean next-token loss of ids (B, N + 1): sum over its labels /
    (B·N). The ranks' shares add up to `GPT.loss` on the full sequence."""
    x_ids, labels = ids[:, :-1], ids[:, 1:]  # (B, N) each
    n_total = labels.numel()
    x_ids, labels = (shard(t, rank, world, dim=1, layout=layout) for t in (x_ids, labels))
    pos = positions(ids.shape[1] - 1, rank, world, layout).to(ids.device)  # (n,)
    x = model.tokens(x_ids) + F.embedding(pos, model.positions.weight)  # (B, n, C)
    x = model.drop(x)
    for block in model.blocks:  # GPTBlock.forward without the KV cache argument
        x = block.ff(block.attn(x, causal=True))
    logits = model.head(model.norm(x))  # (B, n, V)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum") / n_total


def activation_mib(args: argparse.Namespace, tokens: int) -> float:
    """Approximate float32 activations a training step keeps for ``tokens`` positions: per
    layer and token LN in/out, q/k/v, attention out, projection, 2 LN and residuals (~10 C),
    the feed-forward's input, hidden before/after the activation (2·4C); logits and their
    softmax (2 V). Attention itself adds only its O(n) log-sum-exp."""
    c = args.width
    per_token = args.layers * (10 * c + 8 * c + args.heads) + 2 * args.vocab
    return args.batch * tokens * per_token * 4 / 2**20


def _all_reduce(t: Tensor) -> Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def _fail(message: str) -> None:
    print(f"train_demo: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m attnkit.distributed.train_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the example keeps its lines
    )
    p.add_argument("--out", type=Path, required=True, help="run directory (checkpoint, metrics)")
    p.add_argument("--seq-len", type=int, default=4096, help="N, tokens per sequence")
    p.add_argument("--budget-mib", type=float, default=256.0, help="activation MiB per process")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--period", type=int, default=None, help="copy-task period (default N/2)")
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.0, help="residual/embedding dropout")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layout", default="zigzag", choices=["contiguous", "zigzag"])
    p.add_argument("--strategy", default="ring", choices=["ring", "ulysses"])
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)
    for name in ("seq_len", "steps", "batch", "vocab", "layers", "heads", "width"):
        if getattr(args, name) < 1:
            _fail(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    args.period = args.period or max(1, args.seq_len // 2)
    return args


def _check(args: argparse.Namespace, world: int) -> None:
    pieces = world if args.layout == "contiguous" else 2 * world
    if args.seq_len % pieces:
        _fail(
            f"--seq-len {args.seq_len} must be divisible by {pieces} ({world} ranks, "
            f"layout {args.layout})"
        )
    if args.width % args.heads:
        _fail(f"--width {args.width} must be divisible by --heads {args.heads}")
    if args.strategy == "ulysses" and args.heads % world:
        _fail(f"--heads {args.heads} must be divisible by {world} ranks for --strategy ulysses")
    need = activation_mib(args, args.seq_len // world)
    if need > args.budget_mib:
        _fail(
            f"--budget-mib {args.budget_mib:g}: {args.seq_len // world} tokens per rank need "
            f"~{need:.0f} MiB of activations; use more ranks or a shorter --seq-len"
        )


def _init() -> tuple[int, int, torch.device]:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = group_info(None)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return rank, world, device
    return rank, world, torch.device("cpu")


def main(argv: list[str] | None = None) -> dict:
    """Run the demo; returns the summary (rank 0 also writes it to ``metrics.json``)."""
    args = parse(argv)
    _check(args, int(os.environ.get("WORLD_SIZE", "1")))
    rank, world, device = _init()
    model = context_parallel(build(args), layout=args.layout, strategy=args.strategy).to(device)
    torch.manual_seed(args.seed + 1 + rank)  # --dropout: each rank its own masks, not copies
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    run_info = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    run_info = {k: v for k, v in run_info.items() if k not in ("out", "resume", "steps")}
    ckpt, start, history = args.out / "checkpoint.pt", 0, []
    if args.resume:
        if not ckpt.exists():
            _fail(f"--resume: no checkpoint at {ckpt}; train without --resume first")
        state = read_checkpoint(ckpt)
        if state.get("run_info") != run_info:
            _fail(f"--resume: {ckpt} was trained with different settings")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, history = state["step"], state["history"]
    elif ckpt.exists():
        _fail(f"--out {args.out} already holds a checkpoint: pass --resume or a new --out")
    if rank == 0:
        print(
            f"context parallel: {world} rank(s), {args.seq_len // world} of {args.seq_len} "
            f"tokens each ({args.layout}, {args.strategy}); activations ~"
            f"{activation_mib(args, args.seq_len // world):.0f} MiB per rank, "
            f"~{activation_mib(args, args.seq_len):.0f} MiB in one process "
            f"(budget {args.budget_mib:g} MiB)",
            flush=True,
        )
        atomic_write_json(args.out / "config.json", {"run_info": run_info, "world": world})
    rss0, t_start = _maxrss_mib(), time.perf_counter()
    model.train()
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        ids = batch(args.seed, step, args.batch, args.seq_len, args.vocab, args.period).to(device)
        loss = cp_loss(model, ids, rank, world, args.layout)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        for p in model.parameters():  # each rank holds its positions' share of the gradient
            _all_reduce(p.grad)
        opt.step()
        total = float(_all_reduce(loss.detach().clone()))
        history.append({"step": step + 1, "loss": total, "seconds": time.perf_counter() - t0})
        if rank == 0:
            tok_s = args.batch * args.seq_len / history[-1]["seconds"]
            print(
                f"step {step + 1}/{args.steps}  loss {total:.4f}  {tok_s:.0f} tokens/s", flush=True
            )
            if (step + 1) % args.checkpoint_every == 0 or step + 1 == args.steps:
                _save(ckpt, model, opt, step + 1, history, run_info)
    peak = torch.tensor([_maxrss_mib() - rss0], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(peak, dist.ReduceOp.MAX)
    summary = {
        "world": world, "steps": args.steps, "tokens_per_rank": args.seq_len // world,
        "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None,
        "seconds": time.perf_counter() - t_start,
        "activation_mib_per_rank_estimate": activation_mib(args, args.seq_len // world),
        "activation_mib_one_process_estimate": activation_mib(args, args.seq_len),
        "peak_rss_growth_mib_max_rank": float(peak), "history": history,
    }  # fmt: skip
    if rank == 0 and history:
        atomic_write_json(args.out / "metrics.json", summary)
        print(
            f"done: {len(history)} steps, loss {summary['first_loss']:.4f} -> "
            f"{summary['last_loss']:.4f}, {summary['seconds']:.1f} s, peak RSS growth "
            f"{float(peak):.0f} MiB (largest rank), checkpoint {ckpt}",
            flush=True,
        )
    return summary


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _save(path: Path, model, opt, step: int, history: list, run_info: dict) -> None:
    state = {
        "model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
        "history": history, "run_info": run_info, "format": FORMAT,
    }  # fmt: skip
    atomic_save(path, state)
    atomic_write_json(path.with_name("metrics.json"), {"step": step, "history": history})


if __name__ == "__main__":
    try:
        main()
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
