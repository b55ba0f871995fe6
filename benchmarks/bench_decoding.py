"""Cached vs uncached greedy decoding of the encoder-decoder Transformer (CPU).

Uncached decoding recomputes the whole prefix at every step (O(T²) decoder
work in total, O(T³) attention); the key/value cache computes each position
once. Prints a markdown table and writes benchmarks/results/decoding.json.

    python benchmarks/bench_decoding.py [--lengths 16 64 256] [--d-model 128] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from attnkit.models import Transformer, greedy, preset

BOS, PAD, NEVER = 1, 0, -1  # eos=-1: never stop early, decode exactly max_len tokens


@torch.no_grad()
def uncached_greedy(model: Transformer, src: torch.Tensor, max_len: int) -> torch.Tensor:
    memory, mask = model.encode(src)
    tgt = torch.full((src.shape[0], 1), BOS)
    for _ in range(max_len):
        nxt = model.decode(tgt, memory, mask)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        tgt = torch.cat([tgt, nxt], 1)
    return tgt[:, 1:]


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--src-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: stable on a shared CPU)"
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "decoding.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    cfg = preset(
        "base",
        src_vocab=1000,
        tgt_vocab=1000,
        d_model=args.d_model,
        num_heads=4,
        d_ff=4 * args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        max_len=max(args.lengths) + 1,
    )
    model = Transformer(cfg).eval()
    src = torch.randint(3, 1000, (args.batch, args.src_len))
    rows = []
    for n in args.lengths:
        cached = greedy(model, src, bos=BOS, eos=NEVER, pad=PAD, max_len=n)
        plain = uncached_greedy(model, src, n)
        agree = float((cached == plain).float().mean())
        t_cached = best_of(
            lambda n=n: greedy(model, src, bos=BOS, eos=NEVER, pad=PAD, max_len=n), args.repeats
        )
        t_plain = best_of(lambda n=n: uncached_greedy(model, src, n), args.repeats)
        rows.append(
            {
                "tokens": n,
                "cached_s": round(t_cached, 4),
                "uncached_s": round(t_plain, 4),
                "speedup": round(t_plain / t_cached, 2),
                "same_tokens": agree,
            }
        )
        print(rows[-1], flush=True)
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "load_avg": os.getloadavg(),
        "model": {"d_model": args.d_model, "layers": f"{args.layers}+{args.layers}", "heads": 4},
        "batch": args.batch,
        "src_len": args.src_len,
    }
    print("\n| output tokens | cached (s) | uncached (s) | speed-up | same tokens |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['tokens']} | {r['cached_s']:.3f} | {r['uncached_s']:.3f} | "
            f"{r['speedup']:.1f}x | {r['same_tokens']:.3f} |"
        )
    print(f"\n{env}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"env": env, "rows": rows}, indent=2) + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
