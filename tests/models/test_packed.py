"""Packed batches end to end: a GPT and a BERT given several documents per row (document ids,
positions restarting at each document) give every document exactly what it gets alone, for
learned, sinusoidal and rotary positions (float64, eval mode, 1e-12); so do their gradients,
the GPT loss (boundaries ignored) and decoding after a packed prompt."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.models import GPT, BertClassifier, BertConfig, BertEncoder, GPTConfig, KVCache
from attnkit.modules import MultiHeadAttention

V = 13
KINDS = ["learned", "sinusoidal", "rotary"]
BERT_KINDS = {"learned": "absolute", "sinusoidal": "sinusoidal", "rotary": "rotary"}
# two rows of 16 tokens: documents of mixed length, one of a single token
LENGTHS = [[5, 1, 10], [9, 7]]
TOL = {"atol": 1e-12, "rtol": 0}


def gpt(kind: str, **kw) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(V, n_layer=2, n_head=2, d_model=12, context=16, positions=kind, **kw)
    return GPT(cfg, dtype=torch.float64).eval()


def bert_config(kind: str) -> BertConfig:
    return BertConfig(
        vocab_size=V, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=20, max_position_embeddings=16, type_vocab_size=2,
        position_embedding_type=BERT_KINDS[kind],
    )  # fmt: skip


def bert(kind: str) -> BertEncoder:
    torch.manual_seed(0)
    return BertEncoder(bert_config(kind), dtype=torch.float64).eval()


def tokens(b: int = 2, n: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))


def packed_ids(lengths=LENGTHS) -> torch.Tensor:
    return torch.stack([masks.document_ids(row) for row in lengths])  # (B, N)


def spans(lengths=LENGTHS):
    """(row, start, end) of every document, in the order they start."""
    for b, row in enumerate(lengths):
        start = 0
        for n in row:
            yield b, start, start + n
            start += n


# --------------------------------------------------------------------------- positions


def test_document_positions_restart_at_each_document():
    assert masks.document_positions(torch.tensor([0, 0, 0, 1, 1])).tolist() == [0, 1, 2, 0, 1]
    got = masks.document_positions(torch.tensor([[4, 4, 2, 2, 2], [0, 1, 1, 1, 1]]))
    assert got.tolist() == [[0, 1, 0, 1, 2], [0, 0, 1, 2, 3]] and got.dtype == torch.int64
    # a document's tokens count 0, 1, 2, ... even when they are not contiguous
    assert masks.document_positions(torch.tensor([0, 1, 0, 1, 0])).tolist() == [0, 0, 1, 1, 2]
    padded = masks.document_ids([3, 2], total=7)  # the tail is a document of its own
    assert masks.document_positions(padded).tolist() == [0, 1, 2, 0, 1, 0, 1]
    assert masks.document_positions(torch.zeros(2, 0, dtype=torch.long)).shape == (2, 0)
    for bad in (torch.zeros(3), torch.zeros(3, dtype=torch.bool), torch.zeros(1, 2, 3).long()):
        with pytest.raises(ValueError, match="document_positions: ids must be"):
            masks.document_positions(bad)


# --------------------------------------------------------------------------- GPT


@pytest.mark.parametrize("kind", KINDS)
def test_gpt_gives_each_packed_document_its_logits_alone(kind):
    model, x, docs = gpt(kind), tokens(), packed_ids()
    with torch.no_grad():
        packed = model(x, document_ids=docs)  # (B, N, V)
        for b, i, j in spans():
            torch.testing.assert_close(packed[b, i:j], model(x[b : b + 1, i:j])[0], **TOL)
        # without the document ids the later documents see the earlier ones: it matters
        assert not torch.allclose(model(x)[0, 5:], packed[0, 5:], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_gpt_documents_need_not_be_contiguous(kind):
    """Interleaved ids: each document is its tokens in order (a block-by-block mask)."""
    model, x = gpt(kind), tokens(1, 9)
    docs = torch.tensor([0, 1, 0, 0, 2, 1, 2, 0, 1])
    with torch.no_grad():
        packed = model(x, document_ids=docs)[0]
        for d in range(3):
            where = (docs == d).nonzero()[:, 0]
            torch.testing.assert_close(packed[where], model(x[:, where])[0], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_gpt_loss_ignores_boundaries_and_sums_the_documents_losses(kind):
    """The packed loss is the mean over each document's own next-token predictions: times
    their count, the sum of the documents' losses alone (a 1-token document adds nothing).
    Its gradients are those of that sum."""
    model, x, docs = gpt(kind), tokens(), packed_ids()
    packed = model.loss(x, document_ids=docs)
    count = sum(j - i - 1 for _, i, j in spans())
    (packed * count).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    alone = sum(model.loss(x[b : b + 1, i:j]) * (j - i - 1) for b, i, j in spans() if j - i > 1)
    alone.backward()
    torch.testing.assert_close(packed * count, alone, **TOL)
    for n, p in model.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, **TOL, msg=n)
    # the boundary labels are what is left out: counting them changes the loss
    assert not torch.allclose(model.loss(x), packed)


def test_gpt_loss_with_pad_id_ignores_pads_and_boundaries():
    model = gpt("learned", pad_id=0)
    x = tokens().clamp(min=1)
    x[1, 12:] = 0  # a padded tail, as a document of its own
    docs = torch.stack([masks.document_ids([5, 11]), masks.document_ids([8, 4], total=16)])
    with torch.no_grad():
        packed = model.loss(x, document_ids=docs)
        parts = [(0, 0, 5), (0, 5, 16), (1, 0, 8), (1, 8, 12)]
        total = sum(model.loss(x[b : b + 1, i:j]) * (j - i - 1) for b, i, j in parts)
    torch.testing.assert_close(packed * (4 + 10 + 7 + 3), total, **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_gpt_cached_decode_after_a_packed_prompt_continues_the_last_document(kind):
    """Prefill a packed row into the cache, then step one token at a time with the document
    ids of cached + new tokens: the logits are those of the last document alone."""
    model = gpt(kind)
    x = tokens(2, 14)
    docs = torch.stack([masks.document_ids([6, 4, 4]), masks.document_ids([3, 11])])
    prompt = 10
    with torch.no_grad():
        cache = KVCache(capacity=16)
        steps = [model(x[:, :prompt], cache=cache, document_ids=docs[:, :prompt])]
        for t in range(prompt, 14):
            steps.append(model(x[:, t : t + 1], cache=cache, document_ids=docs[:, : t + 1]))
        got = torch.cat(steps, 1)  # (B, 14, V)
        torch.testing.assert_close(got, model(x, document_ids=docs), **TOL)
        torch.testing.assert_close(got[0, 10:], model(x[:1, 10:])[0], **TOL)
        torch.testing.assert_close(got[1, 3:], model(x[1:, 3:])[0], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_continues_the_last_document_of_packed_prompts(kind):
    model, x = gpt(kind), tokens(2, 9)
    docs = torch.stack([masks.document_ids([4, 5]), masks.document_ids([2, 3, 4])])
    out = model.generate(x, 6, document_ids=docs)
    assert out.shape == (2, 15) and torch.equal(out[:, :9], x)
    for b, start in ((0, 4), (1, 5)):
        assert torch.equal(out[b, 9:], model.generate(x[b : b + 1, start:], 6)[0, -6:])
    one_row = model.generate(x[:1], 6, document_ids=docs[0])  # (P,) ids: every row's
    assert torch.equal(one_row, out[:1])
    # past the context (16) the window slides inside the last document too
    assert torch.equal(
        model.generate(x, 14, document_ids=docs)[1, 9:],
        model.generate(x[1:, 5:], 14)[0, 4:],
    )


def test_gpt_packed_errors_name_the_argument():
    model, x = gpt("learned"), tokens()
    with pytest.raises(ValueError, match=r"document_ids must be integers \(16,\) or \(2, 16\)"):
        model(x, document_ids=packed_ids()[:, :8])
    with pytest.raises(ValueError, match="document_ids must be integers"):
        model(x, document_ids=packed_ids().double())
    with pytest.raises(ValueError, match="not both"):
        model(x, document_ids=packed_ids(), attention_mask=torch.ones_like(x))
    with pytest.raises(ValueError, match="over the cached"):
        cache = KVCache()
        model(x[:, :4], cache=cache)
        model(x[:, 4:5], cache=cache, document_ids=packed_ids()[:, :1])  # (B, 1): new only
    with pytest.raises(ValueError, match=r"position_ids must be >= 0 and < 16, got values 0..16"):
        model(x[:, :2], position_ids=torch.tensor([0, 16]))
    with pytest.raises(ValueError, match=r"document_ids must be integers \(16,\) or \(2, 16\)"):
        model.generate(x, 2, document_ids=packed_ids()[:, 1:])


def test_gpt_config_positions_and_the_older_rotary_flag():
    base = {"vocab_size": V, "n_layer": 1, "n_head": 2, "d_model": 8, "context": 8}
    assert GPTConfig(**base, rotary=True).positions == "rotary"  # saved configs still load
    assert GPTConfig(**base, positions="rotary").rotary
    assert not GPTConfig(**base, positions="sinusoidal").rotary
    with pytest.raises(ValueError, match="positions must be one of"):
        GPTConfig(**base, positions="alibi")
    with pytest.raises(ValueError, match="rotary=True contradicts positions='sinusoidal'"):
        GPTConfig(**base, rotary=True, positions="sinusoidal")
    sinusoidal = GPT(GPTConfig(**base, positions="sinusoidal"))
    assert not any("positions" in name for name in sinusoidal.state_dict())


def test_position_ids_need_a_rotary_attention():
    attn = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="no rotary"):
        attn(torch.zeros(1, 3, 8), position_ids=torch.arange(3))


# --------------------------------------------------------------------------- BERT


def _bert_batch():
    x, docs = tokens(seed=2), packed_ids()
    types = torch.zeros_like(x)
    types[0, 9:15] = 1  # the third document of row 0 is a sentence pair
    return x, docs, types


@pytest.mark.parametrize("kind", KINDS)
def test_bert_gives_each_packed_document_its_states_and_pooled_output_alone(kind):
    model = bert(kind)
    x, docs, types = _bert_batch()
    with torch.no_grad():
        packed = model(x, token_type_ids=types, document_ids=docs)
        assert packed.pooler_output.shape == (5, 16)  # one row per document, in order
        for d, (b, i, j) in enumerate(spans()):
            alone = model(x[b : b + 1, i:j], token_type_ids=types[b : b + 1, i:j])
            for got, want in zip(packed.hidden_states, alone.hidden_states, strict=True):  # L + 1
                torch.testing.assert_close(got[b, i:j], want[0], **TOL)
            torch.testing.assert_close(packed.pooler_output[d], alone.pooler_output[0], **TOL)
        plain = model(x, token_type_ids=types).last_hidden_state
        assert not torch.allclose(plain[0, :5], packed.last_hidden_state[0, :5], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_bert_gradients_of_a_packed_batch_are_those_of_the_documents_alone(kind):
    model = bert(kind)
    x, docs, types = _bert_batch()
    weights = torch.randn(
        2, 16, 16, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    out = model(x, token_type_ids=types, document_ids=docs)
    ((out.last_hidden_state * weights).sum() + out.pooler_output.sum()).backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    total = 0
    for b, i, j in spans():
        alone = model(x[b : b + 1, i:j], token_type_ids=types[b : b + 1, i:j])
        total = total + (alone.last_hidden_state[0] * weights[b, i:j]).sum()
        total = total + alone.pooler_output.sum()
    total.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(packed[n], p.grad, **TOL, msg=n)


def test_bert_packed_with_padding_and_the_classifier_head():
    """Padding as a document of its own and masked by attention_mask: no pooled row for it;
    the classifier gives one row of logits per document."""
    torch.manual_seed(0)
    model = BertClassifier(bert_config("learned"), 3, dtype=torch.float64).eval()
    x = tokens(2, 12, seed=4)
    docs = torch.stack([masks.document_ids([7, 5]), masks.document_ids([4, 4], total=12)])
    keep = torch.ones_like(x)
    keep[1, 8:] = 0
    with torch.no_grad():
        logits = model(x, keep, document_ids=docs)
        assert logits.shape == (4, 3)
        for d, (b, i, j) in enumerate([(0, 0, 7), (0, 7, 12), (1, 0, 4), (1, 4, 8)]):
            torch.testing.assert_close(logits[d], model(x[b : b + 1, i:j])[0], **TOL)
    assert model.loss(logits, torch.tensor([0, 2, 1, 1])).shape == ()


def test_bert_positions_of_attnkits_own_do_not_save_as_a_transformers_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="position_embedding_type 'rotary' is attnkit's own"):
        bert("rotary").save_pretrained(tmp_path / "out")
    assert bert("rotary").embeddings.position is None
    assert not any("position" in name for name in bert("sinusoidal").state_dict())
    with pytest.raises(ValueError, match="position_embedding_type 'relative_key'"):
        BertConfig(**{**bert_config("learned").__dict__, "position_embedding_type": "relative_key"})
