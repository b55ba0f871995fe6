"""Tiny configurations of every module and model, shared by the deploy tests.

Each builder returns (model, args, kwargs) with a padding mask where the model takes one.
"""

from __future__ import annotations

import torch

from attnkit.models import (
    GPT,
    BertConfig,
    BertEncoder,
    CausalLM,
    GPTConfig,
    Transformer,
    ViT,
    ViTConfig,
    preset,
)
from attnkit.models.transformer import DecoderBlock
from attnkit.modules import EncoderBlock, MultiHeadAttention
from attnkit.vision.swin import SwinConfig, SwinModel

C = 16
BERT = BertConfig(vocab_size=50, hidden_size=C, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=32, max_position_embeddings=32)  # fmt: skip
SEQ = preset("tiny", src_vocab=20, tgt_vocab=20, d_model=C, num_heads=2, d_ff=32,
             encoder_layers=1, decoder_layers=2, attn_dropout=0.2, dropout=0.1)  # fmt: skip


def key_padding(b: int, s: int) -> torch.Tensor:
    """(B, 1, 1, S), True = may attend; row 1 has its last keys padded."""
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[1, ..., s - 2 :] = False
    return mask


def hf_mask(b: int, n: int) -> torch.Tensor:
    """(B, N) Hugging Face attention mask, 1 = token; row 1 has padding."""
    mask = torch.ones(b, n, dtype=torch.long)
    mask[1, n - 2 :] = 0
    return mask


def tokens(b: int, n: int, vocab: int = 20) -> torch.Tensor:
    """(B, N) token ids; row 1 ends with padding (id 0)."""
    t = torch.randint(1, vocab, (b, n))
    t[1, n - 2 :] = 0
    return t


def build(name: str):
    """(model, args, kwargs) for `name`, seeded."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, C)
    if name == "mha-self":
        return MultiHeadAttention(C, 4, dropout=0.2), (x,), dict(mask=key_padding(2, 6))
    if name == "mha-cross":
        ctx = torch.randn(2, 5, 12)
        m = MultiHeadAttention(C, 4, context_dim=12, dropout=0.2)
        return m, (x, ctx), dict(mask=key_padding(2, 5))
    if name == "mha-gqa":
        return MultiHeadAttention(C, 4, num_kv_heads=2, dropout=0.2), (x,), dict(causal=True)
    if name == "encoder-block":
        return (
            EncoderBlock(C, 2, 32, attn_dropout=0.2, dropout=0.1),
            (x,),
            dict(mask=key_padding(2, 6)),
        )
    if name == "decoder-block":
        mem = torch.randn(2, 5, C)
        return DecoderBlock(SEQ), (x, mem), dict(memory_mask=key_padding(2, 5))
    if name == "bert":
        return BertEncoder(BERT), (torch.randint(1, 50, (2, 7)), hf_mask(2, 7)), {}
    if name == "vit":
        return ViT(ViTConfig(dim=C, depth=1, num_heads=2, attn_dropout=0.2)), (
            torch.randn(2, 1, 8, 8),), {}  # fmt: skip
    if name == "t2t":
        cfg = ViTConfig(tokens="t2t", dim=C, depth=1, num_heads=2, t2t_chan=8, attn_dropout=0.2)
        return ViT(cfg), (torch.randn(2, 1, 8, 8),), {}
    if name == "swin":
        cfg = SwinConfig(image_size=16, patch_size=2, embed_dim=8, depths=(1, 1),
                         num_heads=(2, 2), window_size=4, attn_dropout=0.2)  # fmt: skip
        return SwinModel(cfg), (torch.randn(2, 3, 16, 16),), {}
    if name == "transformer":
        return Transformer(SEQ), (tokens(2, 6), tokens(2, 5)), {}
    if name == "causal-lm":
        return CausalLM(SEQ), (tokens(2, 6),), {}
    if name == "gpt":
        cfg = GPTConfig(vocab_size=20, n_layer=2, n_head=2, d_model=C, context=16, dropout=0.1)
        return GPT(cfg), (tokens(2, 6),), {}
    raise KeyError(name)


NAMES = ["mha-self", "mha-cross", "mha-gqa", "encoder-block", "decoder-block", "bert", "vit",
         "t2t", "swin", "transformer", "causal-lm", "gpt"]  # fmt: skip
