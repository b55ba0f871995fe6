"""Random-weight checkpoints of every text family, saved with a tokenizer like a user's folder.

Tokenizers are built offline: the embedded MiniLM's WordPiece files (BERT, DistilBERT), or a
tiny byte-level BPE (RoBERTa, GPT-2) or SentencePiece-style BPE (Llama) trained in-process
on a few sentences. Nothing is downloaded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from attnkit.models import default_checkpoint

CORPUS = [
    "The animal didn't cross the street because it was too tired.",
    "The cat sat on the mat and it slept.",
    "A dog ran across the park; it was happy.",
    "Attention shows where each token looks.",
] * 4
FAMILIES = ("bert", "distilbert", "roberta", "gpt2", "llama")
DECODERS = ("gpt2", "llama")


def _wordpiece(folder: Path) -> int:
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(default_checkpoint() / name, folder / name)
    return 30522


def _bpe(folder: Path, family: str) -> int:
    import tokenizers
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if family == "llama":  # SentencePiece-style: "▁" marks a word start, unseen chars -> <unk>
        tok = tokenizers.SentencePieceBPETokenizer(unk_token="<unk>")
        specials = ["<unk>", "<s>", "</s>"]
        tok.train_from_iterator(CORPUS, vocab_size=200, special_tokens=specials)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
        )
        kw = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    else:  # byte-level BPE: "Ġ" marks a word start, every byte is representable
        tok = tokenizers.ByteLevelBPETokenizer()
        specials = ["<s>", "<pad>", "</s>", "<unk>"]
        tok.train_from_iterator(CORPUS, vocab_size=300, special_tokens=specials)
        if family == "roberta":
            tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
            kw = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>")
        else:
            kw = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, **kw)
    fast.save_pretrained(folder)
    return fast.vocab_size + len(fast.added_tokens_encoder)


def config(family: str, vocab_size: int):
    import transformers

    c = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if family == "bert":
        return transformers.BertConfig(vocab_size=vocab_size, **c)
    if family == "roberta":
        return transformers.RobertaConfig(vocab_size=vocab_size, pad_token_id=1, **c)
    if family == "distilbert":
        return transformers.DistilBertConfig(
            vocab_size=vocab_size, dim=32, n_layers=2, n_heads=4, hidden_dim=64
        )
    if family == "gpt2":
        return transformers.GPT2Config(
            vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=2
        )
    if family == "llama":  # grouped-query attention: 4 query heads share 2 key/value heads
        return transformers.LlamaConfig(vocab_size=vocab_size, num_key_value_heads=2, **c)
    raise ValueError(family)


def save_text_checkpoint(family: str, folder: Path) -> Path:
    """A random `family` model and its tokenizer saved in `folder`; returns the folder."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = _wordpiece(folder) if family in ("bert", "distilbert") else _bpe(folder, family)
    auto = transformers.AutoModelForCausalLM if family in DECODERS else transformers.AutoModel
    torch.manual_seed(0)
    auto.from_config(config(family, vocab)).save_pretrained(folder)
    return folder


def save_vit_checkpoint(folder: Path, *, classify: bool = True) -> Path:
    """A random ViT (16 x 16 images, 4 x 4 patches, 3 classes) saved in `folder`."""
    import transformers

    c = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
    )
    torch.manual_seed(0)
    auto = transformers.ViTForImageClassification if classify else transformers.ViTModel
    auto(c).save_pretrained(folder)
    return folder
