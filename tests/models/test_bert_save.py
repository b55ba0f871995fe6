"""BertEncoder.save_pretrained / from_pretrained(**overrides) / gradient checkpointing /
resize_token_embeddings, against transformers.

Outputs are compared on real tokens of a padded batch (padded query rows are ignored).
"""

from __future__ import annotations

import json

import pytest
import torch

from attnkit.models import BertConfig, BertEncoder, Tokenizer, default_checkpoint
from attnkit.models import checkpoint as ckpt_module
from tests.models.tiny import TINY

transformers = pytest.importorskip("transformers")

SAVE_TOL = 1e-6  # issue 21: both loaders give equal outputs to 1e-6 (float64 here)
# float32, two implementations (SDPA vs eager): 6-layer MiniLM measured 1.9e-6
F32_TOL = 1e-5


def _batch(vocab: int = TINY["vocab_size"]):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (3, 11), generator=g)  # (B, N)
    keep = torch.ones_like(ids)
    keep[1, 7:] = 0
    keep[2, 3:] = 0
    types = (torch.arange(11) >= 5).long().expand(3, 11)
    ids = ids.masked_fill(keep == 0, 0)
    return ids, keep, types


def _max_err(a, b, keep):
    return float((a - b)[keep.bool()].abs().max())


def _check_against_hf(ours: BertEncoder, folder, batch, pooler: bool = True):
    """transformers.AutoModel and BertEncoder both load `folder` and agree with `ours`:
    ours and its reload bit for bit; transformers to SAVE_TOL in float64 (where only a
    wrong weight could differ) and to F32_TOL in float32 (two implementations' rounding)."""
    ids, keep, types = batch
    theirs = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager")
    assert type(theirs).__name__ == "BertModel"
    reloaded = BertEncoder.from_pretrained(folder)
    with torch.no_grad():
        a = ours.eval()(ids, keep, types)
        b = theirs.eval()(input_ids=ids, attention_mask=keep, token_type_ids=types)
        c = reloaded(ids, keep, types)
        a64 = BertEncoder.from_pretrained(folder, dtype=torch.float64)(ids, keep, types)
        b64 = theirs.double()(input_ids=ids, attention_mask=keep, token_type_ids=types)
    assert torch.equal(a.last_hidden_state, c.last_hidden_state)  # same weights, same code
    assert _max_err(a.last_hidden_state, b.last_hidden_state, keep) <= F32_TOL
    assert _max_err(a64.last_hidden_state, b64.last_hidden_state, keep) <= SAVE_TOL
    if pooler:
        assert torch.equal(a.pooler_output, c.pooler_output)
        assert float((a.pooler_output - b.pooler_output).abs().max()) <= F32_TOL
        assert float((a64.pooler_output - b64.pooler_output).abs().max()) <= SAVE_TOL
    else:
        assert reloaded.pooler is None
    return b.last_hidden_state


@pytest.mark.parametrize("pooler", [True, False])
def test_random_init_round_trip(tmp_path, pooler):
    torch.manual_seed(0)
    ours = BertEncoder(BertConfig(**TINY), pooler=pooler)
    folder = ours.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["model_type"] == "bert"
    assert config["hidden_size"] == 32 and config["dtype"] == "float32"
    _check_against_hf(ours, folder, _batch(), pooler)


def test_transformers_weights_go_through_us_and_back(tmp_path):
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**TINY))
    model.save_pretrained(tmp_path / "hf")
    ours = BertEncoder.from_pretrained(tmp_path / "hf")
    ours.save_pretrained(tmp_path / "ours")
    from safetensors.torch import load_file

    theirs = {k: v for k, v in model.state_dict().items() if not k.endswith("_ids")}
    saved = load_file(tmp_path / "ours" / "model.safetensors")
    assert saved.keys() == theirs.keys()
    assert all(torch.equal(saved[k], theirs[k]) for k in theirs)


def test_embedded_minilm_round_trip(tmp_path):
    ckpt = default_checkpoint()
    ours = BertEncoder.from_pretrained(ckpt)
    folder = ours.save_pretrained(tmp_path / "minilm")
    for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (ckpt / name).read_bytes()
    sentences = ["The animal didn't cross the street because it was too tired.", "Hi there"]
    enc = Tokenizer.from_pretrained(folder).encode_batch(sentences)
    assert torch.equal(
        enc.input_ids, Tokenizer.from_pretrained(ckpt).encode_batch(sentences).input_ids
    )
    assert enc.attention_mask[1].sum() < enc.attention_mask[0].sum()  # padded
    batch = (enc.input_ids, enc.attention_mask, enc.token_type_ids)
    from_saved = _check_against_hf(ours, folder, batch)
    original = transformers.AutoModel.from_pretrained(str(ckpt), attn_implementation="eager")
    with torch.no_grad():
        expected = original.eval()(**enc.model_inputs()).last_hidden_state
    assert torch.equal(from_saved, expected)  # transformers sees the very same model


def test_saving_with_a_tokenizer_writes_its_files(tmp_path):
    torch.manual_seed(0)
    ours = BertEncoder(BertConfig(**{**TINY, "vocab_size": 30522}))
    tok = Tokenizer.from_pretrained(default_checkpoint(), max_length=40)
    folder = ours.save_pretrained(tmp_path / "saved", tokenizer=tok)
    again = Tokenizer.from_pretrained(folder)
    assert again.max_length == 40 and "model_max_length" in again.limit_source
    text = "Attention is all you need."
    assert torch.equal(again.encode(text).input_ids, tok.encode(text).input_ids)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert theirs(text)["input_ids"] == tok.encode(text).input_ids[0].tolist()
    assert theirs.model_max_length == 40


def test_save_is_all_or_nothing(tmp_path, monkeypatch):
    torch.manual_seed(0)
    ours = BertEncoder(BertConfig(**TINY))
    real = ckpt_module.atomic_write_bytes
    calls = []

    def fail_on_second(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(path, data)

    monkeypatch.setattr(ckpt_module, "atomic_write_bytes", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        ours.save_pretrained(tmp_path / "new")
    assert list(tmp_path.iterdir()) == []  # no folder, no staging left behind
    monkeypatch.setattr(ckpt_module, "atomic_write_bytes", real)
    folder = ours.save_pretrained(tmp_path / "old")
    (folder / "README.md").write_text("kept")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    calls.clear()
    monkeypatch.setattr(ckpt_module, "atomic_write_bytes", fail_on_second)
    with torch.no_grad():
        ours.embeddings.word.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        ours.save_pretrained(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    with pytest.raises(ValueError, match="is a file"):
        ours.save_pretrained(folder / "README.md")


def test_overrides(tmp_path):
    torch.manual_seed(0)
    BertEncoder(BertConfig(**TINY)).save_pretrained(tmp_path)
    model = BertEncoder.from_pretrained(
        tmp_path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.25, layer_norm_eps=1e-5
    )
    assert model.config.hidden_dropout_prob == 0.0
    assert model.embeddings.drop.p == 0.0 and model.embeddings.norm.eps == 1e-5
    assert model.config.attention_probs_dropout_prob == 0.25
    known = r"known overrides are hidden_dropout_prob, attention_probs_dropout_prob"
    with pytest.raises(ValueError, match=rf"override 'hidden_dropout' is unknown: {known}"):
        BertEncoder.from_pretrained(tmp_path, hidden_dropout=0.0)
    with pytest.raises(ValueError, match="'hidden_size' sets the shape of saved weights"):
        BertEncoder.from_pretrained(tmp_path, hidden_size=64)
    with pytest.raises(ValueError, match=r"hidden_dropout_prob must be in \[0, 1\)"):
        BertEncoder.from_pretrained(tmp_path, hidden_dropout_prob=1.5)


def _grads(model, batch, seed):
    ids, keep, types = batch
    model.zero_grad()
    torch.manual_seed(seed)
    out = model(ids, keep, types)
    (out.last_hidden_state.square().mean() + out.pooler_output.sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_gradient_checkpointing_gives_equal_gradients(dropout):
    torch.manual_seed(0)
    config = BertConfig(**TINY, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    model = BertEncoder(config).train()
    batch = _batch()
    plain = _grads(model, batch, seed=3)
    model.gradient_checkpointing = True
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        checkpointed = _grads(model, batch, seed=3)  # dropout replays the same masks
    for name, g in plain.items():
        torch.testing.assert_close(checkpointed[name], g, rtol=0, atol=1e-6, msg=name)
    model.gradient_checkpointing = False
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        _grads(model, batch, seed=3)
    assert len(saved) < len(kept)  # the layers' insides were not kept for backward


def test_resize_grows_like_transformers(tmp_path):
    torch.manual_seed(0)
    theirs = transformers.BertModel(transformers.BertConfig(**TINY))
    theirs.save_pretrained(tmp_path)
    ours = BertEncoder.from_pretrained(tmp_path)
    old = ours.embeddings.word.weight.detach().clone()
    theirs.resize_token_embeddings(120)  # mean_resizing=True, their default
    ours.resize_token_embeddings(120)
    new = ours.embeddings.word.weight
    assert new.shape == (120, 32) and ours.config.vocab_size == 120
    assert torch.equal(new[:99], old)
    their_rows = theirs.get_input_embeddings().weight[99:].detach()
    torch.testing.assert_close(new[99:].detach(), their_rows, rtol=0, atol=1e-4)
    ids = torch.tensor([[5, 119, 100]])
    with torch.no_grad():
        out = ours(ids).last_hidden_state
    folder = ours.save_pretrained(tmp_path / "resized")
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 120
    with torch.no_grad():
        again = transformers.AutoModel.from_pretrained(str(folder))(input_ids=ids)
    assert float((out - again.last_hidden_state).abs().max()) <= SAVE_TOL


def test_resize_without_mean_and_shrinking():
    torch.manual_seed(0)
    ours = BertEncoder(BertConfig(**TINY, initializer_range=0.05))
    old = ours.embeddings.word.weight.detach().clone()
    ours.resize_token_embeddings(99 + 2000, mean_resizing=False)
    added = ours.embeddings.word.weight[99:].detach()  # (2000, 32)
    assert abs(float(added.std()) - 0.05) < 0.0025 and abs(float(added.mean())) < 0.0025
    assert torch.equal(ours.embeddings.word.weight[:99], old)
    ours.resize_token_embeddings(10)
    assert torch.equal(ours.embeddings.word.weight, old[:10])
    assert ours.embeddings.word.num_embeddings == 10 == ours.config.vocab_size
    assert ours.embeddings.word.weight.requires_grad
    with pytest.raises(ValueError, match="num_tokens must be a positive integer"):
        ours.resize_token_embeddings(0)
    padded = BertEncoder(BertConfig(**TINY, pad_token_id=20))
    with pytest.raises(ValueError, match="would drop the padding row pad_token_id=20"):
        padded.resize_token_embeddings(20)
