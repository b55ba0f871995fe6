"""What the transformers backend gains from receiving descriptions instead of dense masks.

    PYTHONPATH=src python benchmarks/bench_hf_structure.py [--seq 2048] [--repeats 5]

Random two-layer models of width 512 (8 heads of 64), offline, float32, one thread:

* Mistral with a sliding window of 256, one row of `--seq` tokens (forward, and forward +
  backward);
* Llama with one row packing 8 documents (position ids restarting), ``use_cache=False`` so
  that transformers' own dense mask holds the documents (forward);
* BERT with a padded batch of 4 x 512 (forward).

Each compares attnkit as it is now ("attnkit": the mask interface of
`attnkit.integrations._hf_masks` gives descriptions) with attnkit receiving transformers'
dense boolean (B, 1, N, S) masks, as before ("attnkit dense": registered here as a second
implementation whose mask interface is transformers' ``sdpa_mask``) and with transformers'
"sdpa". Same weights, one process, the implementations interleaved, medians of `--repeats`
calls after one warm-up call. Prints a markdown table; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers
from transformers import masking_utils as mu

import attnkit.integrations.transformers as hf
from attnkit._cpu import cpu_name

_SDPA_MASK_ARGS = (
    "batch_size", "q_length", "kv_length", "q_offset", "kv_offset", "mask_function",
    "attention_mask", "allow_is_bidirectional_skip", "use_vmap", "device", "local_size",
)  # fmt: skip


def _dense_mask(**kw):
    """The attnkit backend's mask before descriptions: transformers' dense boolean mask."""
    return mu.sdpa_mask(
        allow_is_causal_skip=False, **{k: v for k, v in kw.items() if k in _SDPA_MASK_ARGS}
    )


def _register_dense() -> None:
    mu.AttentionMaskInterface.register("attnkit_dense", _dense_mask)
    transformers.AttentionInterface.register("attnkit_dense", hf.attnkit_attention_forward)


IMPLS = ("attnkit", "attnkit_dense", "sdpa")
WIDTH = dict(hidden_size=512, num_hidden_layers=2, num_attention_heads=8, intermediate_size=512)


def _models(config, auto) -> dict:
    torch.manual_seed(0)
    models = {}
    for impl in IMPLS:
        model = auto.from_config(config(), attn_implementation=impl).eval()
        if models:
            model.load_state_dict(next(iter(models.values())).state_dict())
        models[impl] = model
    return models


def _medians(models: dict, call, repeats: int) -> dict:
    for model in models.values():
        call(model)  # warm-up
    times: dict = {k: [] for k in models}
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            call(model)
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def rows(seq: int, repeats: int):
    """Yield (case, {implementation: median seconds}) as each case is measured."""
    mistral = _models(
        lambda: transformers.MistralConfig(vocab_size=99, **WIDTH, sliding_window=256),
        transformers.AutoModelForCausalLM,
    )
    ids = torch.randint(3, 90, (1, seq))

    def forward(model, **kw):
        with torch.no_grad():
            model.model(input_ids=ids, use_cache=False, **kw)

    def train_step(model):
        model.zero_grad()
        model.model(input_ids=ids, use_cache=False).last_hidden_state.sum().backward()

    yield f"Mistral, window 256, N={seq}, forward", _medians(mistral, forward, repeats)
    yield f"Mistral, window 256, N={seq}, fwd+bwd", _medians(mistral, train_step, repeats)
    llama = _models(
        lambda: transformers.LlamaConfig(vocab_size=99, **WIDTH), transformers.AutoModelForCausalLM
    )
    pos = torch.arange(seq // 8).repeat(8)[None]  # (1, N): 8 documents
    label = f"Llama, 8 packed documents, N={seq}, forward"
    yield label, _medians(llama, lambda m: forward(m, position_ids=pos), repeats)
    bert = _models(lambda: transformers.BertConfig(vocab_size=99, **WIDTH), transformers.AutoModel)
    ids_b = torch.randint(3, 90, (4, 512))
    keep = torch.ones(4, 512, dtype=torch.long)
    keep[1, 300:] = keep[3, 100:] = 0

    def bert_forward(model):
        with torch.no_grad():
            model(input_ids=ids_b, attention_mask=keep)

    yield "BERT, padded batch 4 x 512, forward", _medians(bert, bert_forward, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    _register_dense()
    print(f"CPU: {cpu_name()}, torch {torch.__version__}, 1 thread")
    print("| case | attnkit | attnkit dense | sdpa | attnkit / dense | sdpa / attnkit |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, t in rows(args.seq, args.repeats):
        a, d, s = (t[k] * 1000 for k in IMPLS)
        print(
            f"| {label} | {a:.0f} ms | {d:.0f} ms | {s:.0f} ms | {a / d:.2f} | {s / a:.2f} |",
            flush=True,  # each row as it is measured: the whole run takes about a minute
        )
    print("printed 4 rows (nothing written)")


if __name__ == "__main__":
    main()
