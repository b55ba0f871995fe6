"""Worst error of attnkit's positions (RoPE, ALiBi, T5 bias) against transformers, CPU.

Random inputs and weights, several seeds; the maximum absolute difference of
outputs (or the count of differing T5 buckets, which must be 0). Prints a
markdown table. Accuracy only, no timing: it can run on a busy machine.

    python benchmarks/positions_parity.py [--seeds 5]
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPTNeoXConfig, LlamaConfig, T5Config
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.t5.modeling_t5 import T5Attention

from attnkit import MultiHeadAttention, RelativePositionBias, RotaryEmbedding, attention
from attnkit.functional.relative import alibi_bias, padding_positions, relative_position_bucket
from attnkit.functional.rotary import apply_rotary, rotary_tables


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def llama_attention(seed: int) -> float:
    b, n, h, hkv, d = 2, 37, 8, 2, 16
    cfg = LlamaConfig(hidden_size=h * d, num_attention_heads=h, num_key_value_heads=hkv,
                      head_dim=d, attention_bias=False)  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    theirs = LlamaAttention(cfg, layer_idx=0).eval()
    ours = MultiHeadAttention(h * d, h, num_kv_heads=hkv, qkv_bias=False, out_bias=False,
                              rotary=RotaryEmbedding(d)).eval()  # fmt: skip
    with torch.no_grad():
        ours.in_proj.qkv.weight.copy_(
            torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight])
        )
        ours.proj.weight.copy_(theirs.o_proj.weight)
        x = rand(b, n, h * d, seed=seed)
        cos_sin = LlamaRotaryEmbedding(cfg)(x, torch.arange(n)[None].expand(b, n))
        blocked = torch.ones(n, n, dtype=torch.bool).triu(1)
        additive = torch.zeros(n, n).masked_fill(blocked, torch.finfo(torch.float32).min)
        want, _ = theirs(x, position_embeddings=cos_sin, attention_mask=additive[None, None])
        return (ours(x, causal=True) - want).abs().max().item()


def _llama_rotary(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q rotated by transformers (float32 angles), by attnkit (float32), and in float64."""
    q, k = rand(2, 8, 97, 64, seed=seed), rand(2, 2, 97, 64, seed=seed + 1)
    ids = torch.arange(97)[None].expand(2, 97) + torch.tensor([[0], [400]])
    cfg = LlamaConfig(hidden_size=512, num_attention_heads=8, head_dim=64, rope_theta=500000.0)
    theirs, _ = neox_apply(q, k, *LlamaRotaryEmbedding(cfg)(q, ids))  # = Llama's function
    ours = apply_rotary(q, *rotary_tables(ids, 64, base=500000.0))
    truth = apply_rotary(q.double(), *rotary_tables(ids, 64, base=500000.0, dtype=torch.float64))
    return theirs, ours, truth


def llama_rotary(seed: int) -> float:
    theirs, ours, _ = _llama_rotary(seed)
    return (ours - theirs).abs().max().item()


def llama_rotary_truth(seed: int) -> tuple[float, float]:
    theirs, ours, truth = _llama_rotary(seed)
    err = [(t.double() - truth).abs().max().item() for t in (theirs, ours)]
    return err[0], err[1]


def neox_partial(seed: int) -> float:
    cfg = GPTNeoXConfig(hidden_size=96, num_attention_heads=4, rotary_pct=0.25)
    q, k = rand(2, 4, 33, 24, seed=seed), rand(2, 4, 33, 24, seed=seed + 1)
    want_q, want_k = neox_apply(q, k, *GPTNeoXRotaryEmbedding(cfg)(q, torch.arange(33)[None]))
    got_q, got_k = RotaryEmbedding(6)(q, k)
    return max((got_q - want_q).abs().max().item(), (got_k - want_k).abs().max().item())


def gptj_interleaved(seed: int) -> float:
    x, r = rand(2, 33, 4, 16, seed=seed), 8  # GPT-J layout (B, N, H, D), rotary_dim 8
    sin, cos = torch.split(create_sinusoidal_positions(33, r)[None], r // 2, dim=-1)
    want = torch.cat([gptj_apply(x[..., :r], sin, cos), x[..., r:]], -1)
    cos2, sin2 = rotary_tables(33, r)
    got = apply_rotary(x.transpose(1, 2), cos2, sin2, interleaved=True).transpose(1, 2)
    return (got - want).abs().max().item()


def bloom_alibi(seed: int) -> float:
    b, h, n, d = 2, 12, 41, 16
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, :7] = False
    q, k, v = (rand(b, h, n, d, seed=seed + i) for i in range(3))
    theirs = build_alibi_tensor(keep.long(), h, torch.float32).view(b, h, 1, n)
    ours = alibi_bias(h, n, positions=padding_positions(keep))
    kw = {"mask": keep[:, None, None, :], "causal": True, "backend": "reference"}
    return (attention(q, k, v, bias=ours, **kw).out - attention(q, k, v, bias=theirs, **kw).out
            ).abs().max().item()  # fmt: skip


def t5_buckets(seed: int) -> float:
    rel = torch.randint(-5000, 5000, (100_000,), generator=torch.Generator().manual_seed(seed))
    bad = 0
    for bidirectional in (True, False):
        for nb, md in ((32, 128), (16, 64), (64, 1000)):
            want = T5Attention._relative_position_bucket(rel, bidirectional, nb, md)
            got = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=nb,
                                           max_distance=md)  # fmt: skip
            bad += int((got != want).sum())
    return float(bad)


def t5_compute_bias(seed: int) -> float:
    cfg = T5Config(d_model=64, d_kv=16, num_heads=4, is_decoder=True)
    torch.manual_seed(seed)
    t5 = T5Attention(cfg, has_relative_attention_bias=True)
    torch.nn.init.normal_(t5.relative_attention_bias.weight)
    ours = RelativePositionBias(4, bidirectional=False)
    ours.table.weight.data.copy_(t5.relative_attention_bias.weight)
    return (ours(3, 300) - t5.compute_bias(3, 300, past_seen_tokens=297)).abs().max().item()


CHECKS = {
    "LlamaAttention (GQA, causal), float32 output": llama_attention,
    "Llama rotary, positions to 496, θ = 500000, float32": llama_rotary,
    "  the same against float64: transformers (float32 angles) / attnkit": llama_rotary_truth,
    "GPT-NeoX partial rotary (R = 6 of 24), float32": neox_partial,
    "GPT-J interleaved rotary (R = 8 of 16), float32": gptj_interleaved,
    "Bloom ALiBi, 12 heads, left padding, causal: output": bloom_alibi,
    "T5 buckets, 6 configurations x 100000 positions: mismatches": t5_buckets,
    "T5 compute_bias, decoder step after 297 tokens": t5_compute_bias,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    seeds = range(parser.parse_args().seeds)
    print("| check | worst over seeds |\n| --- | ---: |")
    for name, check in CHECKS.items():
        worst = [max(col) for col in zip(*[_tuple(check(s)) for s in seeds], strict=True)]
        print(f"| {name} | {' / '.join(f'{w:.2g}' for w in worst)} |")


def _tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


if __name__ == "__main__":
    main()
