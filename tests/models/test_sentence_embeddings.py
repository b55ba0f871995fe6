"""The sentence-embedding recipe of docs/*/guides/sentence-embeddings.md against
sentence-transformers on the same folder: float32 within 1e-5, float64 within 1e-10."""

from __future__ import annotations

import pytest
import torch

from attnkit.models import BertEncoder, Tokenizer, default_checkpoint, sentence_embedding
from tests.models.test_tokenizer_call import TEXTS

st = pytest.importorskip("sentence_transformers")

# the guide's sentences, then varied texts: accents, CJK, emoji, empty, over 256 tokens
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
]
TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


def _ours(texts, dtype, limit="sentence-transformers"):
    """The guide's recipe: the tokenizer called as transformers' with sentence-transformers'
    limit (256), the encoder, mean pooling over real tokens, unit length."""
    folder = default_checkpoint()
    tok = Tokenizer.from_pretrained(folder)
    model = BertEncoder.from_pretrained(folder, dtype=dtype)
    max_length = tok.max_length if limit == "sentence-transformers" else None
    batch = tok(texts, padding=True, truncation=True, max_length=max_length,
                return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (B, N, C)
    return sentence_embedding(hidden, batch["attention_mask"])  # (B, C)


@pytest.mark.slow  # about 30 s: texts over 256 tokens, twice per dtype
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_embeddings_equal_sentence_transformers(dtype):
    texts = SENTENCES + TEXTS[:60:3] + [t for t in TEXTS if len(t) > 3000][:2]
    reference = st.SentenceTransformer(str(default_checkpoint()), device="cpu").to(dtype)
    assert reference.max_seq_length == 256
    want = reference.encode(
        texts, convert_to_tensor=True, normalize_embeddings=True, batch_size=64
    )  # (B, C)
    assert want.dtype == dtype
    got = _ours(texts, dtype)
    assert got.shape == want.shape == (len(texts), 384)
    assert float((got - want).abs().max()) <= TOLERANCE[dtype]
    # the limit matters: at transformers' own (model_max_length, 512) long texts differ
    at_512 = _ours(texts, dtype, limit="transformers")
    gap = (at_512 - want).abs().amax(dim=-1)  # (B,)
    long = gap > 100 * TOLERANCE[torch.float32]
    assert 2 <= int(long.sum()) < len(texts)
