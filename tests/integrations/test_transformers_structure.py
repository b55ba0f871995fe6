"""The attnkit backend of transformers receives descriptions, not dense masks: sliding windows
(alternating layers included), Gemma 2's soft-capping and packed sequences.

Equalities: attnkit vs transformers' eager and sdpa per family (float32, padded batches,
windows shorter than the sequence, outputs, gradients and recorded maps); each packed
document vs the same document run alone (float64, outputs and parameter gradients); the
mask interface vs transformers' own ``sdpa_mask`` on every pattern it reads or leaves dense.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
hf = pytest.importorskip("attnkit.integrations.transformers")

from transformers import masking_utils as mu  # noqa: E402

import attnkit  # noqa: E402
from attnkit.functional.structured import StructuredMask  # noqa: E402
from attnkit.models import default_checkpoint  # noqa: E402
from tests.integrations.test_transformers import _assert_gradients_close, _loss  # noqa: E402

C = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
W = 3  # every window below is shorter than the sequences it is used on
GQA = dict(num_key_value_heads=2, pad_token_id=0)
GEMMA = dict(head_dim=8, sliding_window=W, layer_types=["sliding_attention", "full_attention"])
# Soft-capping at 0.5 with scores of order 1 (scale 1, weights drawn with std 0.3): the cap
# changes the outputs (tested), which it would not with the tiny scores of the defaults.
CAPPED = dict(attn_logit_softcapping=0.5, query_pre_attn_scalar=1, initializer_range=0.3)
DECODERS = {
    "llama": lambda: transformers.LlamaConfig(vocab_size=99, **C, **GQA),
    "mistral": lambda: transformers.MistralConfig(vocab_size=99, **C, **GQA, sliding_window=W),
    # layer 0 full, layer 1 sliding (max_window_layers=1)
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=99, **C, **GQA, use_sliding_window=True, sliding_window=W, max_window_layers=1
    ),
    "gemma2": lambda: transformers.Gemma2Config(vocab_size=99, **C, **GQA, **GEMMA, **CAPPED),
    "gemma3": lambda: transformers.Gemma3TextConfig(vocab_size=99, **C, **GQA, **GEMMA),
    # chunked attention (chunks of W) in layer 0, full in layer 1
    "llama4": lambda: transformers.Llama4TextConfig(
        vocab_size=99,
        **C,
        **GQA,
        head_dim=8,
        intermediate_size_mlp=64,
        num_local_experts=1,
        attention_chunk_size=W,
        layer_types=["chunked_attention", "full_attention"],
    ),
}
WINDOWED = ("mistral", "qwen2", "gemma2", "gemma3", "llama4")
BERT = lambda: transformers.BertConfig(  # noqa: E731
    vocab_size=99, **C, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
)


def _models(family: str, impls: tuple[str, ...]) -> list:
    """One random model per attention implementation, with the same weights, in eval mode."""
    if family == "minilm":
        path, auto = default_checkpoint(), transformers.AutoModel
        return [auto.from_pretrained(path, attn_implementation=i).eval() for i in impls]
    config = BERT if family == "bert" else DECODERS[family]
    auto = transformers.AutoModel if family == "bert" else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    first = auto.from_config(config(), attn_implementation=impls[0])
    models = [first] + [auto.from_config(config(), attn_implementation=i) for i in impls[1:]]
    for m in models[1:]:
        m.load_state_dict(first.state_dict())
    return [m.eval() for m in models]


def _hidden(model, **inputs):
    return model(**inputs, output_hidden_states=True).hidden_states[-1]


@pytest.fixture
def masks_seen(monkeypatch):
    """The `mask` of every `attention` call the backend makes."""
    seen, real = [], hf.attention
    monkeypatch.setattr(hf, "attention", lambda *a, **k: seen.append(k["mask"]) or real(*a, **k))
    return seen


def _no_dense_n_by_s(masks: list) -> bool:
    """No mask arrived as an N x S tensor: descriptions, none, or (B, 1, 1, S) padding."""
    return bool(masks) and all(
        m is None or isinstance(m, StructuredMask) or m.shape[-2] == 1 for m in masks
    )


# ------------------------------------------------------------------ families vs eager and sdpa


def _padded_batch(n: int = 9):
    """ids (2, n), the second row left-padded by 3 (so every window is shorter than a row)."""
    ids = torch.randint(3, 90, (2, n), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, :3] = 0
    return ids, mask


@pytest.mark.parametrize("family", WINDOWED)
def test_windowed_families_equal_eager_and_sdpa_with_no_dense_mask(family, masks_seen):
    impls = ("attnkit", "eager") if family == "gemma2" else ("attnkit", "eager", "sdpa")
    fast, *others = _models(family, impls)  # sdpa refuses Gemma 2's softcap
    ids, mask = _padded_batch()
    valid = mask.bool()
    with torch.no_grad():
        got = _hidden(fast, input_ids=ids, attention_mask=mask)
        for other in others:
            want = _hidden(other, input_ids=ids, attention_mask=mask)
            torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)
    assert _no_dense_n_by_s(masks_seen)
    assert any(isinstance(m, StructuredMask) for m in masks_seen)  # the window layers
    with torch.no_grad(), attnkit.record_attention(fast) as rec:  # maps from the descriptions
        fast(input_ids=ids, attention_mask=mask)
        maps = others[0](input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    rows = valid[:, None, :, None]
    for got_map, want_map in zip(rec.layers(), maps, strict=True):
        assert (got_map - want_map).masked_fill(~rows, 0).abs().max() <= 1e-6
    grads = []
    for model in (fast, others[0]):
        model.train()
        model.zero_grad()
        _loss(_hidden(model, input_ids=ids, attention_mask=mask)[valid]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.eval()
    _assert_gradients_close(*grads)


def test_gemma2_softcap_changes_the_outputs():
    """The soft-capped equality above means something: without the cap, eager differs."""
    fast, eager = _models("gemma2", ("attnkit", "eager"))
    config = DECODERS["gemma2"]()
    config.attn_logit_softcapping = None
    uncapped = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    uncapped.load_state_dict(eager.state_dict())
    ids, mask = _padded_batch()
    valid = mask.bool()
    with torch.no_grad():
        got = _hidden(fast, input_ids=ids, attention_mask=mask)[valid]
        want = _hidden(uncapped.eval(), input_ids=ids, attention_mask=mask)[valid]
    assert (got - want).abs().max() > 0.1


@pytest.mark.parametrize("family", ["mistral", "gemma2", "llama4"])
def test_generation_past_the_window_gives_eager_tokens(family):
    fast, eager = _models(family, ("attnkit", "eager"))
    ids, mask = _padded_batch()
    kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, attention_mask=mask)
    got = fast.generate(ids, **kw)
    assert got.shape == (2, 15)
    assert torch.equal(got, eager.generate(ids, **kw))


# ------------------------------------------------------------------ packing


LENGTHS = [5, 7, 4]  # each longer than the window W


def _packed(how: str):
    """(inputs of one packed row, the documents' ids) as a padding-free collator gives them."""
    g = torch.Generator().manual_seed(2)
    docs = [torch.randint(3, 90, (n,), generator=g) for n in LENGTHS]
    collate = transformers.DataCollatorWithFlattening(
        return_flash_attn_kwargs=how != "position_ids"
    )
    batch = collate([{"input_ids": d.tolist()} for d in docs])
    batch.pop("labels")
    if how == "cu_seq_lens only":  # no restarting positions: only the boundaries say it
        batch.pop("position_ids")
    return batch, docs


@pytest.fixture(scope="module")
def float64_models():
    """family -> its attnkit model in float64, built once per module."""
    built: dict = {}

    def get(family: str):
        if family not in built:
            built[family] = _models(family, ("attnkit",))[0].double()
        return built[family]

    return get


PACKING = [  # encoders have no cache: "no cache" is "position_ids" for them
    ("minilm", "position_ids"),
    *((f, how) for f in ("bert", *DECODERS) for how in ("position_ids", "collator", "no cache")),
]
PACKING.remove(("bert", "no cache"))
# Llama 4's layers do not pass position ids to their attention: with a cache, nothing tells
# any backend of the packing (the collator's cu_seq_lens do; the guide says so).
PACKING.remove(("llama4", "position_ids"))


@pytest.mark.parametrize(("family", "how"), PACKING)
def test_each_packed_document_equals_it_alone(family, how, float64_models, masks_seen):
    """`position_ids`: restarting positions alone, in a decoder's default eval mode (a cache:
    transformers then does not see the packing in its mask); `collator`: what
    DataCollatorWithFlattening(return_flash_attn_kwargs=True) gives (positions and
    cu_seq_lens_q/k); `no cache`: use_cache=False, where transformers' mask holds the
    documents."""
    model = float64_models(family)
    batch, docs = _packed("collator" if how == "collator" else "position_ids")
    extra = {"use_cache": False} if how == "no cache" else {}
    packed = _hidden(model, **batch, **extra)[0]  # (N, C)
    alone = [_hidden(model, input_ids=d[None], **extra)[0] for d in docs]
    torch.testing.assert_close(packed, torch.cat(alone), atol=1e-10, rtol=1e-10)
    assert _no_dense_n_by_s(masks_seen)
    w = torch.randn(
        packed.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(3)
    )
    want = _param_grads(model, sum((h @ w).sum() for h in alone))
    got = _param_grads(model, (_hidden(model, **batch, **extra)[0] @ w).sum())
    assert got.keys() == want.keys()
    scale = max(g.norm() for g in want.values())  # key biases' true gradient is 0: noise
    for name, ref in want.items():
        # Gemma's RMSNorm computes in float32 whatever the model's dtype (x.float()), so the
        # gradients of its weights are float32 sums: 1e-7 apart (measured); the rest float64.
        rtol = 1e-6 if family.startswith("gemma") and name.endswith("norm.weight") else 1e-10
        assert (got[name] - ref).norm() <= rtol * ref.norm() + 1e-13 * scale, name


def _param_grads(model, loss) -> dict:
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in params], allow_unused=True)
    return {n: g for (n, _), g in zip(params, grads, strict=True) if g is not None}


def test_cu_seq_lens_alone_separate_the_documents():
    """Boundaries without restarting positions: the attention is per document (the rotary
    positions then run on across the row, so the check is on the attention call)."""
    module = torch.nn.Module()
    module.is_causal = True
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 1, 4, 16, 8, dtype=torch.float64, generator=g).unbind(0)
    cu = torch.tensor([0, 5, 12, 16], dtype=torch.int32)
    out, _ = hf.attnkit_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        want = attnkit.attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], causal=True).out
        torch.testing.assert_close(out[:, a:b], want.transpose(1, 2), atol=1e-12, rtol=0)


def _cu(q, k=None) -> dict:
    k = q if k is None else k
    return dict(cu_seq_lens_q=torch.tensor(q), cu_seq_lens_k=torch.tensor(k))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (_cu([0, 3, 7], [0, 4, 7]), "equal"),
        (_cu([0.0, 7.0]), "integer"),
        (_cu([0, 9]), "at most"),
        (_cu([0, 5, 3, 7]), "rise"),
        (dict(cu_seq_lens_q=torch.tensor([0, 7])), "cu_seq_lens_k"),
    ],
)
def test_bad_cu_seq_lens_are_refused_by_name(kwargs, match):
    module = torch.nn.Module()
    q = k = v = torch.randn(1, 2, 7, 4)
    with pytest.raises(ValueError, match=match):
        hf.attnkit_attention_forward(module, q, k, v, None, **kwargs)


def test_cu_seq_lens_need_one_flattened_row():
    module = torch.nn.Module()
    q = k = v = torch.randn(2, 2, 7, 4)
    with pytest.raises(ValueError, match="B=2"):
        hf.attnkit_attention_forward(module, q, k, v, None, **_cu([0, 3, 7]))


# ------------------------------------------------------------------ the mask interface


_POS = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7, 8]])  # row 0 packed
_DOCS = mu.find_packed_sequence_indices(_POS)
_SAME_DOC = mu.packed_sequence_mask_function(_DOCS)
PATTERNS = {  # name: (mask function, causal layer, read as a description)
    "causal": (mu.causal_mask_function, True, True),
    "window": (mu.sliding_window_causal_mask_function(W), True, True),
    "bidirectional": (mu.bidirectional_mask_function, False, True),
    "bidirectional window": (mu.sliding_window_bidirectional_mask_function(2), False, True),
    "packed": (
        mu.and_masks(
            mu.remap_positions_for_packed_sequence(mu.causal_mask_function, _POS), _SAME_DOC
        ),
        True,
        True,
    ),
    "packed window": (
        mu.and_masks(
            mu.remap_positions_for_packed_sequence(mu.sliding_window_causal_mask_function(2), _POS),
            _SAME_DOC,
        ),
        True,
        True,
    ),
    "chunked": (mu.chunked_causal_mask_function(3, torch.tensor([0, 2])), True, True),
    "packed chunked": (
        mu.and_masks(
            mu.remap_positions_for_packed_sequence(
                mu.chunked_causal_mask_function(2, torch.zeros(2, dtype=torch.long)), _POS
            ),
            _SAME_DOC,
        ),
        True,
        True,
    ),
    "or overlay": (mu.or_masks(mu.causal_mask_function, lambda b, h, q, kv: kv == 0), True, False),
    "and a user's": (
        mu.and_masks(mu.causal_mask_function, lambda b, h, q, kv: kv != 2),
        True,
        False,
    ),
}
PADDING = {
    "none": None,
    "left": torch.tensor([[1] * 9, [0] * 3 + [1] * 6]),
    "right": torch.tensor([[1] * 9, [1] * 6 + [0] * 3]),
    "holes": torch.tensor([[1] * 9, [1, 0, 1, 1, 0, 1, 1, 1, 1]]),
}
# (N, S, q_offset, kv_offset): no cache; queries after a cache; a window's cache that dropped
# its first keys; a static cache longer than the keys seen (not bottom-right aligned)
SIZES = [(9, 9, 0, 0), (4, 9, 5, 0), (3, 6, 6, 3), (4, 9, 3, 0)]


CASES = [  # transformers detects packing only without a cache: packed patterns at (9, 9, 0, 0)
    (pattern, padding, sizes)
    for pattern in PATTERNS
    for padding in PADDING
    for sizes in SIZES
    if not pattern.startswith("packed") or sizes == SIZES[0]
]


@pytest.mark.parametrize(("pattern", "padding", "sizes"), CASES, ids=str)
def test_the_mask_interface_means_what_sdpa_mask_means(pattern, padding, sizes):
    fn, causal_layer, described = PATTERNS[pattern]
    n, s, q_offset, kv_offset = sizes
    pad = PADDING[padding]
    bidirectional = not causal_layer
    kw = dict(
        batch_size=2, q_length=n, kv_length=s, q_offset=q_offset, kv_offset=kv_offset,
        mask_function=fn, attention_mask=None if pad is None else pad.bool(),
        local_size=2 if pattern == "bidirectional window" else None,
    )  # fmt: skip
    got = hf.attnkit_mask(**kw, allow_is_bidirectional_skip=bidirectional)
    want = mu.sdpa_mask(**kw, allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    module = torch.nn.Module()
    module.is_causal = causal_layer
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, n, 8, dtype=torch.float64, generator=g)
    k, v = torch.randn(2, 2, 2, s, 8, dtype=torch.float64, generator=g).unbind(0)
    out, _ = hf.attnkit_attention_forward(module, q, k, v, got)
    ref = attnkit.attention(q, k, v, mask=want, backend="reference").out.transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    dense = isinstance(got, torch.Tensor) and got.shape[-2] == n and got.stride(-2) != 0
    assert dense != described


@pytest.mark.parametrize(
    "how",
    [
        dict(q_offset=torch.tensor(5)),  # a static cache's offset, held in a tensor
        dict(q_offset=5, allow_is_causal_skip=False),  # the model concatenates the mask
    ],
    ids=["tensor offset", "asked for a tensor"],
)
def test_the_dense_mask_where_a_description_does_not_fit(how):
    kw = dict(batch_size=1, q_length=4, kv_length=9, kv_offset=0)
    kw["mask_function"] = mu.sliding_window_causal_mask_function(W)
    got = hf.attnkit_mask(**kw, **how)
    want = mu.sdpa_mask(**kw, q_offset=5, allow_is_causal_skip=False)
    assert isinstance(got, torch.Tensor) and torch.equal(got, want)
