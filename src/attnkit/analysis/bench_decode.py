"""Decode rows of `attnkit bench`: cached greedy generation of `attnkit.models.GPT` against a
plain PyTorch GPT of the same size and weights (SDPA and a preallocated key/value cache).

Legend: B batch, L layers, H heads, C model width, Dh head width, S_max context.

`PlainGPT` is what one writes without attnkit (nanoGPT's model plus a cache): one fused
qkv matmul, `F.scaled_dot_product_attention` with ``is_causal`` only for the prompt, the
new keys written in place into (B, H, S_max, Dh) buffers. Both run the same greedy loop
shape: prefill the prompt, then one token per step; tokens/s counts generated tokens of
all rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DecodeShape", "PlainGPT", "decode_rows", "plain_generate"]

Timer = Callable[[dict[str, Callable[[], None]], int], dict[str, float]]


@dataclass(frozen=True)
class DecodeShape:
    """The GPT and the generation each decode row times."""

    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    context: int = 256
    vocab: int = 256  # characters
    prompt: int = 16
    new_tokens: int = 128
    batches: tuple[int, ...] = (1, 8)


class _PlainBlock(nn.Module):
    def __init__(self, c: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.qkv, self.out = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

    def forward(self, x: Tensor, cache: tuple[Tensor, Tensor], start: int) -> Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        kb, vb = cache  # (B, H, S_max, Dh) each
        kb[:, :, start : start + n] = k
        vb[:, :, start : start + n] = v
        k, v = kb[:, :, : start + n], vb[:, :, : start + n]  # (B, H, S, Dh)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=n > 1)  # prompt: start == 0
        x = x + self.out(o.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class PlainGPT(nn.Module):
    """A GPT in plain PyTorch with the weights of an attnkit `GPT` (bias, GELU, tied head)."""

    def __init__(self, gpt) -> None:
        super().__init__()
        cfg = gpt.cfg
        if cfg.rotary:
            raise ValueError("PlainGPT copies learned positions: build the GPT with rotary=False")
        self.context, self.heads = cfg.context, cfg.n_head
        self.wte, self.wpe = (
            nn.Embedding(cfg.vocab_size, cfg.d_model),
            nn.Embedding(cfg.context, cfg.d_model),
        )
        self.blocks = nn.ModuleList(
            _PlainBlock(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer)
        )
        self.ln = nn.LayerNorm(cfg.d_model)
        with torch.no_grad():
            self.wte.weight.copy_(gpt.tokens.weight)
            self.wpe.weight.copy_(gpt.positions.weight)
            self.ln.load_state_dict(gpt.norm.state_dict())
            for mine, theirs in zip(self.blocks, gpt.blocks, strict=True):
                attn, ff = theirs.attn.fn, theirs.ff.fn
                mine.ln1.load_state_dict(theirs.attn.norm.state_dict())
                mine.ln2.load_state_dict(theirs.ff.norm.state_dict())
                mine.qkv.load_state_dict(attn.in_proj.qkv.state_dict())
                mine.out.load_state_dict(attn.proj.state_dict())
                mine.fc1.load_state_dict(ff.fc1.state_dict())
                mine.fc2.load_state_dict(ff.fc2.state_dict())

    def new_cache(self, batch: int) -> list[tuple[Tensor, Tensor]]:
        c = self.wte.embedding_dim
        shape = (batch, self.heads, self.context, c // self.heads)  # (B, H, S_max, Dh)
        return [(torch.empty(shape), torch.empty(shape)) for _ in self.blocks]

    def forward(self, ids: Tensor, cache: list[tuple[Tensor, Tensor]], start: int) -> Tensor:
        """ids (B, N) at positions start.. -> logits (B, N, V)."""
        x = self.wte(ids) + self.wpe.weight[start : start + ids.shape[1]]
        for block, kv in zip(self.blocks, cache, strict=True):
            x = block(x, kv, start)
        return self.ln(x) @ self.wte.weight.T


@torch.no_grad()
def plain_generate(model: PlainGPT, ids: Tensor, new_tokens: int) -> Tensor:
    """Greedy, cached: ids (B, P) -> (B, P + new_tokens); P + new_tokens <= context."""
    cache = model.new_cache(ids.shape[0])
    out = [ids]
    logits = model(ids, cache, 0)
    for t in range(new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        out.append(nxt)
        if t + 1 < new_tokens:
            logits = model(nxt, cache, ids.shape[1] + t)
    return torch.cat(out, 1)


def _models(shape: DecodeShape):
    from attnkit.models import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(shape.vocab, shape.n_layer, shape.n_head, shape.d_model, shape.context)
    gpt = GPT(cfg).eval()
    return gpt, PlainGPT(gpt).eval()


def decode_rows(shape: DecodeShape, repeats: int, time_interleaved: Timer) -> list[dict]:
    """One row per batch size: generated tokens/s of attnkit's GPT and the plain GPT, their
    ratio, the key/value cache bytes of each, and whether both produced the same tokens."""
    from attnkit.models import KVCache, generate

    if shape.prompt + shape.new_tokens > shape.context:
        raise ValueError(
            f"prompt + new_tokens = {shape.prompt + shape.new_tokens} must fit the "
            f"context {shape.context}"
        )
    gpt, plain = _models(shape)
    rows = []
    for b in shape.batches:
        prompt = torch.randint(
            0, shape.vocab, (b, shape.prompt), generator=torch.Generator().manual_seed(b)
        )
        ours, theirs = (
            generate(gpt, prompt, shape.new_tokens),
            plain_generate(plain, prompt, shape.new_tokens),
        )
        ms = time_interleaved(
            {
                "attnkit": lambda p=prompt: generate(gpt, p, shape.new_tokens),
                "plain": lambda p=prompt: plain_generate(plain, p, shape.new_tokens),
            },
            repeats,
        )
        cache = KVCache(capacity=shape.context)
        with torch.no_grad():
            gpt(prompt, cache=cache)
        plain_bytes = sum(t.numel() * t.element_size() for kv in plain.new_cache(b) for t in kv)
        tokens = b * shape.new_tokens
        rows.append(
            {
                "kind": "decode",
                "batch": b,
                "shape": [shape.n_layer, shape.n_head, shape.d_model, shape.context],
                "new_tokens": shape.new_tokens,
                "tokens_per_s": {k: tokens / (v / 1e3) for k, v in ms.items()},
                "plain_over_attnkit_time": ms["plain"] / ms["attnkit"],
                "cache_mib": {"attnkit": cache.nbytes() / 2**20, "plain": plain_bytes / 2**20},
                "same_tokens": bool(torch.equal(ours, theirs)),
            }
        )
    return rows


def markdown_lines(rows: list[dict]) -> list[str]:
    """The decode table of bench.md."""
    decode = [r for r in rows if r["kind"] == "decode"]
    if not decode:
        return []
    lines = [
        "",
        "| decode (greedy, cached) | L, H, C, S_max | batch | attnkit tok/s | plain SDPA tok/s "
        "| plain/attnkit time | cache MiB attnkit / plain | same tokens |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in decode:
        tps, mib = r["tokens_per_s"], r["cache_mib"]
        lines.append(
            f"| GPT, {r['new_tokens']} new tokens | {r['shape']} | {r['batch']} | "
            f"{tps['attnkit']:.0f} | {tps['plain']:.0f} | {r['plain_over_attnkit_time']:.2f} | "
            f"{mib['attnkit']:.2f} / {mib['plain']:.2f} | {r['same_tokens']} |"
        )
    return lines
