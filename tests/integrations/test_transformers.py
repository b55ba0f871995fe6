"""attnkit as transformers' attention backend: parity with eager for every family, per path.

Random small models are saved to a temporary folder and loaded back by path, like a user's
checkpoint, once with ``attn_implementation="attnkit"`` and once with ``"eager"``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
hf = pytest.importorskip("attnkit.integrations.transformers")

import attnkit  # noqa: E402
from attnkit.models import default_checkpoint  # noqa: E402

C = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
NO_DROP = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TEXT = {
    "bert": lambda: transformers.BertConfig(vocab_size=99, **C, **NO_DROP),
    "roberta": lambda: transformers.RobertaConfig(vocab_size=99, **C, **NO_DROP),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=99,
        dim=32,
        n_layers=2,
        n_heads=4,
        hidden_dim=64,
        dropout=0.0,
        attention_dropout=0.0,
    ),
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=99,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=0,
    ),
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=99, **C, num_key_value_heads=2, pad_token_id=0
    ),  # grouped-query attention: 4 query heads share 2 key/value heads
}
DECODERS = ("gpt2", "llama")
VISION = {
    "vit": lambda: transformers.ViTConfig(image_size=16, patch_size=4, **C, **NO_DROP),
    "swin": lambda: transformers.SwinConfig(
        image_size=16,
        patch_size=2,
        embed_dim=16,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=4,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    ),
}


def _load_pair(tmp_path_factory, config_or_path, auto=transformers.AutoModel, **overrides):
    """(attnkit model, eager model) with the same weights, loaded by path."""
    if isinstance(config_or_path, transformers.PretrainedConfig):
        torch.manual_seed(0)
        path = tmp_path_factory.mktemp("ckpt")
        auto.from_config(config_or_path).save_pretrained(path)
    else:
        path = config_or_path
    fast = auto.from_pretrained(path, attn_implementation="attnkit", **overrides).eval()
    slow = auto.from_pretrained(path, attn_implementation="eager", **overrides).eval()
    return fast, slow


@pytest.fixture(scope="module", params=[*TEXT, "minilm"])
def text_pair(request, tmp_path_factory):
    if request.param == "minilm":
        # the real checkpoint, its dropout off so that training-mode gradients compare
        return request.param, _load_pair(tmp_path_factory, default_checkpoint(), **NO_DROP)
    auto = (
        transformers.AutoModelForCausalLM if request.param in DECODERS else transformers.AutoModel
    )
    return request.param, _load_pair(tmp_path_factory, TEXT[request.param](), auto)


def _text_batch(family: str):
    """ids (2, 7) and a 0/1 mask: right padding for encoders, left padding for decoders."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 90, (2, 7), generator=g)
    mask = torch.ones(2, 7, dtype=torch.long)
    if family in DECODERS:
        mask[1, :3] = 0
    else:
        mask[1, 4:] = 0
    return ids, mask


def _hidden(model, ids, mask, **kw):
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, **kw)
    return out.hidden_states[-1], out


def _loss(hidden):
    """A fixed random projection: the squared norm of a LayerNorm output is constant."""
    w = torch.randn(hidden.shape[-1], generator=torch.Generator().manual_seed(3))
    return (hidden @ w).sum()


# A key bias adds q·b_k, the same to every key of a row, which softmax cancels: its true
# gradient is 0 and both float32 gradients are rounding noise, held to the model's scale.
_KEY_BIAS = re.compile(r"(key|k_lin|k_proj)\.bias$")


def _assert_gradients_close(got: dict, want: dict, rtol: float = 1e-5) -> None:
    assert got.keys() == want.keys() and got
    scale = torch.stack([g.norm() for g in want.values()]).max()
    for name, ref in want.items():
        ref_scale = scale if _KEY_BIAS.search(name) else ref.norm()
        assert (got[name] - ref).norm() <= rtol * ref_scale + 1e-7, name


def _float64_maps(eager_model, ids, mask):
    """eager's maps computed in float64 (a copy of the model): the truth float32 is held to."""
    import copy

    model = copy.deepcopy(eager_model).double()
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    return [a.float() for a in out.attentions]


def test_importing_attnkit_does_not_import_transformers():
    code = "import sys, attnkit, attnkit.integrations; print('transformers' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


def test_the_backend_is_registered():
    assert transformers.AttentionInterface()["attnkit"] is hf.attnkit_attention_forward
    assert transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["attnkit"] is hf.attnkit_mask


def test_text_hidden_states_and_maps_equal_eager(text_pair):
    family, (fast, slow) = text_pair
    assert fast.config._attn_implementation == "attnkit"
    ids, mask = _text_batch(family)
    with torch.no_grad():
        got, _ = _hidden(fast, ids, mask)
        with attnkit.record_attention(fast) as rec:
            _hidden(fast, ids, mask)
        want, eager = _hidden(slow, ids, mask, output_attentions=True)
    valid = mask.bool()  # decoders' left-padded query rows see nothing: attnkit gives 0 there
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)
    assert len(rec) == len(eager.attentions) == fast.config.num_hidden_layers
    assert ".0." in rec.names[0] and ".1." in rec.names[1]  # in the order the layers ran
    truth = _float64_maps(slow, ids, mask) if family == "minilm" else eager.attentions
    for name, ref, exact in zip(rec.names, eager.attentions, truth, strict=True):
        rows = valid[:, None, :, None].expand_as(ref)
        if family == "minilm":
            # Six layers of real weights: eager's own float32 maps drift up to 2.1e-6 from the
            # float64 truth by the last layer (measured), so each is held to that truth.
            own = (ref - exact)[rows].abs().max().item()
            assert (rec[name] - exact)[rows].abs().max().item() <= 2 * own + 1e-6, name
        else:
            torch.testing.assert_close(rec[name][rows], ref[rows], atol=1e-6, rtol=0)
        if family in DECODERS:  # part of the causal picture: nothing above the diagonal
            assert rec[name].triu(diagonal=1).abs().max() == 0


def test_recorded_names_are_the_models_own_module_paths(text_pair):
    family, (fast, _) = text_pair
    ids, mask = _text_batch(family)
    with torch.no_grad(), attnkit.record_attention(fast) as rec:
        fast(input_ids=ids, attention_mask=mask)
    paths = dict(fast.named_modules())
    assert all(name in paths for name in rec.names)
    if family in ("bert", "minilm"):
        assert rec.names[0] == "encoder.layer.0.attention.self"


def test_text_gradients_equal_eager_in_training_mode(text_pair):
    family, (fast, slow) = text_pair
    ids, mask = _text_batch(family)
    grads = []
    for model in (fast, slow):
        model.train()
        model.zero_grad()
        hidden, _ = _hidden(model, ids, mask)
        _loss(hidden[mask.bool()]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.eval()
    _assert_gradients_close(*grads)


def test_recording_with_gradient_checkpointing_lists_each_layer_once(tmp_path_factory):
    """transformers' checkpointed layers run again in the backward pass; what they compute
    there is not a call of the user's and is not recorded twice."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt")
    transformers.AutoModel.from_config(TEXT["bert"]()).save_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="attnkit")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids, mask = _text_batch("bert")
    with attnkit.record_attention(model) as rec:
        hidden, _ = _hidden(model, ids, mask)
        _loss(hidden[mask.bool()]).backward()
    assert len(rec) == model.config.num_hidden_layers
    assert all(len(maps) == 1 for maps in rec.calls.values())


@pytest.mark.parametrize("family", DECODERS)
def test_generation_with_the_cache_gives_eager_tokens(family, tmp_path_factory):
    fast, slow = _load_pair(tmp_path_factory, TEXT[family](), transformers.AutoModelForCausalLM)
    ids, mask = _text_batch(family)
    kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, attention_mask=mask)
    got = fast.generate(ids, **kw)
    want = slow.generate(ids, **kw)
    assert got.shape == (2, 15)
    assert torch.equal(got, want)


def test_calls_outside_the_recording_keep_the_fast_path(text_pair, monkeypatch):
    family, (fast, _) = text_pair
    asked = []
    real = hf.attention
    monkeypatch.setattr(
        hf, "attention", lambda *a, **k: asked.append(k["need_weights"]) or real(*a, **k)
    )
    ids, mask = _text_batch(family)
    with torch.no_grad():
        fast(input_ids=ids, attention_mask=mask)
        with attnkit.record_attention(fast):
            fast(input_ids=ids, attention_mask=mask)
        fast(input_ids=ids, attention_mask=mask)
    layers = fast.config.num_hidden_layers
    assert asked == [False] * layers + [True] * layers + [False] * layers


@pytest.fixture(scope="module", params=list(VISION))
def vision_pair(request, tmp_path_factory):
    return request.param, _load_pair(tmp_path_factory, VISION[request.param]())


def test_vision_hidden_states_maps_and_gradients_equal_eager(vision_pair):
    _family, (fast, slow) = vision_pair
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = fast(pixel_values=pixels).last_hidden_state
        with attnkit.record_attention(fast) as rec:
            fast(pixel_values=pixels)
        eager = slow(pixel_values=pixels, output_attentions=True)
        per_module = _eager_module_maps(slow, rec.names, pixel_values=pixels)
    torch.testing.assert_close(got, eager.last_hidden_state, atol=1e-5, rtol=1e-5)
    # Swin's output_attentions holds only the last block of each stage; the record holds
    # every block, each compared with what that eager module returned.
    assert len(rec) == len(per_module) >= len(eager.attentions) > 0
    for name in rec.names:
        torch.testing.assert_close(rec[name], per_module[name], atol=1e-6, rtol=0)
    for ref in eager.attentions:
        assert any(
            rec[n].shape == ref.shape and torch.allclose(rec[n], ref, atol=1e-6, rtol=0)
            for n in rec.names
        )
    grads = []
    for model in (fast, slow):
        model.train()
        model.zero_grad()
        _loss(model(pixel_values=pixels).last_hidden_state).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.eval()
    _assert_gradients_close(*grads)


def _eager_module_maps(model, names, **inputs):
    """{path: the weights the eager module at `path` returned}, by forward hooks."""
    maps, modules = {}, dict(model.named_modules())
    handles = [
        modules[n].register_forward_hook(lambda m, a, out, n=n: maps.__setitem__(n, out[1]))
        for n in names
    ]
    try:
        model(output_attentions=True, **inputs)
    finally:
        for h in handles:
            h.remove()
    return maps


def _module_and_qkv(heads=4, kv_heads=4):
    module = torch.nn.Module()
    module.is_causal = False
    q = torch.randn(1, heads, 5, 8)
    k, v = torch.randn(2, 1, kv_heads, 5, 8).unbind(0)
    return module, q, k, v


def test_attention_sinks_are_refused_by_name():
    module, q, k, v = _module_and_qkv()
    with pytest.raises(ValueError, match="s_aux"):
        hf.attnkit_attention_forward(module, q, k, v, None, s_aux=torch.zeros(4))


def test_softcap_caps_the_scaled_scores_before_the_mask():
    """Gemma 2's eager: s = scaling·q·kᵀ, s = cap·tanh(s / cap), then the mask, softmax."""
    module, q, k, v = _module_and_qkv()
    q, k, v = (t.double() * 4 for t in (q, k, v))  # scores of order 10: the cap matters
    mask = torch.rand(1, 1, 5, 5, generator=torch.Generator().manual_seed(6)) > 0.3
    mask[..., 0] = True
    out, _ = hf.attnkit_attention_forward(module, q, k, v, mask, scaling=0.3, softcap=2.0)
    s = 2.0 * torch.tanh(0.3 * q @ k.transpose(-1, -2) / 2.0)
    p = torch.softmax(s.masked_fill(~mask, -torch.inf), dim=-1)
    torch.testing.assert_close(out, (p @ v).transpose(1, 2), atol=1e-12, rtol=0)


def test_float_mask_is_additive_and_gqa_needs_no_repeat():
    module, q, k, v = _module_and_qkv(heads=4, kv_heads=2)
    bias = torch.randn(1, 1, 5, 5)
    out, weights = hf.attnkit_attention_forward(module, q, k, v, bias, scaling=0.3)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # (1, 4, 5, 8)
    p = torch.softmax(0.3 * q @ kr.transpose(-1, -2) + bias, dim=-1)
    assert weights is None and out.shape == (1, 5, 4, 8)  # (B, N, H, D)
    torch.testing.assert_close(out, (p @ vr).transpose(1, 2), atol=1e-6, rtol=1e-5)


def test_docs_code_blocks_run():
    from tests.test_readme import run_python_blocks

    doc = Path(__file__).resolve().parents[2] / "docs" / "en" / "guides" / "transformers.md"
    ns = run_python_blocks(doc)
    assert ns["rec"].names == ["transformer.h.0.attn", "transformer.h.1.attn"]


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_load_checkpoint_gives_maps_for_a_text_and_reports_unknown_pieces(family, tmp_path):
    """The library side of `explain --checkpoint`: any family, the tokenizer in the folder."""
    import shutil

    ckpt = default_checkpoint()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(ckpt / name, tmp_path / name)
    config = TEXT[family]()
    config.vocab_size = 30522  # MiniLM's WordPiece vocabulary
    auto = transformers.AutoModelForCausalLM if family in DECODERS else transformers.AutoModel
    torch.manual_seed(0)
    auto.from_config(config).save_pretrained(tmp_path)
    model, tokenizer = hf.load_checkpoint(tmp_path)
    assert model.config._attn_implementation == "attnkit" and not model.training
    got = hf.text_attention(model, tokenizer, "the cat ☃ sat")
    assert got.unknown == ["☃"] and "[UNK]" in got.tokens
    assert got.decoder == (family in DECODERS)
    assert len(got.maps) == len(got.names) == 2
    n = len(got.tokens)
    for m in got.maps:
        assert m.shape == (4, n, n)
        torch.testing.assert_close(m.sum(-1), torch.ones(4, n))
        assert (m.triu(diagonal=1).abs().max() == 0) == (family in DECODERS)


def test_load_checkpoint_refuses_a_folder_without_a_model(tmp_path):
    with pytest.raises(ValueError, match=r"config\.json"):
        hf.load_checkpoint(tmp_path)
