"""attnkit as an attention backend of Hugging Face transformers.

Importing this module registers the name ``"attnkit"`` with transformers'
``AttentionInterface`` (the attention call) and ``AttentionMaskInterface`` (the
mask the model builds for it), so that

    AutoModel.from_pretrained(path, attn_implementation="attnkit")

runs every attention call of the model through `attnkit.attention`, and
`attnkit.record_attention(model)` captures the per-head maps of such a model under
its own module paths (``"encoder.layer.0.attention.self"``).

What the model hands over and what attnkit gets:

* q (B, H, N, D), k and v (B, Hkv, S, D): passed as they are; Hkv < H (GQA/MQA) is
  handled by attnkit without repeating k and v.
* Masks: the mask interface (`attnkit_mask`, in `attnkit.integrations._hf_masks`) reads
  the mask function transformers composes for each layer. Causal, sliding-window (causal
  or not; alternating layers get theirs each), chunked (Llama 4), packed documents and key
  padding become an attnkit description (row intervals & documents), or, for a causal
  layer whose queries end at the last key, the padding alone (B, 1, 1, S) with
  ``causal=True`` here: no N x S mask is built and the kernels skip what is masked. Other
  patterns (overlays of image tokens, a user's mask function, static caches, compiled
  code) arrive as transformers' full boolean (B, 1, N, S) mask. Float masks (Swin's shift
  mask plus relative bias, user masks) are additive: `bias`.
* Packing without padding (``DataCollatorWithFlattening``): ``cu_seq_lens_q/k``, or
  position ids that restart, make each document attend only to itself, as the
  flash-attention backends do, so each document's outputs and gradients are those of the
  document alone. eager and sdpa let documents attend into each other whenever
  transformers does not see the packing (a cache, as in a decoder's default eval mode, or
  an encoder).
* ``softcap`` (Gemma 2's attn_logit_softcapping): cap · tanh(s / cap) on the scaled scores,
  computed block by block (`attnkit.score_mods.softcap`).
* Query rows that may attend to nothing (left padding in a decoder) give output 0
  here, where eager spreads them uniformly over the masked keys: they are padding,
  and no real token reads them.
* Unsupported and refused with a ValueError naming them: ``s_aux`` (attention sinks) and
  paged caches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from attnkit.functional import score_mods
from attnkit.functional.attention import attention
from attnkit.functional.structured import StructuredMask, document
from attnkit.integrations import _hf_checkpoint, _hf_masks
from attnkit.integrations._hf_masks import layer_mask as attnkit_mask
from attnkit.viz import record as _record
from attnkit.viz.labels import CONTINUATION, WORD_START

__all__ = [
    "NAME",
    "TextAttention",
    "TextEncoding",
    "attnkit_attention_forward",
    "attnkit_mask",
    "encode_text",
    "is_decoder",
    "load_checkpoint",
    "load_model",
    "load_tokenizer",
    "piece_text",
    "run_text",
    "text_attention",
]

NAME = "attnkit"


_UNSUPPORTED = {"s_aux": "attention sinks"}


def attnkit_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    position_bias: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """transformers' attention call, computed by `attnkit.attention`.

    query (B, H, N, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv); attention_mask
    boolean (True = may attend) or float (additive), broadcastable to (B, H, N, S).
    Returns (output (B, N, H, Dv), weights (B, H, N, S) or None): the weights only
    when the model asks for ``output_attentions``.
    """
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(
                f"attn_implementation='attnkit': {name}={kwargs[name]!r} ({what}) is not "
                f"supported by attnkit; load {type(module).__name__}'s model with "
                "attn_implementation='eager'"
            )
    if kwargs.get("cache") is not None:
        raise ValueError(
            "attn_implementation='attnkit': paged caches (cache=...) are not supported"
        )
    n = query.shape[2]
    causal_layer = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    mask, bias, causal = _mask_and_causal(attention_mask, bool(causal_layer) and n > 1)
    explicit = kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None
    if explicit or attention_mask is None or _unpadded_description(attention_mask):
        docs = _hf_masks.documents(kwargs, query.shape[0], n, key.shape[2])
        if docs is not None:  # packed sequences: each document attends only to itself
            docs = docs.to(query.device)
            if isinstance(mask, StructuredMask):
                mask = _hf_masks.with_documents(mask, docs)
            else:
                same = document(docs, causal=causal)
                mask = same if mask is None else same & mask
            causal = False
    if position_bias is not None:  # T5-style learned bias, (B or 1, H, N, S)
        bias = position_bias if bias is None else bias + position_bias
    softcap = kwargs.get("softcap")  # Gemma 2's attn_logit_softcapping: cap · tanh(s / cap)
    score_mod = score_mods.softcap(softcap) if softcap is not None else None
    sink = _record.recording_sink(module)
    need_weights = sink is not None or bool(kwargs.get("output_attentions", False))
    out, weights, _ = attention(
        query, key, value, mask=mask, bias=bias, causal=causal, scale=scaling,
        dropout_p=dropout, training=module.training, need_weights=need_weights,
        score_mod=score_mod,
    )  # fmt: skip
    if sink is not None:
        sink(weights)
    out = out.transpose(1, 2).contiguous()  # (B, H, N, Dv) -> (B, N, H, Dv)
    return out, weights if kwargs.get("output_attentions", False) else None


def _mask_and_causal(attention_mask, causal_layer: bool):
    """(mask, bias, causal) for `attention` from what the model passed as its mask.

    A description holds the whole pattern; a (B, 1, 1, S) boolean is the padding of a causal
    layer whose causality attnkit adds; a stride-0 view (B, 1, N, S) of one is the padding of
    a bidirectional layer (see `attnkit_mask`); any other boolean holds the whole pattern; a
    float mask is additive."""
    if attention_mask is None:
        return None, None, causal_layer
    if isinstance(attention_mask, StructuredMask):
        return attention_mask, None, False
    if attention_mask.dtype != torch.bool:
        return None, attention_mask, False
    if attention_mask.shape[-2] == 1:
        return attention_mask, None, causal_layer
    if attention_mask.stride(-2) == 0:
        return attention_mask[:, :, :1], None, False  # (B, 1, N, S) view -> (B, 1, 1, S)
    return attention_mask, None, False


def _unpadded_description(attention_mask) -> bool:
    """Position ids are read as packing (as flash-attention does) only where the batch holds no
    padding: a padded batch's position ids restart at its padding (generate's layout)."""
    return isinstance(attention_mask, StructuredMask) and not _hf_masks.is_padded(attention_mask)


def _claims(model: nn.Module) -> bool:
    """True if some part of `model` runs its attention through this backend."""
    for sub in model.modules():
        config = getattr(sub, "config", None)
        if getattr(config, "_attn_implementation", None) == NAME:
            return True
    return False


# --- A local checkpoint folder of any supported family, for `attnkit explain --checkpoint` ---

# Word-start / continuation marks of the sub-word families: WordPiece continues a word with
# "##", byte-level BPE (GPT-2, RoBERTa) starts one with "Ġ", SentencePiece (Llama) with "▁".
_MARKS = (CONTINUATION, *WORD_START)


def piece_text(token: str) -> str:
    """A token without its sub-word mark: "##ing" -> "ing", "Ġcat" -> "cat", "▁it" -> "it"."""
    for mark in _MARKS:
        if token.startswith(mark) and len(token) > len(mark):
            return token[len(mark) :]
    return token


@dataclass(frozen=True)
class TextEncoding:
    """One text (and optional pair) as the tokenizer of a checkpoint sees it.

    input_ids:  (1, N) token ids; attention_mask (1, N) ones (one text, no padding).
    tokens:     the N token strings, special tokens included.
    special:    N flags, True for the tokenizer's special tokens (<s>, [CLS], <|endoftext|>, ...).
    words:      (word as written in the text, index of its first token), in text order;
                special tokens are not words.
    unknown:    the pieces of the text the tokenizer could only map to its unknown token.
    """

    input_ids: Tensor
    attention_mask: Tensor
    tokens: list[str]
    special: list[bool]
    words: list[tuple[str, int]]
    unknown: list[str]


@dataclass(frozen=True)
class TextAttention:
    """What a checkpoint's attention does on one text (one example, no batch).

    tokens:  the N token strings the tokenizer produced (special tokens included).
    names:   module path of each attention layer, in the order the layers ran.
    maps:    per layer, (H, N, N) probabilities; causal (zero above the diagonal) for decoders.
    unknown: the pieces of the text the tokenizer could only map to its unknown token.
    decoder: True when the model is a causal language model.
    """

    tokens: list[str]
    names: list[str]
    maps: list[Tensor]
    unknown: list[str]
    decoder: bool


def _config(path: Path):
    import transformers

    if not (path / "config.json").is_file():
        raise ValueError(
            f"checkpoint: {str(path)!r} holds no config.json (not a transformers folder)"
        )
    try:
        return transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, KeyError, ValueError) as err:
        raise ValueError(f"checkpoint: cannot load {str(path)!r}: {err}") from err


def is_decoder(config: Any) -> bool:
    """True for a causal language model (``architectures`` ending in ``ForCausalLM`` or
    ``LMHeadModel``, or ``is_decoder`` set)."""
    archs = getattr(config, "architectures", None) or []
    return bool(getattr(config, "is_decoder", False)) or any(
        a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs
    )


def load_tokenizer(folder: str | os.PathLike[str]) -> Any:
    """The tokenizer saved in a local checkpoint folder (never downloads); ValueError naming
    the folder when it has none, `attnkit.models.checkpoint.CheckpointError` naming the file
    when one of its JSON files is damaged."""
    import transformers

    path = Path(folder)
    _config(path)
    try:
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # the tokenizers library raises plain Exception for bad JSON
        damaged = _hf_checkpoint.damaged_json(path)
        if damaged is not None:
            raise damaged from err
        if not isinstance(err, (OSError, KeyError, ValueError, TypeError)):
            raise
        raise ValueError(f"checkpoint: no usable tokenizer in {str(path)!r}: {err}") from err


def load_model(folder: str | os.PathLike[str]) -> nn.Module:
    """The model of a local checkpoint folder, in eval mode on the attnkit backend: a causal
    language model with its head (see `is_decoder`), anything else as its base model.

    Its weights must be the model's own: a tensor the model wants but the folder lacks, or
    one the folder holds for no part of it, is a `attnkit.models.checkpoint.CheckpointError`
    naming the folder (never random weights). Tolerated: task heads and a pooler the model
    does not use (`attnkit.models.checkpoint.check_keys`)."""
    import transformers

    path = Path(folder)
    config = _config(path)
    auto = transformers.AutoModelForCausalLM if is_decoder(config) else transformers.AutoModel
    return _hf_checkpoint.from_pretrained_checked(auto, path, attn_implementation=NAME).eval()


def load_checkpoint(folder: str | os.PathLike[str]) -> tuple[nn.Module, Any]:
    """(model in eval mode on the attnkit backend, tokenizer) from a local checkpoint folder.

    A causal language model (``architectures`` ending in ``ForCausalLM`` or ``LMHeadModel``)
    is loaded with its head, anything else as its base model. Never downloads (local files
    only). Raises ValueError naming the folder when it holds no loadable model or tokenizer.
    """
    return load_model(folder), load_tokenizer(folder)


def encode_text(tokenizer: Any, text: str, pair: str | None = None) -> TextEncoding:
    """Tokenize `text` (and `pair`) as the model expects it; see `TextEncoding`.

    Over-long text is an error (ValueError naming the token counts), never cut silently.
    """
    for name, value in (("text", text), ("pair", pair)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{name}: expected a non-empty string, got {value!r}")
    fast = bool(getattr(tokenizer, "is_fast", False))
    enc = tokenizer(text, pair, return_tensors="pt", return_offsets_mapping=fast)
    ids = enc["input_ids"]  # (1, N)
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and ids.shape[1] > limit:
        raise ValueError(
            f"text has {ids.shape[1]} tokens but the model takes at most {limit}: shorten it"
        )
    id_list = ids[0].tolist()
    tokens = tokenizer.convert_ids_to_tokens(id_list)
    special_ids = set(tokenizer.all_special_ids)
    special = [i in special_ids and i != tokenizer.unk_token_id for i in id_list]
    if fast:
        spans = [tuple(span) for span in enc["offset_mapping"][0].tolist()]
        sequence = enc.sequence_ids(0)  # 0 = text, 1 = pair, None = special
        words = _words_from_offsets(spans, enc.word_ids(0), sequence, special, (text, pair))
    else:
        spans, sequence = [], []
        words = _words_from_marks(tokens, special)
    unknown = []
    if tokenizer.unk_token_id is not None:
        for i, tok in enumerate(id_list):
            if tok == tokenizer.unk_token_id:
                if spans:
                    source = pair if sequence[i] == 1 else text
                    unknown.append(source[spans[i][0] : spans[i][1]])
                else:
                    unknown.append(tokens[i])
    mask = enc.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else mask
    return TextEncoding(ids, mask, tokens, special, words, unknown)


def _words_from_offsets(spans, word_ids, sequence, special, texts) -> list[tuple[str, int]]:
    """Words as written: the text between a word's first and last token (fast tokenizers)."""
    words: dict[tuple[int, int], list[int]] = {}  # (sequence, word id) -> token indices
    for i, (wid, seq) in enumerate(zip(word_ids, sequence, strict=True)):
        if wid is None or seq is None or special[i]:
            continue
        if texts[seq][spans[i][0] : spans[i][1]].strip():  # not a piece that is only a space
            words.setdefault((seq, wid), []).append(i)
    out = []
    for (seq, _), index in words.items():
        source = texts[seq]
        start = min(spans[i][0] for i in index)
        end = max(spans[i][1] for i in index)
        out.append((source[start:end].strip(), index[0]))
    return out


def _words_from_marks(tokens: list[str], special: list[bool]) -> list[tuple[str, int]]:
    """Words from the sub-word marks alone (slow tokenizers): "##" continues a word; with
    "Ġ" / "▁" marks, an unmarked piece continues the word before it."""
    starts = ("Ġ", "▁")
    uses_starts = any(t.startswith(starts) for t in tokens)
    out: list[tuple[str, int]] = []
    for i, tok in enumerate(tokens):
        if special[i]:
            continue
        continues = tok.startswith("##") or (uses_starts and not tok.startswith(starts))
        if continues and out and not special[i - 1]:
            word, first = out[-1]
            out[-1] = (word + piece_text(tok), first)
        else:
            out.append((piece_text(tok), i))
    return out


def text_attention(
    model: nn.Module, tokenizer: Any, text: str, pair: str | None = None
) -> TextAttention:
    """Run `text` through `model` while recording; see `TextAttention`."""
    enc = encode_text(tokenizer, text, pair)
    return run_text(model, enc)


def run_text(model: nn.Module, enc: TextEncoding) -> TextAttention:
    """Run an encoded text through `model` while recording every attention layer."""
    with torch.no_grad(), _record.record_attention(model) as rec:
        model(input_ids=enc.input_ids, attention_mask=enc.attention_mask)
    return TextAttention(
        tokens=enc.tokens,
        names=rec.names,
        maps=[m[0] for m in rec.layers()],  # (B, H, N, N) -> (H, N, N)
        unknown=enc.unknown,
        decoder=is_decoder(model.config)
        or type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")),
    )


AttentionInterface.register(NAME, attnkit_attention_forward)
AttentionMaskInterface.register(NAME, attnkit_mask)
_record.register_external(_claims)
