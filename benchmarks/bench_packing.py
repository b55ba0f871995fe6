"""Training tokens/s of a small GPT on documents of mixed length: packed rows vs padded rows.

The documents are the paragraphs (split at blank lines) of `attnkit lm train`'s default corpus,
the Python standard library's .py files read in sorted order: lengths from a few characters to
thousands (the distribution is in the results). Every mode trains the same character-level GPT
(`attnkit lm train`'s defaults: 2 layers, 4 heads, width 128, context 128, batch 32, AdamW,
clipping) for one optimizer step per call, on batches drawn at random (seeded) beforehand:

* packed — `attnkit.train.packing.pack`: the documents back to back in rows of context + 1
  tokens with document ids (`GPT.loss(ids, document_ids=)`: attention and loss stay inside each
  document); no padding.
* padded, longest — one document per row (longer ones cut into pieces of context + 1), right-padded
  to the longest row of the batch; the loss ignores the pads.
* padded, context — the same rows padded to context + 1 always.
* windows — what `attnkit lm train` does without --pack: random windows of the concatenated
  text, no document boundaries at all (the reference: no padding, no document mask).

tokens/s counts real (not padding) tokens of the batches per second of training step. Timings:
one warm-up step each, then the modes interleaved in a shuffled order `repeats` times, medians,
one process (`attnkit.analysis.bench.time_interleaved`). Prints a markdown table and writes
benchmarks/results/packing.json and packing.md.

    python benchmarks/bench_packing.py [--repeats 15] [--threads 1]
    python benchmarks/bench_packing.py --tiny      # a seconds-long smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

import torch

from attnkit._cpu import cpu_name
from attnkit._io import atomic_write_json, atomic_write_text
from attnkit.analysis.bench import time_interleaved
from attnkit.models import GPT, GPTConfig
from attnkit.train.corpus import read_corpus
from attnkit.train.packing import pack, pad, paragraphs, pieces

MODES = ("packed", "padded, longest", "padded, context", "windows")


def batches(mode: str, docs: list[torch.Tensor], width: int, batch: int, count: int, pad_id: int):
    """`count` batches of `mode`: (ids (B, L), document_ids or None, real tokens)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    if mode == "packed":
        rows = pack(docs, width)
        for _ in range(count):
            pick = torch.randint(0, len(rows), (batch,), generator=gen)
            out.append((rows.ids[pick], rows.document_ids[pick], batch * width))
    elif mode.startswith("padded"):
        cut = pieces(docs, width)
        for _ in range(count):
            pick = torch.randint(0, len(cut), (batch,), generator=gen).tolist()
            ids, lengths = pad([cut[i] for i in pick], pad_id)
            if mode == "padded, context":
                ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=pad_id)
            out.append((ids, None, int(lengths.sum())))
    else:
        stream = torch.cat(docs)
        for _ in range(count):
            starts = torch.randint(0, len(stream) - width + 1, (batch,), generator=gen)
            out.append((stream[starts[:, None] + torch.arange(width)], None, batch * width))
    return out


def make_step(cfg: GPTConfig, lr: float, data: list):
    """One AdamW step per call on the next batch of `data` (the `attnkit lm train` step)."""
    torch.manual_seed(0)
    model = GPT(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    state = {"i": 0}

    def step() -> None:
        ids, docs, _ = data[state["i"] % len(data)]
        state["i"] += 1
        loss = model.loss(ids) if docs is None else model.loss(ids, document_ids=docs)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def markdown(rows: list[dict], shape: dict) -> list[str]:
    head = (
        f"| mode (GPT L={shape['layers']} H={shape['heads']} C={shape['d_model']}, "
        f"context {shape['context']}, batch {shape['batch']}) | real tokens / step | "
        "padding | ms / step | real tokens/s | vs padded, longest |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    base = next(r for r in rows if r["mode"] == "padded, longest")["tokens_per_s"]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['tokens_per_step']:.0f} | {r['padding']:.0%} | "
            f"{r['ms_per_step']:.1f} | {r['tokens_per_s']:.0f} | "
            f"{r['tokens_per_s'] / base:.2f}× |"
        )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-chars", type=int, default=1_000_000)
    p.add_argument("--batches", type=int, default=8, help="distinct batches per mode, cycled")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: stable)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes: checks the script runs")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "packing.json")
    args = p.parse_args()
    if args.tiny:
        args.layers, args.heads, args.d_model, args.context = 1, 2, 16, 16
        args.batch, args.max_chars, args.batches, args.repeats = 4, 20_000, 2, 1
    torch.set_num_threads(args.threads)
    corpus = read_corpus(None, args.max_chars)
    text, source = corpus.text, corpus.source
    vocab = "".join(sorted(set(text)))
    index = {ch: i for i, ch in enumerate(vocab)}
    docs = [torch.tensor([index[c] for c in d]) for d in paragraphs(text)]
    width, pad_id = args.context + 1, len(vocab)  # one more token: the padding
    cfg = GPTConfig(len(vocab) + 1, args.layers, args.heads, args.d_model, args.context,
                    pad_id=pad_id)  # fmt: skip
    data = {m: batches(m, docs, width, args.batch, args.batches, pad_id) for m in MODES}
    load = os.getloadavg()
    ms = time_interleaved({m: make_step(cfg, 3e-3, data[m]) for m in MODES}, args.repeats)
    rows = []
    for m in MODES:
        real = statistics.mean(b[2] for b in data[m])
        total = statistics.mean(b[0].numel() for b in data[m])
        rows.append({
            "mode": m, "tokens_per_step": real, "padding": 1 - real / total,
            "ms_per_step": ms[m], "tokens_per_s": real / ms[m] * 1e3,
        })  # fmt: skip
    lengths = sorted(len(d) for d in docs)
    shape = {"layers": args.layers, "heads": args.heads, "d_model": args.d_model,
             "context": args.context, "batch": args.batch}  # fmt: skip
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "load_avg_start": load,
        "load_avg_end": os.getloadavg(),
        "shape": shape,
        "repeats": args.repeats,
        "corpus": source,
        "documents": {
            "count": len(docs),
            "chars": len(text),
            "length_median": statistics.median(lengths),
            "length_mean": round(statistics.mean(lengths), 1),
            "length_p90": lengths[int(0.9 * (len(lengths) - 1))],
            "length_max": lengths[-1],
            "fit_one_row": round(sum(n <= width for n in lengths) / len(lengths), 3),
        },
    }
    lines = markdown(rows, shape)
    print("\n".join(lines))
    print(f"\n{env}")
    if args.tiny:
        return  # a smoke run writes no results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, {"env": env, "rows": rows})
    table = args.out.with_suffix(".md")
    atomic_write_text(table, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
