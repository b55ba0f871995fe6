"""BertEncoder against transformers.BertModel and sentence-transformers on a real checkpoint.

The checkpoint (all-MiniLM-L6-v2) is loaded once per module; comparisons are
on real tokens only (padded query rows are ignored), tolerance 1e-5 absolute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

import attnkit
from attnkit.models import (
    BertConfig,
    BertEncoder,
    Tokenizer,
    default_checkpoint,
    mean_pool,
    sentence_embedding,
)
from tests.models.tiny import TINY

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "The animal didn't cross the street because it was too tired.",
    "Attention is all you need.",
    "Hi",
]
TOL = 1e-5
# docs guides/fine-tune-bert.md: per-head probabilities are as close to the float64 truth as
# transformers' own float32 ones, within twice their error (flash-attention's rule), on every
# CPU; 4.2e-7 from transformers was measured on an Ice Lake and 1.1e-6 on a Sapphire Rapids
# (AMX) with 1 thread
PROB_TOL = 1e-5  # and never further from transformers than this
# docs api/core.md (the contracts): recording moves a float32 forward by at most this (it runs
# the reference backend)
RECORD_TOL_F32 = 2e-6
# ... and a 6-layer BERT's last hidden states by at most this (measured 1.6e-5)
RECORD_TOL_BERT = 3e-5
RECORD_TOL_F64 = 1e-12


@pytest.fixture(scope="module")
def ckpt():
    return default_checkpoint()


@pytest.fixture(scope="module")
def ours(ckpt):
    return BertEncoder.from_pretrained(ckpt)


@pytest.fixture(scope="module")
def batch(ckpt):
    return Tokenizer.from_pretrained(ckpt).encode_batch(SENTENCES)


@pytest.fixture(scope="module")
def hf_out(ckpt, batch):
    model = transformers.BertModel.from_pretrained(str(ckpt), attn_implementation="eager").eval()
    with torch.no_grad():
        return model(**batch.model_inputs(), output_attentions=True, output_hidden_states=True)


@pytest.fixture(scope="module")
def hf_out64(ckpt, batch):
    """transformers' BERT in float64: the truth both float32 implementations are measured by."""
    model = transformers.BertModel.from_pretrained(str(ckpt), attn_implementation="eager")
    with torch.no_grad():
        return model.double().eval()(**batch.model_inputs(), output_attentions=True)


def _report(name: str, err: float) -> None:
    print(f"\n[parity] {name}: max abs error {err:.3g}")


def test_batch_is_padded(batch):
    lengths = batch.attention_mask.sum(1).tolist()
    assert len(set(lengths)) == 3 and batch.tokens[2][-1] == "[PAD]"
    assert batch.tokens[1][0] == "[CLS]" and batch.tokens[1][lengths[1] - 1] == "[SEP]"


@pytest.mark.parametrize("recording", [False, True], ids=["fused", "recorded"])
def test_hidden_states_match_transformers(ours, batch, hf_out, recording):
    keep = batch.attention_mask.bool()  # (B, N)
    with torch.no_grad():
        if recording:
            with attnkit.record_attention(ours):
                out = ours(**batch.model_inputs())
        else:
            out = ours(**batch.model_inputs())
    assert len(out.hidden_states) == len(hf_out.hidden_states) == 7
    pairs = zip(out.hidden_states, hf_out.hidden_states, strict=True)
    err = max(float((a - b)[keep].abs().max()) for a, b in pairs)
    _report(f"hidden states, all layers ({'reference' if recording else 'fused'} backend)", err)
    assert err < TOL
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1])
    err = float((out.pooler_output - hf_out.pooler_output).abs().max())
    _report("pooler output", err)
    assert err < TOL


def test_attention_probabilities_match_transformers(ours, batch, hf_out, hf_out64):
    with torch.no_grad(), attnkit.record_attention(ours) as rec:
        ours(**batch.model_inputs())
    maps = rec.stack()  # (L, B, H, N, N)
    theirs = torch.stack(hf_out.attentions)  # (L, B, H, N, N)
    truth = torch.stack(hf_out64.attentions)  # (L, B, H, N, N), float64
    assert maps.shape == theirs.shape == (6, 3, 12, batch.input_ids.shape[1], maps.shape[-1])
    keep = batch.attention_mask.bool()  # (B, N)
    rows = keep[None, :, None, :, None]  # (1, B, 1, N, 1): real queries

    def gap(a, b):
        return float(((a.double() - b.double()).abs() * rows).max())

    err, ours_err, their_err = gap(maps, theirs), gap(maps, truth), gap(theirs, truth)
    _report("attention probabilities, all layers and heads", err)
    _report("  attnkit vs float64", ours_err)
    _report("  transformers vs float64", their_err)
    assert ours_err <= 2 * their_err
    assert err <= PROB_TOL
    padded_keys = ~keep[None, :, None, None, :]  # (1, B, 1, 1, N)
    assert bool((maps.masked_select(padded_keys.expand_as(maps)) == 0).all())


def test_sentence_embeddings_match_sentence_transformers(ckpt, ours, batch):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(ckpt), device="cpu").encode(
        SENTENCES, convert_to_tensor=True, normalize_embeddings=True
    )
    with torch.no_grad():
        hidden = ours(**batch.model_inputs()).last_hidden_state
    emb = sentence_embedding(hidden, batch.attention_mask)
    err = float((emb - reference).abs().max())
    _report("normalised mean-pooled embeddings vs sentence-transformers", err)
    assert err < TOL
    assert torch.allclose(emb.norm(dim=-1), torch.ones(3))


def test_mean_pool_ignores_padding():
    hidden = torch.arange(12.0).reshape(1, 4, 3)  # (B=1, N=4, C=3)
    pooled = mean_pool(hidden, torch.tensor([[1, 1, 0, 0]]))
    assert torch.equal(pooled, hidden[0, :2].mean(0, keepdim=True))


def test_tokenizer_pair_and_length_limit(ckpt):
    tok = Tokenizer.from_pretrained(ckpt)
    enc = tok.encode("it was tired", pair="the animal")
    assert enc.tokens[0].count("[SEP]") == 2
    assert enc.token_type_ids[0].tolist() == [0] * 5 + [1] * 3
    with pytest.raises(ValueError, match=r"has 602 tokens .* limit is 256 \(max_seq_length in"):
        tok.encode("word " * 600)
    with pytest.raises(ValueError, match="empty"):
        tok.encode("   ")


def test_tokenizer_falls_back_to_vocab_txt(ckpt, tmp_path):
    for name in ("vocab.txt", "tokenizer_config.json", "config.json"):
        shutil.copy(ckpt / name, tmp_path / name)
    fallback = Tokenizer.from_pretrained(tmp_path).encode_batch(SENTENCES)
    full = Tokenizer.from_pretrained(ckpt).encode_batch(SENTENCES)
    assert fallback.tokens == full.tokens and torch.equal(fallback.input_ids, full.input_ids)


def test_loading_does_not_import_transformers(ckpt):
    code = (
        "import sys; from attnkit.models import *; "
        f"m = BertEncoder.from_pretrained({str(ckpt)!r}); "
        f"e = Tokenizer.from_pretrained({str(ckpt)!r}).encode('hi'); m(**e.model_inputs()); "
        "bad = [n for n in ('transformers', 'matplotlib') if n in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------- tiny random checkpoints


@pytest.fixture
def tiny(tmp_path):
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**TINY)).eval()
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    return model, folder


def _compare(theirs, folder):
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    keep = torch.ones_like(ids)
    keep[1, 6:] = 0
    types = (torch.arange(9) >= 4).long().expand(2, 9)
    ours = BertEncoder.from_pretrained(folder)
    with torch.no_grad():
        a = ours(ids, keep, types)
        b = theirs(input_ids=ids, attention_mask=keep, token_type_ids=types)
    real = keep.bool()
    assert float((a.last_hidden_state - b.last_hidden_state)[real].abs().max()) < TOL
    assert float((a.pooler_output - b.pooler_output).abs().max()) < TOL


def test_tiny_safetensors_round_trip(tiny):
    model, folder = tiny
    assert (folder / "model.safetensors").is_file()
    _compare(model, folder)


def test_tiny_pytorch_bin_with_bert_prefix(tiny):
    model, folder = tiny
    (folder / "model.safetensors").unlink()
    state = {f"bert.{k}": v for k, v in model.state_dict().items()}
    state["cls.predictions.bias"] = torch.zeros(TINY["vocab_size"])  # a task head: ignored
    torch.save(state, folder / "pytorch_model.bin")
    _compare(model, folder)


def test_pooler_is_optional(tiny):
    _, folder = tiny
    ours = BertEncoder.from_pretrained(folder, pooler=False)
    assert ours.pooler is None
    assert ours(torch.tensor([[1, 2, 3]])).pooler_output is None


def _rewrite(folder, edit):
    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, folder / "model.safetensors")


def _set_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_bad_checkpoints_name_the_problem(tiny, tmp_path):
    _, folder = tiny
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertEncoder.from_pretrained(tmp_path / "nowhere")
    key = "encoder.layer.1.attention.self.key.weight"
    _rewrite(folder, lambda s: s.pop(key))
    with pytest.raises(ValueError, match=rf"missing tensor '{key}'"):
        BertEncoder.from_pretrained(folder)
    key = "encoder.layer.0.intermediate.dense.weight"
    _rewrite(folder, lambda s: s.__setitem__(key, torch.zeros(36, 32)))
    with pytest.raises(ValueError, match=rf"'{key}' has shape \(36, 32\), wanted \(37, 32\)"):
        BertEncoder.from_pretrained(folder)
    _rewrite(folder, lambda s: s.__setitem__(key, torch.zeros(37, 32)))  # back to its shape
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    _set_config(folder, num_hidden_layers=layers - 1)  # fewer layers than the weights hold
    with pytest.raises(ValueError, match=rf"weights for {layers} layers.*={layers - 1}"):
        BertEncoder.from_pretrained(folder)
    _set_config(folder, num_hidden_layers=layers)
    _set_config(folder, model_type="roberta")
    with pytest.raises(ValueError, match="model_type 'roberta' is not supported"):
        BertEncoder.from_pretrained(folder)
    _set_config(folder, model_type="bert", position_embedding_type="relative_key")
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        BertEncoder.from_pretrained(folder)
    _set_config(folder, position_embedding_type="absolute", hidden_size=30)
    with pytest.raises(ValueError, match="hidden_size=30 is not divisible"):
        BertEncoder.from_pretrained(folder)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        BertEncoder.from_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no weights"):
        BertEncoder.from_pretrained(folder)


def test_config_missing_field():
    with pytest.raises(ValueError, match="missing field 'hidden_size'"):
        BertConfig.from_dict({k: v for k, v in TINY.items() if k != "hidden_size"})


def test_forward_rejects_bad_shapes(tiny):
    _, folder = tiny
    ours = BertEncoder.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"input_ids must have shape \(B, N\)"):
        ours(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        ours(torch.tensor([[1, 2]]), torch.tensor([[1, 1, 1]]))
    with pytest.raises(ValueError, match="exceed max_len=64"):
        ours(torch.ones(1, 65, dtype=torch.long))


def test_from_pretrained_on_a_device_and_dtype(tiny):
    model, folder = tiny
    on_meta = BertEncoder.from_pretrained(folder, device="meta")
    assert {p.device.type for p in on_meta.parameters()} == {"meta"}
    ours64 = BertEncoder.from_pretrained(folder, dtype=torch.float64)
    assert {p.dtype for p in ours64.parameters()} == {torch.float64}
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    with torch.no_grad():
        a = ours64(ids).last_hidden_state
        b = model(input_ids=ids).last_hidden_state
    assert a.dtype == torch.float64
    assert float((a - b.double()).abs().max()) < TOL


def test_recording_moves_the_forward_by_at_most_the_readme_bound(ours, batch):
    with torch.no_grad():
        plain = ours(**batch.model_inputs()).last_hidden_state
        with attnkit.record_attention(ours):
            recorded = ours(**batch.model_inputs()).last_hidden_state
    assert float((plain - recorded).abs().max()) <= RECORD_TOL_BERT


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, RECORD_TOL_F32), (torch.float64, RECORD_TOL_F64)]
)
def test_recording_an_encoder_block_stays_within_the_bound(dtype, tol):
    torch.manual_seed(0)
    block = attnkit.EncoderBlock(256, 8, 1024).to(dtype).eval()
    x = torch.randn(4, 97, 256, dtype=dtype)
    with torch.no_grad():
        plain = block(x)
        with attnkit.record_attention(block):
            recorded = block(x)
    assert float((plain - recorded).abs().max()) <= tol
