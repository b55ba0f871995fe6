"""BERT encoder (Devlin et al. 2019) built from attnkit modules; loads Hugging Face checkpoints.

Dimensions: B batch, N tokens, C hidden width, H heads, F intermediate width,
L layers.

Each layer is post-norm, as in the paper and the released checkpoints:
``x = LayerNorm(x + proj(attention(x)))`` (`attnkit.bert_self_attention`), then
``x = LayerNorm(x + fc2(act(fc1(x))))``. Attention maps leave the model only
through `attnkit.record_attention(model)`.

Checkpoint names (Hugging Face ``BertModel``, with or without a ``bert.``
prefix; ``LayerNorm.gamma/beta`` of TF-era files read as ``weight/bias``):

=====================================================  =============================================
Hugging Face                                           attnkit `BertEncoder`
=====================================================  =============================================
embeddings.word_embeddings.weight                      embeddings.word.weight
embeddings.position_embeddings.weight                  embeddings.position.weight
embeddings.token_type_embeddings.weight                embeddings.token_type.weight
embeddings.LayerNorm.{weight,bias}                     embeddings.norm.{weight,bias}
encoder.layer.{i}.attention.self.query.{weight,bias}   layers.{i}.attn.fn.in_proj.qkv.{weight,bias}
encoder.layer.{i}.attention.self.key.{weight,bias}       (rows of query, key, value concatenated:
encoder.layer.{i}.attention.self.value.{weight,bias}      weight (3C, C), bias (3C,))
encoder.layer.{i}.attention.output.dense.{weight,bias} layers.{i}.attn.fn.proj.{weight,bias}
encoder.layer.{i}.attention.output.LayerNorm.*         layers.{i}.attn.norm.*
encoder.layer.{i}.intermediate.dense.*                 layers.{i}.ff.fn.fc1.*
encoder.layer.{i}.output.dense.*                       layers.{i}.ff.fn.fc2.*
encoder.layer.{i}.output.LayerNorm.*                   layers.{i}.ff.norm.*
pooler.dense.*                                         pooler.dense.*
=====================================================  =============================================

``embeddings.position_ids`` and task heads (``cls.*``, ``classifier.*``) are ignored
(`attnkit.models.BertClassifier` reads ``classifier.*``). `BertEncoder.save_pretrained`
writes the same names back (`attnkit.models.bert_save`), so transformers loads the folder.

Packed batches: ``document_ids`` (B, N) put several documents in a row without padding; every
token attends to its own document only (`masks.document(ids)`, bidirectional), positions
restart at each document (`masks.document_positions`), and the pooler reads each document's
first token, so each document gets what it gets alone. Besides the learned table of the
checkpoints (``position_embedding_type="absolute"``) a BERT built here may have sinusoidal or
rotary positions (attnkit's own: such a model does not save as a transformers checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from attnkit.functional import masks
from attnkit.models import checkpoint as ckpt
from attnkit.models.bert_config import HF_ACTIVATIONS, QKV, BertConfig
from attnkit.modules._checks import per_token
from attnkit.modules.blocks import FeedForward, PostNormResidual
from attnkit.modules.classic import bert_self_attention
from attnkit.modules.embed import LearnedPositionalEmbedding, SinusoidalPositionalEncoding
from attnkit.modules.positions import RotaryEmbedding

__all__ = ["BertConfig", "BertEncoder", "BertOutput"]


@dataclass
class BertOutput:
    """What `BertEncoder.forward` returns.

    last_hidden_state: (B, N, C).
    hidden_states: L + 1 tensors (B, N, C): the embeddings, then each layer's output.
    pooler_output: (B, C) tanh(dense(hidden[:, 0])), or None without a pooler. With
        ``document_ids``: (D, C), one row per document at its first token, in the order the
        documents start (row by row), less those whose first token is padding.
    """

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...]
    pooler_output: Tensor | None


# A pytree node, so that torch.export, torch.compile and ONNX export flatten it like a tuple.
pytree.register_dataclass(BertOutput, serialized_type_name="attnkit.models.bert.BertOutput")


class BertEmbeddings(nn.Module):
    """LayerNorm(word + token_type + position), then dropout: ids (B, N) -> (B, N, C).

    `position` is the learned table (checkpoints), a sinusoidal one, or None (rotary: the
    layers rotate q and k instead)."""

    def __init__(self, config: BertConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        c, fk = config.hidden_size, {"device": device, "dtype": dtype}
        n, kind = config.max_position_embeddings, config.position_embedding_type
        self.word = nn.Embedding(config.vocab_size, c, padding_idx=config.pad_token_id, **fk)
        self.token_type = nn.Embedding(config.type_vocab_size, c, **fk)
        self.position: nn.Module | None = None
        if kind == "absolute":
            self.position = LearnedPositionalEmbedding(n, c, **fk)
        elif kind == "sinusoidal":
            self.position = SinusoidalPositionalEncoding(c, n, **fk)
        self.norm = nn.LayerNorm(c, eps=config.layer_norm_eps, **fk)
        self.drop = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor | None = None
    ) -> Tensor:
        """input_ids, token_type_ids (B, N), position_ids (B, N) or None (0 .. N-1)
        -> (B, N, C)."""
        x = self.word(input_ids) + self.token_type(token_type_ids)  # (B, N, C)
        if self.position is not None:
            x = self.position(x, position_ids=position_ids)
        return self.drop(self.norm(x))


class BertLayer(nn.Module):
    """Post-norm self-attention sublayer, then post-norm feed-forward: (B, N, C) -> (B, N, C)."""

    def __init__(self, config: BertConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        c, eps, drop = config.hidden_size, config.layer_norm_eps, config.hidden_dropout_prob
        fk = {"device": device, "dtype": dtype}
        heads = config.num_attention_heads
        rotary = None
        if config.position_embedding_type == "rotary":
            rotary = RotaryEmbedding(c // heads, **fk)
        self.attn = bert_self_attention(
            c,
            heads,
            attn_dropout=config.attention_probs_dropout_prob,
            hidden_dropout=drop,
            eps=eps,
            rotary=rotary,
            **fk,
        )
        act = HF_ACTIVATIONS[config.hidden_act]
        ff = FeedForward(c, config.intermediate_size, activation=act, **fk)
        self.ff = PostNormResidual(ff, nn.LayerNorm(c, eps=eps, **fk), drop)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | masks.StructuredMask | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """x (B, N, C), mask (B, 1, 1, N) True = may attend (or a structured mask such as
        `masks.document`) -> (B, N, C); `position_ids` (B|1, N): rotary positions (None:
        0 .. N-1; only with rotary positions)."""
        if position_ids is None:
            return self.ff(self.attn(x, mask=mask))
        return self.ff(self.attn(x, mask=mask, position_ids=position_ids))


class BertPooler(nn.Module):
    """tanh(dense(hidden[:, 0])): (B, N, C) -> (B, C)."""

    def __init__(self, config: BertConfig, *, device=None, dtype=None) -> None:
        super().__init__()
        c = config.hidden_size
        self.dense = nn.Linear(c, c, device=device, dtype=dtype)

    def forward(self, hidden: Tensor, starts: Tensor | None = None) -> Tensor:
        """hidden (B, N, C) -> (B, C) at each row's first token, or (D, C) at the D tokens
        where the boolean `starts` (B, N) is True (each document's first, in a packed batch)."""
        first = hidden[:, 0] if starts is None else hidden[starts]  # (B, C) or (D, C)
        return torch.tanh(self.dense(first))


class BertEncoder(nn.Module):
    """The BERT encoder: embeddings, `num_hidden_layers` `BertLayer`s, an optional pooler.

    `gradient_checkpointing`: in training, keep only each layer's input and recompute
    the layer in the backward pass (`torch.utils.checkpoint`, non-reentrant, dropout
    replayed with the same random numbers): less activation memory for about one more
    forward; the gradients are those of the plain run. A plain attribute, settable later.
    `device`, `dtype`: of the parameters, as for `torch.nn.Linear`.
    """

    def __init__(
        self,
        config: BertConfig,
        *,
        pooler: bool = True,
        gradient_checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.config = config
        self.gradient_checkpointing = bool(gradient_checkpointing)
        self.source_folder: Path | None = None  # set by from_pretrained; save copies its tokenizer
        self.embeddings = BertEmbeddings(config, **fk)
        self.layers = nn.ModuleList(
            BertLayer(config, **fk) for _ in range(config.num_hidden_layers)
        )
        self.pooler = BertPooler(config, **fk) if pooler else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> BertOutput:
        """Encode token ids.

        Args:
            input_ids: (B, N) integer ids, N <= max_position_embeddings.
            attention_mask: (B, N), Hugging Face convention **1 = real token,
                0 = padding**; padded keys get exactly zero attention. Padded
                query rows are computed like real ones and should be ignored.
            token_type_ids: (B, N) segment ids (0 = sentence A, 1 = B); default 0. In a
                packed batch, as given (each document's own, e.g. 0 then 1 for a pair).
            position_ids: (B, N) or (N,) positions (default 0 .. N-1, or restarting at each
                document with `document_ids`), as transformers' ``position_ids``.
            document_ids: (B, N) or (N,) integer document ids of a packed batch
                (`masks.document_ids(lengths)` makes them from lengths): each token attends
                to the tokens of its own document only (`masks.document(ids)`, a description
                the kernels read: nothing N × N is built), positions restart at each
                document, and `pooler_output` holds one row per document (see `BertOutput`).
                Each document then gets exactly what it gets alone. With `attention_mask`
                too, padding is masked as a key as well.
        """
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
            got = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids)
            raise ValueError(f"input_ids must have shape (B, N), got {got}")
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and t.shape != input_ids.shape:
                raise ValueError(
                    f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, "
                    f"got {tuple(t.shape)}"
                )
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        mask = None if attention_mask is None else masks.from_hf_attention_mask(attention_mask)
        starts = None  # (B, N) bool: each document's first token
        if document_ids is not None:
            docs = per_token(document_ids, *input_ids.shape, name="document_ids")  # (B|1, N)
            mask = masks.document(docs) & mask  # (B, 1, 1, N) padding, if any, ANDed in
            doc_pos = masks.document_positions(docs)  # (B|1, N)
            starts = (doc_pos == 0).expand_as(input_ids)
            if attention_mask is not None:
                starts = starts & (attention_mask != 0)
            position_ids = doc_pos if position_ids is None else position_ids
        x = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, N, C)
        rotary_pos = position_ids if self.config.position_embedding_type == "rotary" else None
        states = [x]
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            if recompute:
                x = checkpoint(layer, x, mask, rotary_pos, use_reentrant=False)
            else:
                x = layer(x, mask, rotary_pos)
            states.append(x)
        pooled = None if self.pooler is None else self.pooler(x, starts)
        return BertOutput(x, tuple(states), pooled)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | Path,
        *,
        pooler: bool | None = None,
        gradient_checkpointing: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **overrides,
    ) -> BertEncoder:
        """Load a Hugging Face BERT folder (config.json + model.safetensors or pytorch_model.bin).

        `pooler=None` keeps the pooler when the checkpoint has one. The weights
        are put on `device` (default: the default device) in `dtype` (default:
        the default dtype). `overrides` change config fields that set no shape
        (`OVERRIDABLE`: dropout rates, ``layer_norm_eps``, ...), e.g.
        ``hidden_dropout_prob=0.0``. Raises FileNotFoundError for a missing
        folder or file, ValueError for an unsupported config, an unknown
        override or a missing / mis-shaped tensor (naming the key). The model
        is returned in eval mode.
        """
        config_path, weights_path = ckpt.checkpoint_files(directory)
        config = BertConfig.from_json(config_path).with_overrides(**overrides)
        state = ckpt.strip_prefix(ckpt.load_weights(weights_path))
        model = load_encoder(cls, config, state, str(weights_path), pooler, device, dtype)
        model.gradient_checkpointing = bool(gradient_checkpointing)
        model.source_folder = Path(directory)
        return model.eval()

    def save_pretrained(self, directory: str | Path, *, tokenizer=None) -> Path:
        """Write a transformers ``BertModel`` folder that this class and
        ``transformers.AutoModel.from_pretrained`` both load: config.json,
        model.safetensors (in the parameters' dtype) and the tokenizer files (`tokenizer`'s,
        else copied from the folder this model was loaded from, else none). All or nothing:
        see `attnkit.models.checkpoint.write_folder`. Returns the folder."""
        from attnkit.models import bert_save

        return bert_save.save(self, directory, tokenizer=tokenizer)

    def resize_token_embeddings(self, num_tokens: int, *, mean_resizing: bool = True) -> None:
        """Give the word embedding `num_tokens` rows (`config.vocab_size` follows).

        Old rows are kept (the first `num_tokens` of them when shrinking). New rows
        are, as in transformers: with `mean_resizing` the mean of the old rows (its
        default; transformers adds noise of covariance 1e-9 x theirs, negligible and
        left out), else drawn from N(0, initializer_range^2). There is no tied
        output head in attnkit's BERT, so nothing else changes.
        """
        from attnkit.models import bert_save

        bert_save.resize_token_embeddings(self, num_tokens, mean_resizing=mean_resizing)


def load_encoder(cls, config, state, source, pooler, device, dtype) -> BertEncoder:
    """An encoder of class `cls` holding `state` (HF names, no ``bert.`` prefix)."""
    if config.position_embedding_type != "absolute":
        raise ValueError(
            f"{source}: position_embedding_type {config.position_embedding_type!r} is "
            "attnkit's own, not a transformers BERT checkpoint's: wanted 'absolute'"
        )
    if pooler is None:
        pooler = "pooler.dense.weight" in state
    # no random init: every parameter is loaded below
    with _SkipInit():
        model = cls(config, pooler=pooler, device="meta")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    device = torch.empty(0, device=device).device  # None: the default device
    ours = _from_hf(state, model, source)
    ours = {k: v.to(device, dtype).contiguous() for k, v in ours.items()}
    model.load_state_dict(ours, strict=True, assign=True)
    return model


class _SkipInit(torch.overrides.TorchFunctionMode):
    """`torch.nn.init` calls return their tensor untouched. On the meta device `normal_`
    has no kernel of its own: its Python decomposition imports torch._dynamo (~1 s, a
    third of `attnkit explain`) to initialise weights that are replaced right after."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def _from_hf(state: dict[str, Tensor], model: BertEncoder, source: str) -> dict[str, Tensor]:
    """Our state dict from HF names (see the module table), every shape checked; a tensor
    missing, or one of no part of the encoder (`ckpt.check_keys` says which are tolerated:
    heads, an unused pooler), is a `ckpt.CheckpointError`."""
    wanted = {k: v.shape for k, v in model.state_dict().items()}
    layers = {k.split(".")[2] for k in state if k.startswith("encoder.layer.")}
    count = max((int(i) for i in layers if i.isdigit()), default=-1) + 1
    if layers and count != len(model.layers):
        raise ckpt.CheckpointError(
            f"{source} holds weights for {count} layers, but config.json says "
            f"num_hidden_layers={len(model.layers)}: fix the config (nothing is dropped silently)"
        )
    c = model.config.hidden_size
    pairs = ckpt.hf_names(len(model.layers), model.pooler is not None)
    shapes = {hf: wanted[ours] for ours, hf in pairs.items()}
    for i in range(len(model.layers)):
        for n in QKV:  # one fused in_proj.qkv of ours is three of theirs
            shapes[f"encoder.layer.{i}.attention.self.{n}.weight"] = torch.Size((c, c))
            shapes[f"encoder.layer.{i}.attention.self.{n}.bias"] = torch.Size((c,))
    for hf in shapes.keys() & state.keys():  # a wrong shape is named before what is missing
        ckpt.take(state, hf, shapes[hf], source)
    ckpt.check_keys(source, shapes.keys() - state.keys(), state.keys() - shapes.keys())
    # (take: a pooler asked for with pooler=True but not in the file is named here)
    out = {ours: ckpt.take(state, hf, shapes[hf], source) for ours, hf in pairs.items()}
    for i in range(len(model.layers)):
        hf = f"encoder.layer.{i}.attention.self."
        for p in ("weight", "bias"):
            qkv = [state[f"{hf}{n}.{p}"] for n in QKV]
            out[f"layers.{i}.attn.fn.in_proj.qkv.{p}"] = torch.cat(qkv)  # (3C, C) or (3C,)
    return out
