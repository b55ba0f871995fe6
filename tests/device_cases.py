# ruff: noqa: E501  (the table keeps one line per case)
"""One row per public module / model class: how to build it with factory kwargs and feed it.

Shared by tests/test_devices.py (parameters and buffers on meta, default device, to_empty +
reset_parameters, float64) and tests/test_devices_forward.py (forward on the meta device).
Adding a module is one `Case(...)` line; `test_every_public_module_has_a_case` fails when a
class in the `__all__` of attnkit.modules / models / vision has none.

Sizes: B = 2 batch, N = 5 tokens, C = 8 width; padded inputs drop the last 2 keys of row 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from attnkit.models import (
    GPT,
    BertClassifier,
    BertConfig,
    BertEncoder,
    CachedMultiHeadAttention,
    CausalLM,
    CNNConfig,
    DecoderBlock,
    DetrDecoder,
    DetrEncoder,
    DetrTransformer,
    GPTBlock,
    GPTConfig,
    KVCache,
    PatchEmbed,
    RNNConfig,
    RNNSeq2Seq,
    SmallCNN,
    T2TEmbed,
    Transformer,
    TransformerConfig,
    UniversalConfig,
    UniversalTransformer,
    ViT,
    ViTConfig,
)
from attnkit.modules import (
    AdditiveAttention,
    AlibiBias,
    Attend,
    AttentionPooling,
    EncoderBlock,
    FeedForward,
    LearnedPositionalEmbedding,
    LuongAttention,
    MultiHeadAttention,
    PostNormResidual,
    PreNormResidual,
    RelativePositionBias,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    T2TAttention,
    bert_self_attention,
    paper_attention,
)
from attnkit.vision import (
    CBAM,
    PatchMerging,
    SelfAttention2d,
    SpatialAttention,
    SqueezeExcitation,
    SwinBlock,
    SwinConfig,
    SwinModel,
    SwinStage,
    WindowAttention,
)

B, N, C = 2, 5, 8

Inputs = Callable[[torch.device | str, torch.dtype, bool], tuple[tuple, dict]]


@dataclass(frozen=True)
class Case:
    """build(device=, dtype=) -> module; inputs(device, dtype, padded) -> (args, kwargs)."""

    id: str
    covers: type  # the public class this row checks
    build: Callable[..., nn.Module]
    inputs: Inputs
    shape: tuple[int, ...]  # of the forward output
    masked: bool = False  # inputs(padded=True) carries a padding mask / padded tokens
    output: Callable[[object], Tensor] = field(default=lambda out: out)
    prepare: Callable[[nn.Module, torch.device | str, torch.dtype], None] | None = None


def _x(*shape):
    return lambda d, t, padded: ((torch.randn(*shape, device=d, dtype=t),), {})


def _keep(s: int, d) -> Tensor:
    """(B, S) bool, True = real: row 1 has its last 2 positions padded."""
    keep = torch.ones(B, s, dtype=torch.bool, device=d)
    keep[1, -2:] = False
    return keep


def _key_mask(s: int, d, padded: bool) -> dict:
    return {"mask": _keep(s, d)[:, None, None, :]} if padded else {}  # (B, 1, 1, S)


def _self(width: int = C):
    def inputs(d, t, padded):
        return (torch.randn(B, N, width, device=d, dtype=t),), _key_mask(N, d, padded)

    return inputs


def _cross(d, t, padded):
    x, ctx = torch.randn(B, N, C, device=d, dtype=t), torch.randn(B, 7, 6, device=d, dtype=t)
    return (x, ctx), _key_mask(7, d, padded)


def _scored(key_width: int):
    def inputs(d, t, padded):
        q = torch.randn(B, 3, C, device=d, dtype=t)
        v, k = (torch.randn(B, N, w, device=d, dtype=t) for w in (7, key_width))
        return (q, v, k), _key_mask(N, d, padded)

    return inputs


def _pool(d, t, padded):
    x = torch.randn(B, N, C, device=d, dtype=t)
    return (x,), ({"mask": _keep(N, d)} if padded else {})


def _qkv(d, t, padded):
    q, k, v = (torch.randn(B, 2, N, 4, device=d, dtype=t) for _ in range(3))
    return (q, k, v), _key_mask(N, d, padded)


def _qk(d, t, padded):
    return _qkv(d, t, padded)[0][:2], {}


def _lengths(d, t, padded):
    return (N,), {}


def _tokens(vocab: int, n: int, d, padded: bool) -> Tensor:
    """(B, n) ids in [1, vocab); padded: id 0 (pad_id) at the end of row 1."""
    ids = torch.randint(1, vocab, (B, n), device=d)
    if padded:
        ids[1, -2:] = 0
    return ids


def _bert_inputs(d, t, padded):
    ids = _tokens(30, N, d, padded)
    return (ids,), ({"attention_mask": _keep(N, d).long()} if padded else {})


def _gpt_inputs(d, t, padded):
    ids = torch.randint(0, 11, (B, N), device=d)  # every id is a real token
    return (ids,), ({"attention_mask": _keep(N, d)} if padded else {})


def _gpt_step_inputs(d, t, padded):
    """One token over an empty cache: in eval, `GPT`'s module-free step (`gpt_step`)."""
    return (torch.randint(0, 11, (B, 1), device=d),), {"cache": KVCache()}


def _decoder_inputs(d, t, padded):
    x, memory = torch.randn(B, 4, C, device=d, dtype=t), torch.randn(B, N, C, device=d, dtype=t)
    return (x, memory), ({"memory_mask": _keep(N, d)[:, None, None, :]} if padded else {})


def _detr_inputs(d, t, padded):
    src, pos = torch.randn(B, N, C, device=d, dtype=t), torch.randn(B, N, C, device=d, dtype=t)
    return (src, _keep(N, d) if padded else None, pos), {}


def _detr_encoder_inputs(d, t, padded):
    (src, keep, pos), _ = _detr_inputs(d, t, padded)
    return (src,), {"src_key_mask": keep, "pos": pos}


def _detr_decoder_inputs(d, t, padded):
    tgt, memory = torch.randn(B, 3, C, device=d, dtype=t), torch.randn(B, N, C, device=d, dtype=t)
    kw = {"query_pos": torch.randn(1, 3, C, device=d, dtype=t)}
    return (tgt, memory), kw | ({"memory_key_mask": _keep(N, d)} if padded else {})


def _detr_decoder(**fk):
    layer = DecoderBlock(replace(SEQ, dropout=0.0), causal=False, **fk)
    return DetrDecoder([layer], nn.LayerNorm(C, **fk), return_intermediate=True)


def _materialise_lazy(m: nn.Module, d, t) -> None:
    """A lazy MultiHeadAttention infers C from its first input (projections only)."""
    m.heads_qkv(torch.randn(B, N, C, device=d, dtype=t))


BERT = BertConfig(
    vocab_size=30,
    hidden_size=C,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=16,
)
SEQ = TransformerConfig(
    src_vocab=11, tgt_vocab=13, d_model=C, num_heads=2, d_ff=16, encoder_layers=1,
    decoder_layers=1, max_len=16, dropout=0.0,
)  # fmt: skip
LM = TransformerConfig(
    src_vocab=11, tgt_vocab=11, d_model=C, num_heads=2, d_ff=16, decoder_layers=2, max_len=16,
    positions="learned", norm_first=True,
)  # fmt: skip
GPT_CFG = GPTConfig(vocab_size=11, n_layer=2, n_head=2, d_model=C, context=16)
VIT = ViTConfig(image_size=8, patch_size=2, dim=16, depth=1, num_heads=2)
SWIN = SwinConfig(
    image_size=16, patch_size=2, embed_dim=C, depths=(2, 2), num_heads=(2, 2), window_size=4,
    absolute_pos=True,
)  # fmt: skip


def _ff(**fk):
    return FeedForward(C, 16, **fk)


# fmt: off
CASES: list[Case] = [
    Case("mha", MultiHeadAttention, lambda **fk: MultiHeadAttention(C, 2, **fk), _self(), (B, N, C), True),
    Case("mha-cross", MultiHeadAttention, lambda **fk: MultiHeadAttention(C, 2, context_dim=6, **fk), _cross, (B, N, C), True),
    Case("mha-gqa", MultiHeadAttention, lambda **fk: MultiHeadAttention(C, 4, num_kv_heads=2, out_dim=6, **fk), _self(), (B, N, 6), True),
    Case("mha-lazy", MultiHeadAttention, lambda **fk: MultiHeadAttention(None, 2, out_dim=C, **fk), _self(), (B, N, C), True, prepare=_materialise_lazy),
    Case("cached-mha", CachedMultiHeadAttention, lambda **fk: CachedMultiHeadAttention(C, 2, **fk), _self(), (B, N, C), True),
    Case("paper-attention", MultiHeadAttention, lambda **fk: paper_attention(C, 2, **fk), _self(), (B, N, C), True),
    Case("bert-self-attention", PostNormResidual, lambda **fk: bert_self_attention(C, 2, **fk), _self(), (B, N, C), True),
    Case("mha-rotary", MultiHeadAttention, lambda **fk: MultiHeadAttention(C, 2, rotary=RotaryEmbedding(2, **fk), **fk), _self(), (B, N, C), True),
    Case("rotary", RotaryEmbedding, lambda **fk: RotaryEmbedding(4, interleaved=True, **fk), _qk, (B, 2, N, 4), output=lambda o: o[0]),
    Case("alibi", AlibiBias, lambda **fk: AlibiBias(2, **fk), _lengths, (1, 2, N, N)),
    Case("t5-bias", RelativePositionBias, lambda **fk: RelativePositionBias(2, **fk), _lengths, (1, 2, N, N)),
    Case("attend", Attend, lambda **fk: Attend(), _qkv, (B, 2, N, 4), True, output=lambda o: o.out),
    Case("encoder-block", EncoderBlock, lambda **fk: EncoderBlock(C, 2, 16, **fk), _self(), (B, N, C), True),
    Case("feed-forward", FeedForward, _ff, _x(B, N, C), (B, N, C)),
    Case("pre-norm", PreNormResidual, lambda **fk: PreNormResidual(_ff(**fk), nn.LayerNorm(C, **fk)), _x(B, N, C), (B, N, C)),
    Case("post-norm", PostNormResidual, lambda **fk: PostNormResidual(_ff(**fk), nn.LayerNorm(C, **fk)), _x(B, N, C), (B, N, C)),
    Case("learned-pos", LearnedPositionalEmbedding, lambda **fk: LearnedPositionalEmbedding(10, C, **fk), _x(B, N, C), (B, N, C)),
    Case("sinusoidal-pos", SinusoidalPositionalEncoding, lambda **fk: SinusoidalPositionalEncoding(C, 10, **fk), _x(B, N, C), (B, N, C)),
    Case("t2t-attention", T2TAttention, lambda **fk: T2TAttention(9, C, 2, **fk), _self(9), (B, N, C), True),
    Case("additive", AdditiveAttention, lambda **fk: AdditiveAttention(C, hidden=6, **fk), _scored(C), (B, 3, 7), True),
    Case("additive-keras", AdditiveAttention, lambda **fk: AdditiveAttention(C, **fk), _scored(C), (B, 3, 7), True),
    Case("luong", LuongAttention, lambda **fk: LuongAttention(C, key_dim=6, **fk), _scored(6), (B, 3, 7), True),
    Case("attention-pooling", AttentionPooling, lambda **fk: AttentionPooling(C, 6, **fk), _pool, (B, C), True),
    Case("bert", BertEncoder, lambda **fk: BertEncoder(BERT, **fk), _bert_inputs, (B, N, C), True, output=lambda o: o.last_hidden_state),
    Case("bert-classifier", BertClassifier, lambda **fk: BertClassifier(BERT, 3, **fk), _bert_inputs, (B, 3), True),
    Case("transformer", Transformer, lambda **fk: Transformer(SEQ, **fk), lambda d, t, p: ((_tokens(11, N, d, p), _tokens(13, 4, d, p)), {}), (B, 4, 13), True),
    Case("causal-lm", CausalLM, lambda **fk: CausalLM(LM, **fk), lambda d, t, p: ((_tokens(11, N, d, p),), {}), (B, N, 11), True),
    Case("gpt", GPT, lambda **fk: GPT(GPT_CFG, **fk), _gpt_inputs, (B, N, 11), True),
    Case("gpt-step", GPT, lambda **fk: GPT(GPT_CFG, **fk), _gpt_step_inputs, (B, 1, 11)),
    Case("gpt-block", GPTBlock, lambda **fk: GPTBlock(GPT_CFG, **fk), _self(), (B, N, C), True),
    Case("rnn-seq2seq", RNNSeq2Seq, lambda **fk: RNNSeq2Seq(RNNConfig(vocab=13, embed_dim=6, hidden=C), **fk), lambda d, t, p: ((_tokens(13, N, d, p), _tokens(13, 4, d, p)), {}), (B, 4, 13), True),
    Case("universal", UniversalTransformer, lambda **fk: UniversalTransformer(UniversalConfig(vocab=13, d_model=C, num_heads=2, d_ff=16, steps=2, max_len=16), **fk), lambda d, t, p: ((_tokens(13, N, d, p), _tokens(13, 4, d, p)), {}), (B, 4, 13), True, output=lambda o: o.logits),
    Case("decoder-block", DecoderBlock, lambda **fk: DecoderBlock(SEQ, **fk), _decoder_inputs, (B, 4, C), True),
    Case("detr", DetrTransformer, lambda **fk: DetrTransformer(C, 2, 1, 2, 16, 0.0, 3, **fk), _detr_inputs, (1, B, 3, C), True, output=lambda o: o[0]),
    Case("detr-encoder", DetrEncoder, lambda **fk: DetrEncoder([EncoderBlock(C, 2, 16, norm_first=False, **fk)]), _detr_encoder_inputs, (B, N, C), True),
    Case("detr-decoder", DetrDecoder, _detr_decoder, _detr_decoder_inputs, (1, B, 3, C), True),
    Case("patch-embed", PatchEmbed, lambda **fk: PatchEmbed(8, 2, 1, 16, **fk), _x(B, 1, 8, 8), (B, 16, 16)),
    Case("t2t-embed", T2TEmbed, lambda **fk: T2TEmbed(8, 1, 16, ((3, 1), (3, 2)), 8, **fk), _x(B, 1, 8, 8), (B, 16, 16)),
    Case("vit", ViT, lambda **fk: ViT(VIT, **fk), _x(B, 1, 8, 8), (B, 10)),
    Case("vit-mean-learned", ViT, lambda **fk: ViT(replace(VIT, pool="mean", pos="learned"), **fk), _x(B, 1, 8, 8), (B, 10)),
    Case("t2t-vit", ViT, lambda **fk: ViT(ViTConfig(tokens="t2t", dim=16, depth=1, num_heads=2, t2t_chan=8), **fk), _x(B, 1, 8, 8), (B, 10)),
    Case("small-cnn", SmallCNN, lambda **fk: SmallCNN(CNNConfig(widths=(8, 16)), **fk), _x(B, 1, 8, 8), (B, 10)),
    Case("squeeze-excitation", SqueezeExcitation, lambda **fk: SqueezeExcitation(C, 2, **fk), _x(B, C, 5, 5), (B, C, 5, 5)),
    Case("spatial", SpatialAttention, lambda **fk: SpatialAttention(3, **fk), _x(B, C, 5, 5), (B, C, 5, 5)),
    Case("cbam", CBAM, lambda **fk: CBAM(C, 2, 3, **fk), _x(B, C, 5, 5), (B, C, 5, 5)),
    Case("self-attention-2d", SelfAttention2d, lambda **fk: SelfAttention2d(C, reduction=2, gamma_init=0.5, **fk), _x(B, C, 4, 4), (B, C, 4, 4)),
    Case("window-attention", WindowAttention, lambda **fk: WindowAttention(C, 2, 4, shift=2, **fk), _x(B, 6, 6, C), (B, 6, 6, C)),
    Case("swin-block", SwinBlock, lambda **fk: SwinBlock(C, 2, 4, shift=2, **fk), _x(B, 6, 6, C), (B, 6, 6, C)),
    Case("patch-merging", PatchMerging, lambda **fk: PatchMerging(C, **fk), _x(B, 5, 5, C), (B, 3, 3, 2 * C)),
    Case("swin-stage", SwinStage, lambda **fk: SwinStage(C, 2, 2, 4, grid=(6, 6), downsample=True, **fk), _x(B, 6, 6, C), (B, 3, 3, 2 * C)),
    Case("swin", SwinModel, lambda **fk: SwinModel(SWIN, **fk), _x(B, 3, 16, 16), (B, 2 * C)),
]
# fmt: on

IDS = [c.id for c in CASES]


def build(case: Case, **fk) -> nn.Module:
    """The module of `case`, lazy parameters materialised on fk's device and dtype."""
    m = case.build(**fk)
    if case.prepare is not None:
        d = fk.get("device") or torch.get_default_device()
        case.prepare(m, d, fk.get("dtype") or torch.get_default_dtype())
    return m


def run(case: Case, m: nn.Module, device, dtype, *, padded: bool = False) -> Tensor:
    """Forward on inputs of `device` and `dtype` (token ids stay integer)."""
    args, kwargs = case.inputs(device, dtype, padded)
    return case.output(m(*args, **kwargs))
