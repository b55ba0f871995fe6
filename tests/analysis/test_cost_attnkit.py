"""attnkit's own modules and backends under torch's FLOP counter and saved-tensor hooks."""

import random

import pytest
import torch

import attnkit
from attnkit.analysis import attention_memory, mha_cost

from .counting import count_flops, n_params
from .test_memory import saved_bytes

pytestmark = pytest.mark.threads(1)


def _configs(count=24, seed=0):
    """A seeded sweep: odd N and S, GQA/MQA, cross-attention, out_dim, head widths."""
    rng = random.Random(seed)
    for _ in range(count):
        heads = rng.choice([1, 2, 3, 6])
        kv = rng.choice([g for g in (1, 2, 3, 6) if heads % g == 0])
        d = rng.choice([1, 5, 8])
        cross = rng.random() < 0.5
        yield {
            "n": rng.randrange(1, 14),
            "dim": heads * d * rng.choice([1, 2]),
            "heads": heads,
            "kv_heads": kv,
            "head_dim": d,
            "context_len": rng.randrange(1, 12) if cross else None,
            "context_dim": rng.randrange(2, 10) if cross else None,
            "out_dim": rng.choice([None, 7]),
            "qkv_bias": rng.random() < 0.5,
            "causal": rng.random() < 0.5,
            "batch": rng.randrange(1, 3),
        }


@pytest.mark.parametrize("backend", ["reference", "fused"])
@pytest.mark.parametrize(
    "cfg", list(_configs()), ids=lambda c: "n{n}-h{heads}-g{kv_heads}".format(**c)
)
def test_multihead_attention_flops_and_params(cfg, backend):
    torch.manual_seed(0)
    m = attnkit.MultiHeadAttention(
        cfg["dim"], cfg["heads"], out_dim=cfg["out_dim"], context_dim=cfg["context_dim"],
        num_kv_heads=cfg["kv_heads"], head_dim=cfg["head_dim"], qkv_bias=cfg["qkv_bias"],
    )  # fmt: skip
    x = torch.randn(cfg["batch"], cfg["n"], cfg["dim"])
    ctx = None
    if cfg["context_len"] is not None:
        ctx = torch.randn(cfg["batch"], cfg["context_len"], cfg["context_dim"])
    cost = mha_cost(**cfg)
    assert n_params(m) == cost.params
    with attnkit.use_backend(backend):
        assert count_flops(m, x, ctx, causal=cfg["causal"]) == cost.flops


def test_t2t_attention():
    # T2T-ViT's first stage: 7·7 = 49-wide tokens, one head of width 64, output width 64
    m = attnkit.T2TAttention(49, 64, 1)
    cost = mha_cost(3136, 49, 1, head_dim=64, out_dim=64, qkv_bias=False)
    assert n_params(m) == cost.params
    small = mha_cost(37, 49, 1, head_dim=64, out_dim=64, qkv_bias=False, batch=2)
    assert count_flops(m, torch.randn(2, 37, 49)) == small.flops


def test_attnkit_backends_memory():
    b, h, n, s, d = 2, 3, 29, 41, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, t, d, generator=g).requires_grad_() for t in (n, s, s))
    fused = attention_memory(b, h, n, s, d, backend="fused")
    assert saved_bytes(lambda: attnkit.attention(q, k, v, backend="fused")) == fused.saved_bytes
    # attnkit's reference keeps exactly the textbook set (its lse is computed without grad)
    textbook = attention_memory(b, h, n, s, d, backend="reference")
    measured = saved_bytes(lambda: attnkit.attention(q, k, v, backend="reference"))
    assert measured == textbook.saved_bytes


@pytest.mark.parametrize("n,s", [(1, 1), (7, 7), (5, 12), (12, 5), (97, 33)])
def test_allowed_pairs_equal_attnkit_masks(n, s):
    from attnkit.analysis import allowed_pairs

    assert allowed_pairs(n, s, causal=True) == int(attnkit.masks.causal(n, s).sum())
    for w in (1, 3, 50):
        for causal in (False, True):
            mask = attnkit.masks.sliding_window(n, w, s, causal=causal)
            assert allowed_pairs(n, s, causal=causal, window=w) == int(mask.sum())
