"""The tiny BERT config.json fields the model tests build random checkpoints from."""

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
