"""Model-level costs against torch-built models: parameters and counted FLOPs, part by part."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnkit.analysis import bert_cost, transformer_cost, vit_cost

from .counting import count_flops, n_params

pytestmark = pytest.mark.threads(1)


def _encoder_layer(dim, heads, ff, act, norm_first=False):
    # train mode and dropout 0: the slow path, whose attention runs through SDPA
    return nn.TransformerEncoderLayer(
        dim, heads, ff, dropout=0.0, activation=act, batch_first=True, norm_first=norm_first
    )


class MiniBert(nn.Module):
    def __init__(self, layers, dim, heads, inter, vocab, max_pos):
        super().__init__()
        self.word, self.pos, self.token_type = (
            nn.Embedding(vocab, dim), nn.Embedding(max_pos, dim), nn.Embedding(2, dim)
        )  # fmt: skip
        self.norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(
            _encoder_layer(dim, heads, inter, "gelu") for _ in range(layers)
        )
        self.pooler = nn.Linear(dim, dim)

    def forward(self, ids):
        n = ids.shape[1]
        x = self.norm(
            self.word(ids) + self.pos(torch.arange(n)) + self.token_type(torch.zeros_like(ids))
        )
        for layer in self.layers:
            x = layer(x)
        return torch.tanh(self.pooler(x[:, 0]))


class MiniViT(nn.Module):
    def __init__(self, image, patch, dim, depth, heads, ratio, classes, chans):
        super().__init__()
        self.embed = nn.Conv2d(chans, dim, patch, stride=patch)
        n = (image // patch) ** 2 + 1
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n, dim))
        hidden = int(dim * ratio)
        self.blocks = nn.ModuleList(
            _encoder_layer(dim, heads, hidden, "gelu", norm_first=True) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, img):
        x = self.embed(img).flatten(2).transpose(1, 2)  # (B, P, C)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos  # (B, N, C)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def test_bert_params_and_flops_match_torch_model():
    cfg = {"layers": 2, "dim": 30, "heads": 5, "intermediate": 44, "seq_len": 9}
    model = MiniBert(2, 30, 5, 44, vocab=50, max_pos=16).train()
    cost = bert_cost(**cfg, vocab=50, max_positions=16, batch=2)
    assert cost.total.params == n_params(model)
    ids = torch.randint(0, 50, (2, 9))
    assert count_flops(model, ids) == cost.total.flops
    assert list(cost.parts) == ["embeddings", "layer.0", "layer.1", "pooler"]


def test_vit_params_and_flops_match_torch_model():
    model = MiniViT(20, 5, 24, 2, 3, 2.5, 7, chans=2).train()
    cost = vit_cost(20, 5, 24, 2, 3, 2.5, 7, in_chans=2, batch=3)
    assert cost.total.params == n_params(model)
    assert count_flops(model, torch.randn(3, 2, 20, 20)) == cost.total.flops


def test_transformer_params_and_flops_match_torch_transformer():
    dim, heads, ff, vocab, s, n = 24, 4, 40, 31, 7, 5
    core = nn.Transformer(dim, heads, 2, 3, ff, dropout=0.0, batch_first=True).train()
    emb = nn.Embedding(vocab, dim)  # shared by source, target and the output projection
    cost = transformer_cost(s, n, dim, heads, ff, 2, 3, vocab, batch=2)
    assert cost.total.params == n_params(core) + n_params(emb)

    src, tgt = torch.randint(0, vocab, (2, s)), torch.randint(0, vocab, (2, n))
    causal = nn.Transformer.generate_square_subsequent_mask(n)

    def run():
        out = core(emb(src) * dim**0.5, emb(tgt) * dim**0.5, tgt_mask=causal, tgt_is_causal=True)
        return F.linear(out, emb.weight)  # tied generator

    assert count_flops(run) == cost.total.flops
    dec = cost.parts["decoder.0"]
    assert dec.masked_macs == 2 * n * (n - 1) // 2 * 2 * dim  # B = 2; causal self-attention only
    assert dec.terms["self_attn.q_proj"] == dec.terms["cross_attn.q_proj"] == 2 * n * dim * dim


def test_reference_sizes():
    # published parameter counts: ViT-B/16 (timm vit_base_patch16_224), all-MiniLM-L6-v2
    assert vit_cost().total.params == 86_567_656
    assert bert_cost().total.params == 22_713_216
    vit = vit_cost()
    assert vit.parts["block.0"].terms["scores (QKᵀ)"] == 197 * 197 * 768
    d = json.loads(json.dumps(vit.to_dict()))
    assert d["macs"] == sum(p["macs"] for p in d["parts"].values())
