"""The tiny BERT config.json fields the model tests build random checkpoints from, and a
padded batch for it."""

import torch

TINY = {
    "model_type": "bert",
    "vocab_size": 99,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
    "hidden_act": "gelu",
}


def tiny_batch(*, token_types: bool = False) -> dict[str, torch.Tensor]:
    """Four rows of 10 ids, rows 1 and 3 padded after 6 and 2 tokens; with `token_types`,
    a second segment from position 5 (0 on padding)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, TINY["vocab_size"], (4, 10), generator=g)  # (B, N)
    keep = torch.ones_like(ids)
    keep[1, 6:] = 0
    keep[3, 2:] = 0
    batch = {"input_ids": ids.masked_fill(keep == 0, 0), "attention_mask": keep}
    if token_types:
        types = torch.zeros_like(ids)
        types[:, 5:] = 1
        batch["token_type_ids"] = types * keep
    return batch
