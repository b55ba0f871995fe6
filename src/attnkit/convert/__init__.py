"""Weights in and out of the implementations people already have.

Each peer has one module here with its parameter-name table in the module
docstring (and in docs/en/guides/interop.md). `from_torch`, `to_torch`, `from_keras` and
`to_keras` dispatch on the type of their argument to the right converter. Imports
go one way: converters import the modules they convert, never the reverse. A state
dict that does not fit raises ValueError naming each missing, unexpected or
mis-shaped key (got vs wanted shape).

* `attnkit.convert.torch_nn` — torch.nn.MultiheadAttention
* `attnkit.convert.torch_transformer` — torch.nn.TransformerEncoderLayer and
  TransformerDecoderLayer
* `attnkit.convert.torch_stack` — torch.nn.TransformerEncoder and TransformerDecoder (whole
  stacks, into `EncoderStack` / `DecoderStack`)

attnkit modules read (B, N, C): a sequence-first torch module (`batch_first=False`,
torch's default) is refused with a ValueError naming `batch_first`, unless
`batch_first=True` acknowledges the change of layout; `attnkit.nn.MultiheadAttention`
keeps torch's layout instead.
* `attnkit.convert.hf_vision` — Hugging Face ViTModel / ViTForImageClassification (whole
  model) and ViTLayer / SwinLayer (per layer)
* `attnkit.convert.hf_detr` — Hugging Face DetrModel / DetrForObjectDetection (the
  transformer, into `attnkit.models.DetrTransformer`)
* `attnkit.convert.hf_swin` — Hugging Face SwinModel (whole model, into
  `attnkit.vision.SwinModel`)
* `attnkit.convert.keras` — keras.layers.MultiHeadAttention, AdditiveAttention, Attention
  (Keras is imported only when a Keras function is called)
"""

from attnkit.convert._dispatch import from_keras, from_torch, to_keras, to_torch
from attnkit.convert.hf_detr import detr_transformer_from_hf, hf_detr_state, load_hf_detr_state
from attnkit.convert.hf_swin import (
    hf_swin_model_state,
    load_hf_swin_model_state,
    swin_config_from_hf,
    swin_from_hf,
)
from attnkit.convert.keras import (
    additive_from_keras,
    additive_to_keras,
    keras_causal,
    keras_masks,
    load_keras_mha_state,
    luong_from_keras,
    luong_to_keras,
    mha_from_keras,
    mha_keras_state,
    mha_to_keras,
)
from attnkit.convert.torch_decoder import (
    decoder_from_torch,
    decoder_masks_from_torch,
    decoder_to_torch,
    load_torch_decoder_state,
)
from attnkit.convert.torch_nn import load_torch_mha_state, mha_from_torch, mha_to_torch
from attnkit.convert.torch_stack import (
    DecoderStack,
    EncoderStack,
    decoder_stack_from_torch,
    decoder_stack_to_torch,
    encoder_stack_from_torch,
    encoder_stack_to_torch,
    load_torch_decoder_stack_state,
    load_torch_encoder_stack_state,
)
from attnkit.convert.torch_transformer import (
    encoder_from_torch,
    encoder_mask_from_torch,
    encoder_to_torch,
    load_torch_encoder_state,
)

__all__ = [
    "DecoderStack",
    "EncoderStack",
    "additive_from_keras",
    "additive_to_keras",
    "decoder_from_torch",
    "decoder_masks_from_torch",
    "decoder_stack_from_torch",
    "decoder_stack_to_torch",
    "decoder_to_torch",
    "detr_transformer_from_hf",
    "encoder_from_torch",
    "encoder_mask_from_torch",
    "encoder_stack_from_torch",
    "encoder_stack_to_torch",
    "encoder_to_torch",
    "from_keras",
    "from_torch",
    "hf_detr_state",
    "hf_swin_model_state",
    "keras_causal",
    "keras_masks",
    "load_hf_detr_state",
    "load_hf_swin_model_state",
    "load_keras_mha_state",
    "load_torch_decoder_stack_state",
    "load_torch_decoder_state",
    "load_torch_encoder_stack_state",
    "load_torch_encoder_state",
    "load_torch_mha_state",
    "luong_from_keras",
    "luong_to_keras",
    "mha_from_keras",
    "mha_from_torch",
    "mha_keras_state",
    "mha_to_keras",
    "mha_to_torch",
    "swin_config_from_hf",
    "swin_from_hf",
    "to_keras",
    "to_torch",
]
