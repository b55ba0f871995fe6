"""`Tokenizer.__call__` against transformers.AutoTokenizer on the embedded checkpoint: the
same input_ids, token_type_ids and attention_mask for 200 varied texts, alone, batched,
in pairs, under every padding and truncation strategy."""

from __future__ import annotations

import random
import warnings

import pytest
import torch

from attnkit.models import BertClassifier, Tokenizer, default_checkpoint
from attnkit.models.batch_encoding import BatchEncoding

transformers = pytest.importorskip("transformers")

WORDS = [
    "the", "animal", "didn't", "cross", "street", "because", "it", "was", "too", "tired",
    "Hello", "WORLD", "naïve", "café", "résumé", "Ångström", "über", "mañana", "façade",
    "São", "Paulo", "straße", "Zürich", "crème brûlée", "e\u0301cole",  # combining accent
    "你好", "世界", "注意力机制", "自然语言处理", "東京", "こんにちは", "カタカナ", "한국어",
    "Привет", "мир", "مرحبا", "שלום", "नमस्ते", "ελληνικά", "ﬁ", "①②", "½",
    "🙂", "🤖", "👍🏽", "👨‍👩‍👧", "🇫🇷", "❤️", "★",
    "3.14", "1,000,000", "2026-11-24", "#hashtag", "@user", "https://example.com/a?b=c",
    "e-mail", "C++", "x²", "$5", "50%", "(parenthesis)", "[brackets]", "{braces}",
    "...", "!!!", "?!", "—", "–", "\u201cquoted\u201d", "'single'", "semi;colon", "a/b",
    "tab\there", "new\nline", "zero\u200bwidth", "no\xa0break", "ctrl\x07char",
]  # fmt: skip


def _texts() -> list[str]:
    """200 texts, the same on every run: short and long mixes of the words above, texts
    over 512 tokens, the empty string and whitespace."""
    rng = random.Random(0)
    texts = ["", " ", "   \t\n  ", "\u3000", "a", "A.", "[CLS] [SEP] [PAD] [MASK] [UNK]"]
    while len(texts) < 200:
        n = rng.choice([1, 2, 3, 5, 8, 13, 30, 60, 120]) if len(texts) % 25 else 700
        sep = rng.choice([" ", " ", "", ", ", "  "])
        texts.append(sep.join(rng.choice(WORDS) for _ in range(n)))
    return texts


TEXTS = _texts()


@pytest.fixture(scope="module")
def pair():
    folder = default_checkpoint()
    ours = Tokenizer.from_pretrained(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    return ours, theirs


def _both(ours, theirs, *args, **kwargs):
    """Each library's answer (a dict of lists/tensors, or the exception's type)."""
    results = []
    for tok in (ours, theirs):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # both say when a text is over the limit
            transformers.logging.set_verbosity_error()
            try:
                results.append(dict(tok(*args, **kwargs)))
            except Exception:  # transformers raises a bare Exception
                results.append(Exception)
    return results


def _same(a, b) -> bool:
    if a is Exception or b is Exception:
        return a is b
    if list(a) != list(b):
        return False
    return all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def test_the_texts_cover_what_they_should(pair):
    ours, _ = pair
    lengths = [len(ours(t)["input_ids"]) for t in TEXTS]
    assert len(TEXTS) == 200 and lengths.count(2) >= 4  # empty and whitespace: [CLS] [SEP]
    assert sum(n > 512 for n in lengths) >= 7  # over model_max_length
    assert sum(n > 256 for n in lengths) > sum(n > 512 for n in lengths)  # between the limits
    assert 100 in ours(TEXTS)["input_ids"][TEXTS.index(next(t for t in TEXTS if "🤖" in t))]


def test_each_text_alone(pair):
    ours, theirs = pair
    for text in TEXTS:
        a, b = _both(ours, theirs, text)
        assert _same(a, b), repr(text)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"padding": True, "truncation": True, "return_tensors": "pt"},
        {"padding": "longest", "truncation": "longest_first", "max_length": 100},
        {"padding": "max_length", "truncation": True, "max_length": 64, "return_tensors": "pt"},
        {"padding": "max_length"},
        {"padding": True, "truncation": False},
        {"max_length": 30},  # truncation None: transformers cuts when max_length is given
        {"padding": True, "max_length": 30},  # ... but not when it pads
        {"padding": True, "add_special_tokens": False, "return_token_type_ids": False},
        {"padding": True, "return_attention_mask": False, "truncation": "only_first",
         "max_length": 20},
    ],
)  # fmt: skip
def test_batches(pair, kwargs):
    ours, theirs = pair
    for start in range(0, len(TEXTS), 40):
        a, b = _both(ours, theirs, TEXTS[start : start + 40], **kwargs)
        assert a is not Exception and _same(a, b), (start, kwargs)


@pytest.mark.slow  # about 40 s in all: 199 pairs per case, each through both libraries
@pytest.mark.parametrize("truncation", [True, "longest_first", "only_first", "only_second"])
@pytest.mark.parametrize("max_length", [12, 40, None])
def test_pairs_under_every_truncation(pair, truncation, max_length):
    ours, theirs = pair
    outcomes = set()
    for i in range(0, len(TEXTS) - 1):
        first, second = TEXTS[i], TEXTS[(i * 7 + 3) % len(TEXTS)]
        a, b = _both(ours, theirs, first, second, truncation=truncation, max_length=max_length)
        assert _same(a, b), (first, second)
        outcomes.add(a is Exception)
    assert False in outcomes  # pairs cut; some (a short side to cut) neither library can cut
    assert True in outcomes or truncation in (True, "longest_first") or max_length is None
    batch = [TEXTS[i] for i in range(20, 60)], [TEXTS[i] for i in range(100, 140)]
    kwargs = {"truncation": truncation, "max_length": max_length, "padding": True}
    a, b = _both(ours, theirs, *batch, **kwargs, return_tensors="pt")
    assert _same(a, b) and (a is not Exception or truncation not in (True, "longest_first"))
    tuples = list(zip(*batch, strict=True))  # [(text, pair), ...], transformers' other form
    a, b = _both(ours, theirs, tuples, **kwargs, return_tensors="pt")
    assert _same(a, b) and _same(a, _both(ours, theirs, *batch, **kwargs, return_tensors="pt")[0])


def test_the_result_is_a_batch_encoding_for_the_model(pair):
    ours, _ = pair
    enc = ours(["a wonderful film", "dull"], padding=True, return_tensors="pt")
    assert isinstance(enc, BatchEncoding) and list(enc) == [
        "input_ids",
        "token_type_ids",
        "attention_mask",
    ]
    assert enc.input_ids is enc["input_ids"] and enc.input_ids.shape == (2, 5)
    assert enc.tokens(1) == ["[CLS]", "dull", "[SEP]", "[PAD]", "[PAD]"]
    assert enc.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a new classifier head
        clf = BertClassifier.from_pretrained(default_checkpoint(), num_labels=2)
    with torch.no_grad():
        assert torch.equal(
            clf(**enc), clf(**ours.encode_batch(["a wonderful film", "dull"]).model_inputs())
        )
    # the older encode_batch and the call agree where both apply
    fit = [t for t in TEXTS[7:] if len(ours(t, truncation=True).input_ids) <= 256][:40]
    old = ours.encode_batch(fit)
    new = ours(fit, padding=True, return_tensors="pt")
    assert all(torch.equal(old.model_inputs()[k], new[k]) for k in new)
    with pytest.raises(AttributeError, match="BatchEncoding has no 'labels'"):
        _ = enc.labels


def test_limits_and_bad_arguments(pair):
    ours, _ = pair
    assert ours.model_max_length == 512 and ours.max_length == 256  # transformers' vs attnkit's
    long = TEXTS[25]
    with pytest.warns(UserWarning, match=r"more than model_max_length=512; pass truncation=True"):
        assert len(ours(long)["input_ids"]) > 512
    assert len(ours(long, truncation=True)["input_ids"]) == 512
    assert ours.truncation is False  # a call's truncation does not stay on the tokenizer
    with pytest.raises(ValueError, match="return_tensors='pt' needs texts of one length"):
        ours(["a", "b c"], return_tensors="pt")
    with pytest.raises(ValueError, match="padding='left' is unknown"):
        ours("a", padding="left")
    with pytest.raises(ValueError, match="truncation='only_third' is unknown"):
        ours("a", truncation="only_third")
    with pytest.raises(ValueError, match="return_tensors='np' is not supported"):
        ours("a", return_tensors="np")
    with pytest.raises(ValueError, match="text_pair must be like text"):
        ours(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="text must be a string or a list of strings"):
        ours(3)
    with pytest.raises(ValueError, match="cannot tokenize with truncation='only_second'"):
        ours("a b c d e f", truncation="only_second", max_length=4)
