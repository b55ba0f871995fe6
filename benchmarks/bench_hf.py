"""attnkit as transformers' attention backend vs "sdpa" vs "eager", on random models.

    PYTHONPATH=src python benchmarks/bench_hf.py [--batch 8] [--seq 128] [--repeats 5]

Two random models built from configs (offline): a BERT-base-sized encoder (12 layers, 768
wide, 12 heads) and a small Llama-style decoder with grouped-query attention (8 layers, 512
wide, 8 query heads sharing 2 key/value heads). Input: a batch whose last row has its final
quarter padded. Modes:

* forward: eval, under no_grad;
* forward+backward: train mode (dropout 0), a sum of the last hidden state backpropagated;
* forward while recording: every layer's per-head maps captured: attnkit under
  `attnkit.record_attention`, eager with `output_attentions=True` (sdpa cannot return them).

Each implementation is a separate model with the same weights, in the same process; the
timings are medians of `--repeats` calls after two warm-up calls, the implementations of a
row interleaved. Writes benchmarks/results/hf.json and hf.md (atomically) and prints the table.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers

import attnkit
import attnkit.integrations.transformers  # registers "attnkit"
from attnkit._io import atomic_write_json, atomic_write_text

IMPLS = ("attnkit", "sdpa", "eager")
OUT = Path(__file__).resolve().parent / "results"


def configs() -> dict[str, transformers.PretrainedConfig]:
    return {
        "BERT-base (12 x 768)": transformers.BertConfig(
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        ),
        "Llama GQA (8 x 512, 8/2 heads)": transformers.LlamaConfig(
            vocab_size=32000,
            hidden_size=512,
            intermediate_size=1408,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=2,
            pad_token_id=0,
        ),
    }


def models(config) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    base = transformers.AutoModel.from_config(config)
    out = {}
    for impl in IMPLS:
        # a copy each: from_config writes the implementation into the config it is given
        model = transformers.AutoModel.from_config(copy.deepcopy(config), attn_implementation=impl)
        assert model.config._attn_implementation == impl
        model.load_state_dict(base.state_dict())
        out[impl] = model
    return out


def batch(config, b: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, config.vocab_size, (b, n), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(b, n, dtype=torch.long)
    mask[-1, n - n // 4 :] = 0  # one row padded by a quarter
    return ids, mask


def run(model, impl: str, mode: str, ids, mask) -> None:
    if mode == "forward":
        model.eval()
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    elif mode == "forward+backward":
        model.train()
        model(input_ids=ids, attention_mask=mask).last_hidden_state.sum().backward()
        model.zero_grad(set_to_none=True)
    else:  # forward while recording
        model.eval()
        with torch.no_grad():
            if impl == "attnkit":
                with attnkit.record_attention(model) as rec:
                    model(input_ids=ids, attention_mask=mask)
                assert len(rec) == model.config.num_hidden_layers
            else:
                out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
                assert len(out.attentions) == model.config.num_hidden_layers


def time_row(ms: dict, mode: str, ids, mask, repeats: int) -> dict[str, float]:
    impls = [i for i in IMPLS if not (mode == "forward while recording" and i == "sdpa")]
    for impl in impls:
        for _ in range(2):  # warm-up
            run(ms[impl], impl, mode, ids, mask)
    times: dict[str, list[float]] = {i: [] for i in impls}
    for _ in range(repeats):
        for impl in impls:  # interleaved, so that machine noise falls on all alike
            t0 = time.perf_counter()
            run(ms[impl], impl, mode, ids, mask)
            times[impl].append(time.perf_counter() - t0)
    return {i: statistics.median(t) * 1e3 for i, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = []
    for name, config in configs().items():
        ms = models(config)
        ids, mask = batch(config, args.batch, args.seq)
        for mode in ("forward", "forward+backward", "forward while recording"):
            ms_row = time_row(ms, mode, ids, mask, args.repeats)
            rows.append({"model": name, "mode": mode, "ms": ms_row})
            print(name, mode, {k: round(v, 1) for k, v in ms_row.items()}, flush=True)
    lines = [
        f"B={args.batch}, N={args.seq}, float32, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"median of {args.repeats} (ms; ratio = other / attnkit, > 1: attnkit faster)",
        "",
        "| model | mode | attnkit | sdpa | eager | sdpa / attnkit | eager / attnkit |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        t = r["ms"]
        sdpa = f"{t['sdpa']:.0f}" if "sdpa" in t else "n/a"
        ratio = f"{t['sdpa'] / t['attnkit']:.2f}" if "sdpa" in t else "n/a"
        lines.append(
            f"| {r['model']} | {r['mode']} | {t['attnkit']:.0f} | {sdpa} | {t['eager']:.0f} "
            f"| {ratio} | {t['eager'] / t['attnkit']:.2f} |"
        )
    table = "\n".join(lines) + "\n"
    meta = {
        "batch": args.batch, "seq": args.seq, "repeats": args.repeats,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "machine": platform.machine(),
    }  # fmt: skip
    atomic_write_json(args.out / "hf.json", {"meta": meta, "rows": rows})
    atomic_write_text(args.out / "hf.md", table)
    print(table)


if __name__ == "__main__":
    main()
