"""Tokenizer length limits from the checkpoint, truncation, the too-long error, saving;
embeddings of long texts against sentence-transformers."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnkit.cli.main import main
from attnkit.models import (
    BertEncoder,
    TextTooLong,
    Tokenizer,
    default_checkpoint,
    sentence_embedding,
)
from attnkit.models.tokenize import checkpoint_max_length

# all-MiniLM-L6-v2: sentence_bert_config.json max_seq_length 256, tokenizer_config.json
# model_max_length 512, config.json max_position_embeddings 512
ST_LIMIT = 256
LONG = " ".join(
    ["The animal didn't cross the street because it was too tired, said the keeper."] * 17
)  # 308 tokens with [CLS]/[SEP]
EMB_TOL = 1e-5


@pytest.fixture(scope="module")
def ckpt():
    return default_checkpoint()


def test_limit_is_the_strictest_the_checkpoint_states(ckpt, tmp_path):
    assert checkpoint_max_length(ckpt) == (ST_LIMIT, "max_seq_length in sentence_bert_config.json")
    tok = Tokenizer.from_pretrained(ckpt)
    assert tok.max_length == ST_LIMIT and not tok.truncation
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(ckpt / name, tmp_path / name)
    assert checkpoint_max_length(tmp_path) == (512, "model_max_length in tokenizer_config.json")
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    settings["model_max_length"] = 1000000000000000019884624838656  # transformers' "no limit"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    assert checkpoint_max_length(tmp_path) == (512, "max_position_embeddings in config.json")
    (tmp_path / "config.json").unlink()
    assert checkpoint_max_length(tmp_path) is None
    assert Tokenizer.from_pretrained(tmp_path).max_length is None
    assert Tokenizer.from_pretrained(ckpt, max_length=300).limit_source == "the max_length argument"


def test_too_long_names_count_limit_source_and_option(ckpt):
    tok = Tokenizer.from_pretrained(ckpt)
    with pytest.raises(TextTooLong) as info:
        tok.encode_batch(["short", LONG])
    e = info.value
    assert isinstance(e, ValueError) and (e.index, e.count, e.limit) == (1, 308, ST_LIMIT)
    assert str(e) == (
        "text 1 has 308 tokens ([CLS]/[SEP] included) but the limit is 256 (max_seq_length in "
        "sentence_bert_config.json): shorten it, or make the Tokenizer with truncation=True to "
        "keep the first 256"
    )
    assert "max_position_embeddings" not in str(e)


def test_truncation_cuts_like_transformers(ckpt):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(str(ckpt))
    tok = Tokenizer.from_pretrained(ckpt, truncation=True)
    enc = tok.encode_batch([LONG, "short"])
    assert enc.input_ids.shape == (2, ST_LIMIT)
    assert enc.tokens[0][-1] == "[SEP]" and enc.attention_mask[0].all()
    want = theirs([LONG], truncation=True, max_length=ST_LIMIT)["input_ids"][0]
    assert enc.input_ids[0].tolist() == want
    pair = Tokenizer.from_pretrained(ckpt, max_length=40, truncation=True).encode("a b " * 30, LONG)
    want = theirs("a b " * 30, LONG, truncation="longest_first", max_length=40)
    assert pair.input_ids[0].tolist() == want["input_ids"]
    assert pair.token_type_ids[0].tolist() == want["token_type_ids"]


def test_bad_limits(ckpt):
    with pytest.raises(ValueError, match="truncation=True needs a max_length"):
        Tokenizer(object(), truncation=True)
    with pytest.raises(ValueError, match="max_length must be a positive integer, got 0"):
        Tokenizer.from_pretrained(ckpt, max_length=0)
    with pytest.raises(ValueError, match=r"max_length=2 cannot hold text 0 even cut"):
        Tokenizer.from_pretrained(ckpt, max_length=2, truncation=True).encode("a b c", "d e f")


def test_long_text_embeds_like_sentence_transformers(ckpt):
    st = pytest.importorskip("sentence_transformers")
    texts = [LONG, "Attention is all you need."]
    reference = st.SentenceTransformer(str(ckpt), device="cpu").encode(
        texts, convert_to_tensor=True, normalize_embeddings=True
    )
    enc = Tokenizer.from_pretrained(ckpt, truncation=True).encode_batch(texts)
    model = BertEncoder.from_pretrained(ckpt)
    with torch.no_grad():
        hidden = model(**enc.model_inputs()).last_hidden_state
    emb = sentence_embedding(hidden, enc.attention_mask)
    assert float((emb - reference).abs().max()) <= EMB_TOL
    # what the issue saw: all 308 tokens embed differently from sentence-transformers
    whole = Tokenizer.from_pretrained(ckpt, max_length=512).encode(LONG)
    with torch.no_grad():
        full = sentence_embedding(
            model(**whole.model_inputs()).last_hidden_state, whole.attention_mask
        )
    assert float((full[0] - reference[0]).abs().max()) > 100 * EMB_TOL


def test_tokenizer_save_round_trip(ckpt, tmp_path):
    for source in (ckpt, None):
        folder = tmp_path / str(source is None)
        if source is None:  # a tokenizer read from vocab.txt only
            for name in ("vocab.txt", "tokenizer_config.json"):
                shutil.copy(ckpt / name, tmp_path / name)
            source = tmp_path
        tok = Tokenizer.from_pretrained(source, truncation=True)
        tok.save_pretrained(folder)
        again = Tokenizer.from_pretrained(folder, truncation=True)
        assert again.max_length == tok.max_length
        a, b = tok.encode_batch([LONG, "Hi"]), again.encode_batch([LONG, "Hi"])
        assert a.tokens == b.tokens and torch.equal(a.input_ids, b.input_ids)
        saved = json.loads((folder / "tokenizer.json").read_text())
        assert saved["truncation"] is None  # a setting of use, not of the vocabulary


def test_explain_refuses_an_over_long_text_in_one_line(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["explain", LONG, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit explain: error: TEXT has 308 tokens")
    assert "at most 256 (its max_seq_length in sentence_bert_config.json)" in lines[0]
    assert not out.exists()
