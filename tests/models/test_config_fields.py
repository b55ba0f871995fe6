"""Saved configs load back through one check (`models.checkpoint.config_from_fields`): an
unknown field is refused with its name and the known ones, for every model kind."""

from __future__ import annotations

import pytest

from attnkit.models.rnn import RNNConfig, rnn_config_from_dict
from attnkit.models.transformer import TransformerConfig, config_from_dict
from attnkit.models.universal import UniversalConfig, universal_config_from_dict
from attnkit.models.vit import ViTConfig
from attnkit.models.vit import config_from_dict as vit_config_from_dict

CASES = [
    (TransformerConfig(src_vocab=11, tgt_vocab=11), config_from_dict),
    (RNNConfig(vocab=13), rnn_config_from_dict),
    (UniversalConfig(vocab=13), universal_config_from_dict),
    (ViTConfig(), lambda d: vit_config_from_dict("ViTConfig", d)),
]


@pytest.mark.parametrize(("config", "load"), CASES, ids=lambda c: type(c).__name__)
def test_round_trip_and_unknown_field_refused(config, load):
    fields = {k: getattr(config, k) for k in type(config).__dataclass_fields__}
    assert load(fields) == config
    name = type(config).__name__
    with pytest.raises(ValueError, match=rf"unknown {name} fields \['bogus'\]; known: \["):
        load({**fields, "bogus": 1})
