# Made from docs/en/tutorials/04-masks.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Masks: who may attend to whom
#
# Attention lets every query look at every key. Often that is wrong: padding tokens
# are not words, a language model must not read the future, and a decoder should
# look at the real words of the source sentence only. A **mask** says, for each
# query and each key, whether the query may attend to that key.
#
# You will learn:
#
# - attnkit's one convention: a boolean mask, **True = may attend**, broadcast to (B, H, N, S);
# - padding masks, causal masks, and both at once, each drawn beside the attention weights it yields;
# - masks in cross-attention between a decoder and an encoder (and causal masks when $N \ne S$);
# - what happens to a query that may attend to nothing (0 in attnkit, NaN in `torch.nn.MultiheadAttention`);
# - the polarities of PyTorch, Keras and Hugging Face, and attnkit's converters.
#
# ## The convention, and a padding mask
#
# A mask enters attention before the softmax. Blocked pairs get $-\infty$ added to their
# scores, so their weights come out exactly 0 and the others are renormalised among themselves:
#
# $$
# \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}} + M\right) V,
# \qquad
# M_{ij} = \begin{cases} 0 & \text{query } i \text{ may attend to key } j \\ -\infty & \text{otherwise} \end{cases}
# $$
#
# (attnkit does this with `where` on the boolean mask, not by adding a large negative number.)
# Two sentences padded to 5 tokens: the first has 5 real tokens, the second 2. A
# mask is boolean, True where the query may attend to the key, and its shape
# broadcasts to (B, H, N, S): batch, heads, queries, keys. `masks.padding` gives
# (B, 1, 1, S): the same keys for every head and every query. The helper `show`
# prints a mask with ■ for "may attend" and · for "blocked".

# %%
import torch

import attnkit
from attnkit import masks

torch.manual_seed(0)


def show(mask2d):
    """Print a 2-D boolean mask: rows are queries, columns keys; ■ may attend, · blocked."""
    for row in mask2d.tolist():
        print("  " + " ".join("■" if allowed else "·" for allowed in row))


lengths = torch.tensor([5, 2])  # real tokens per sentence
pad = masks.padding(lengths, 5)  # (B, 1, 1, S): True = a real key
print("padding mask:", tuple(pad.shape))
print("sentence 2, as every query sees it:")
show(pad[1, 0].expand(5, 5))

# %% [markdown]
# ```text
# padding mask: (2, 1, 1, 5)
# sentence 2, as every query sees it:
#   ■ ■ · · ·
#   ■ ■ · · ·
#   ■ ■ · · ·
#   ■ ■ · · ·
#   ■ ■ · · ·
# ```
#
# The weights of blocked keys are exactly 0, so whatever sits in the padding cannot
# reach the real tokens. Check it: fill the padding with other numbers and compare.

# %%
mha = attnkit.MultiHeadAttention(16, 2).eval()  # width 16, 2 heads
x = torch.randn(2, 5, 16)  # (B, N, C)
with attnkit.record_attention(mha) as rec:
    y = mha(x, mask=pad)
row = rec["attend"][1, 0, 0]  # sentence 2, head 0, query 0: (S,)
print("weights of sentence 2, head 0, query 0:", [round(w, 4) for w in row.tolist()])

x_other = x.clone()
x_other[1, 2:] = torch.randn(3, 16)  # different padding content
y_other = mha(x_other, mask=pad)
print("real tokens unchanged:", torch.allclose(y[1, :2], y_other[1, :2]))

# %% [markdown]
# ```text
# weights of sentence 2, head 0, query 0: [0.4677, 0.5323, 0.0, 0.0, 0.0]
# real tokens unchanged: True
# ```
#
# The padded *queries* (the last three rows of sentence 2) still get outputs: they attend
# to the real keys. Nothing reads them if the loss and the next layers' keys ignore
# padding, which is what the mask does for the keys.
#
# ## Causal masks
#
# A language model predicts token $i + 1$ from tokens $0, \dots, i$, so query $i$ may attend
# to keys $j \le i$ only: the lower triangle. `causal=True` builds it inside the call;
# `masks.causal(n)` gives it as a tensor (1, 1, N, N).

# %%
causal = masks.causal(5)  # (1, 1, N, S)
print("causal mask:", tuple(causal.shape))
show(causal[0, 0])
y_flag = mha(x, causal=True)
print("causal=True is the same mask:", torch.allclose(y_flag, mha(x, mask=causal)))

x_future = x.clone()
x_future[:, 4] = torch.randn(2, 16)  # change the last token only
y_future = mha(x_future, causal=True)
print("earlier outputs unchanged:", torch.allclose(y_flag[:, :4], y_future[:, :4]))

# %% [markdown]
# ```text
# causal mask: (1, 1, 5, 5)
#   ■ · · · ·
#   ■ ■ · · ·
#   ■ ■ ■ · ·
#   ■ ■ ■ ■ ·
#   ■ ■ ■ ■ ■
# causal=True is the same mask: True
# earlier outputs unchanged: True
# ```
#
# Padding and causality together: `masks.combine` is a logical AND that broadcasts.
# (Passing `mask=pad, causal=True` does the same.)

# %%
both = masks.combine(pad, causal)  # (B, 1, N, S)
print("combined:", tuple(both.shape), "- sentence 2:")
show(both[1, 0])
y_both = mha(x, mask=both)
print("same as mask + causal=True:", torch.allclose(y_both, mha(x, mask=pad, causal=True)))

# %% [markdown]
# ```text
# combined: (2, 1, 5, 5) - sentence 2:
#   ■ · · · ·
#   ■ ■ · · ·
#   ■ ■ · · ·
#   ■ ■ · · ·
#   ■ ■ · · ·
# same as mask + causal=True: True
# ```
#
# ## Cross-attention: a decoder reads the encoder
#
# In an encoder-decoder Transformer, the decoder's queries (N target tokens) attend
# to the encoder's output (S source tokens). The keys are the source, so the mask is
# the **source** padding mask, (B, 1, 1, S), and it broadcasts over the N decoder
# queries. The decoder's own self-attention uses a causal mask (plus its own padding).

# %%
memory = torch.randn(2, 5, 16)  # encoder output (B, S, C): the padded source sentences
target = torch.randn(2, 3, 16)  # decoder states (B, N, C): 3 target tokens so far
cross = attnkit.MultiHeadAttention(16, 2).eval()
with attnkit.record_attention(cross) as rec:
    z = cross(target, memory, mask=pad)  # query from the decoder, keys/values from memory
print("decoder queries:", tuple(target.shape), " memory:", tuple(memory.shape))
print("out:", tuple(z.shape))
print("weights:", tuple(rec["attend"].shape), "(B, H, N, S) - sentence 2, head 0:")
for row in rec["attend"][1, 0]:
    print("  ", [round(w, 4) for w in row.tolist()])

# %% [markdown]
# ```text
# decoder queries: (2, 3, 16)  memory: (2, 5, 16)
# out: (2, 3, 16)
# weights: (2, 2, 3, 5) (B, H, N, S) - sentence 2, head 0:
#    [0.3417, 0.6583, 0.0, 0.0, 0.0]
#    [0.6316, 0.3684, 0.0, 0.0, 0.0]
#    [0.4912, 0.5088, 0.0, 0.0, 0.0]
# ```
#
# When $N \ne S$, a causal mask is aligned **bottom-right**: query $i$ sees keys
# $j \le i + S - N$. That is what decoding with a key/value cache needs: the 3 newest
# queries come after 2 cached tokens, so the last query sees every key.

# %%
show(masks.causal(3, 5)[0, 0])  # 3 new queries, 5 keys (2 of them cached)

# %% [markdown]
# ```text
#   ■ ■ ■ · ·
#   ■ ■ ■ ■ ·
#   ■ ■ ■ ■ ■
# ```
#
# All four kinds in one picture, each over the weights it yields (sentence 2, head 0).
# `attnkit.viz.plot_masks` draws a mask dark where the query may attend; below it, the
# weights are white where they are 0, and every blocked pair is white:

# %%
from attnkit.viz import plot_masks

with attnkit.record_attention(mha) as rec_self, attnkit.record_attention(cross) as rec_cross:
    mha(x, mask=pad)
    mha(x, causal=True)
    mha(x, mask=both)
    cross(target, memory, mask=pad)
panels = {
    "padding (sentence 2)": pad[1, 0].expand(5, 5),
    "causal": causal[0, 0],
    "causal + padding": both[1, 0],
    "cross: 3 queries, 5 keys": pad[1, 0].expand(3, 5),
}
weights = [w[1, 0] for w in rec_self.calls["attend"]] + [rec_cross["attend"][1, 0]]
for (title, m), w in zip(panels.items(), weights, strict=True):
    print(f"{title:25} blocked weights all 0: {bool((w[~m] == 0).all())}")
fig = plot_masks(panels, dict(zip(panels, weights, strict=True)), lang="en")
fig.savefig("masks.png", dpi=100)

# %% [markdown]
# ```text
# padding (sentence 2)      blocked weights all 0: True
# causal                    blocked weights all 0: True
# causal + padding          blocked weights all 0: True
# cross: 3 queries, 5 keys  blocked weights all 0: True
# ```
#
# ![Four masks (padding, causal, causal plus padding, cross-attention with 3 queries and 5 keys), each above the attention weights it yields: the blocked pairs have weight 0](../../assets/tutorials/04-masks/masks.png)
#
# ## A query that may attend to nothing
#
# If every key of a row is blocked (a sentence that is all padding, or the first
# queries of a causal mask with $N > S$), the softmax has nothing to normalise. In
# attnkit such a row gets attention output exactly 0 and gradient 0, on every
# backend. `torch.nn.MultiheadAttention` returns NaN there, and the NaN spreads
# into everything computed from it.

# %%
from attnkit.convert import from_torch

empty = masks.padding(torch.tensor([5, 0]), 5)  # sentence 2 has no real token at all
q = torch.randn(2, 2, 5, 8, requires_grad=True)  # (B, H, N, D)
k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
res = attnkit.attention(q, k, v, mask=empty)
res.out.sum().backward()
print("attnkit: output of the empty sentence is 0:", bool((res.out[1] == 0).all()))
print("attnkit: its gradient is 0:", bool((q.grad[1] == 0).all()))
print("attnkit: any NaN:", bool(res.out.isnan().any()))

torch_mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).eval()
ignore = torch.tensor([[False] * 5, [True] * 5])  # torch: True = ignore this key
theirs, _ = torch_mha(x, x, x, key_padding_mask=ignore)
print("torch.nn.MultiheadAttention: NaN in sentence 2:", bool(theirs[1].isnan().all()))
ours = from_torch(torch_mha).eval()  # the same weights
mine = ours(x, mask=masks.from_torch_key_padding_mask(ignore))
print("attnkit, same weights: sentence 1 equal:", torch.allclose(mine[0], theirs[0], atol=1e-6))
bias_only = ours.proj.bias.expand(5, 16)  # W_O·0 + b_O
print("attnkit, same weights: sentence 2 is the output bias:", torch.allclose(mine[1], bias_only))

# %% [markdown]
# ```text
# attnkit: output of the empty sentence is 0: True
# attnkit: its gradient is 0: True
# attnkit: any NaN: False
# torch.nn.MultiheadAttention: NaN in sentence 2: True
# attnkit, same weights: sentence 1 equal: True
# attnkit, same weights: sentence 2 is the output bias: True
# ```
#
# A module's output for such a row is $W_O \cdot 0 + b_O = b_O$, the output bias.
#
# ## Polarity: True means opposite things in different libraries
#
# The same padding, "sentence 2 has 2 real tokens", written in each library's own
# convention:
#
# | library | argument | shape | polarity | attnkit converter |
# | --- | --- | --- | --- | --- |
# | attnkit, `torch.nn.functional.scaled_dot_product_attention` | `mask` / `attn_mask` (bool) | broadcast to (B, H, N, S) | True = may attend | (none needed) |
# | `torch.nn.MultiheadAttention` | `key_padding_mask` | (B, S) | True = ignore | `masks.from_torch_key_padding_mask` |
# | `torch.nn.MultiheadAttention` | `attn_mask` (bool) | (N, S) or (B·H, N, S) | True = not allowed | `masks.from_torch_attn_mask` |
# | Hugging Face | `attention_mask` | (B, S) | 1 = keep, 0 = padding | `masks.from_hf_attention_mask` |
# | Keras `MultiHeadAttention` | `attention_mask` | (B, N, S) | 1 = attend | `masks.from_keras_attention_mask` |
# | the Annotated Transformer and others | `mask` | any | 0 = blocked | `masks.from_zero_blocked` |
#
# Every converter returns attnkit's convention, so all five give the same mask:

# %%
keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])  # 1 = real token
torch_attn_mask = (keep == 0)[:, None, None, :].expand(2, 2, 5, 5).reshape(4, 5, 5)  # (B·H, N, S)
converted = {
    "torch key_padding_mask": masks.from_torch_key_padding_mask(keep == 0),
    "torch attn_mask": masks.from_torch_attn_mask(torch_attn_mask, num_heads=2),
    "Hugging Face attention_mask": masks.from_hf_attention_mask(keep),
    "Keras attention_mask": masks.from_keras_attention_mask(keep[:, None, :].expand(2, 5, 5)),
    "mask == 0 is blocked": masks.from_zero_blocked(keep[:, None, None, :]),
}
full = pad.expand(2, 2, 5, 5)
for name, m in converted.items():
    same = torch.equal(m.expand(2, 2, 5, 5), full)
    print(f"{name:28} -> {tuple(m.shape)!s:14} same as masks.padding: {same}")

q, k, v = torch.randn(3, 2, 2, 5, 8).unbind(0)
sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=pad)
ours_out = attnkit.attention(q, k, v, mask=pad).out
print("SDPA with the same mask:", torch.allclose(sdpa, ours_out, atol=1e-6))

# %% [markdown]
# ```text
# torch key_padding_mask       -> (2, 1, 1, 5)   same as masks.padding: True
# torch attn_mask              -> (2, 2, 5, 5)   same as masks.padding: True
# Hugging Face attention_mask  -> (2, 1, 1, 5)   same as masks.padding: True
# Keras attention_mask         -> (2, 1, 5, 5)   same as masks.padding: True
# mask == 0 is blocked         -> (2, 1, 1, 5)   same as masks.padding: True
# SDPA with the same mask: True
# ```
#
# Two more rules keep masks honest. A float tensor is never a mask in attnkit: it is
# an additive `bias=`. And masks are applied with `where`, not by adding $-10^9$ to the
# scores, which overflows in float16.
#
# ## Structured masks: packed documents, sliding windows, prefix-LM
#
# The masks real training uses have structure. Several documents are **packed** into one row
# with no padding, and each one sees only itself; Mistral and Gemma use a **sliding window**
# of recent keys; a **prefix-LM** (UniLM's sequence-to-sequence mask, one of the architectures
# T5 compares in its ablations) sees its prefix bidirectionally and the rest causally. As an (N, S) tensor such a mask costs $N \cdot S$ booleans (4 GiB at $N = 65536$), and a
# kernel that is handed a tensor must score every entry before it throws most of them away.
#
# `attnkit.masks` describes these masks instead. A description means exactly its `.dense()`
# tensor, but on the CPU the chunked kernel reads the structure: it skips every block of the
# score grid that the mask hides, applies no mask to blocks that are fully visible, and checks
# the mask only inside the partial blocks. Time then follows the density.

# %%
n = 4096
ids = masks.document_ids([1024, 512, 1536, 1024])  # four documents packed in one row
packed = masks.document(ids, causal=True)  # a token sees earlier tokens of its own document
local = masks.window(n, 512, causal=True)  # each query sees its 512 most recent keys
prefix_lm = masks.prefix(n, 1024)  # the first 1024 positions see each other
print(masks.window(16, 4, causal=True))  # the text repr draws the block map

# %% [markdown]
# ```text
# window(4, causal)  (1, 1, 16, 16), density 0.227
# |█               |
# |██              |
# |███             |
# |████            |
# | ████           |
# |  ████          |
# |   ████         |
# |    ████        |
# |     ████       |
# |      ████      |
# |       ████     |
# |        ████    |
# |         ████   |
# |          ████  |
# |           ████ |
# |            ████|
# (blocks of 1×1)
# ```
#
# **Try it.** Build a 16 × 16 mask yourself: click cells to allow or hide a (query, key) pair,
# or start from one of attnkit's masks. The block map beside it sorts the 4 × 4 blocks as the
# chunked kernel does (█ computed without a mask, ░ computed and masked, blank skipped), and
# the density is the fraction of pairs that may attend.
#
# <div class="ak-play" data-play="mask"></div>
#
# The same kinds at $N = 16$, element by element, each over the weights it yields: three
# packed documents of 5, 4 and 7 tokens, a causal window of 4 keys, a prefix-LM whose first
# 6 positions see each other, and documents & window.

# %%
n_small = 16
ids_small = masks.document_ids([5, 4, 7])
small = {
    "documents (5, 4, 7)": masks.document(ids_small, causal=True),
    "window (4, causal)": masks.window(n_small, 4, causal=True),
    "prefix-LM (6)": masks.prefix(n_small, 6),
}
small["documents & window"] = small["documents (5, 4, 7)"] & small["window (4, causal)"]
q16, k16, v16 = torch.randn(3, 1, 1, n_small, 8).unbind(0)  # (B, H, N, D)
dense_small = {title: m.dense()[0, 0] for title, m in small.items()}  # (N, S) booleans
weights_small = {
    title: attnkit.attention(q16, k16, v16, mask=m, need_weights=True).weights[0, 0]
    for title, m in small.items()
}
for title, m in dense_small.items():
    w = weights_small[title]
    print(f"{title:20} blocked weights all 0: {bool((w[~m] == 0).all())}, "
          f"rows sum to 1: {torch.allclose(w.sum(-1), torch.ones(n_small))}")  # fmt: skip
fig = plot_masks(dense_small, weights_small, lang="en")
fig.savefig("structured-masks.png", dpi=100)

# %% [markdown]
# ```text
# documents (5, 4, 7)  blocked weights all 0: True, rows sum to 1: True
# window (4, causal)   blocked weights all 0: True, rows sum to 1: True
# prefix-LM (6)        blocked weights all 0: True, rows sum to 1: True
# documents & window   blocked weights all 0: True, rows sum to 1: True
# ```
#
# ![Packed documents, a causal sliding window, a prefix-LM and documents & window at 16 tokens, each above its attention weights: each document is a causal triangle of its own, the window a band of 4, the prefix a full square followed by a triangle](../../assets/tutorials/04-masks/structured-masks.png)
#
# They combine with `&` and `|`, with each other and with boolean tensors (a padding mask, say),
# and every function that takes a mask takes them, with the meaning of `.dense()`:

# %%
q, k, v = torch.randn(3, 1, 4, n, 32).unbind(0)  # (B, H, N, D)
described = {"documents": packed, "window": local, "prefix-LM": prefix_lm,
             "documents & window": packed & local}  # fmt: skip
for name, m in described.items():
    fast = attnkit.attention(q, k, v, mask=m).out
    dense = attnkit.attention(q, k, v, mask=m.dense()).out
    print(f"{name:18} density {m.density:.3f}  same as its dense mask: "
          f"{torch.allclose(fast, dense, atol=1e-5)}")  # fmt: skip

# %% [markdown]
# ```text
# documents          density 0.141  same as its dense mask: True
# window             density 0.117  same as its dense mask: True
# prefix-LM          density 0.531  same as its dense mask: True
# documents & window density 0.094  same as its dense mask: True
# ```
#
# The block map shows what a kernel does with each (query block, key block): white blocks
# are never computed, light ones are masked inside, dark ones need no mask at all.

# %%
import matplotlib.pyplot as plt

from attnkit.viz import plot_block_map

fig, axes = plt.subplots(2, 2, figsize=(8.5, 9))
shown = [local, packed, prefix_lm, packed & local]
for i, (ax, m) in enumerate(zip(axes.flat, shown, strict=True)):
    plot_block_map(m, 256, ax=ax, legend=i >= 2, lang="en")  # the legend under the bottom row only
fig.tight_layout(h_pad=2)
fig.savefig("block-maps.png", dpi=100)

# %% [markdown]
# ![Block maps of a sliding window, four packed documents, a prefix-LM and documents & window: the kernel computes 18 %, 17 %, 55 % and 14 % of the blocks](../../assets/tutorials/04-masks/block-maps.png)
#
# Any other pattern is a predicate of positions, evaluated a chunk of blocks at a time
# (FlexAttention's `mask_mod`, without a compiler): it receives index tensors and must use tensor operations,
# and it must be deterministic (the blocks it hides are worked out once and kept).

# %%
span, stride = 64, 4  # every 4th of the last 64 keys


def dilated(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < span) & ((q_idx - kv_idx) % stride == 0)


sparse = masks.from_function(dilated, n)
print(f"dilated: density {sparse.density:.4f}")
print("same as its dense mask:", torch.allclose(
    attnkit.attention(q, k, v, mask=sparse).out,
    attnkit.attention(q, k, v, mask=sparse.dense()).out, atol=1e-5))  # fmt: skip

# %% [markdown]
# ```text
# dilated: density 0.0039
# same as its dense mask: True
# ```
#
# A predicate must be **deterministic**: a mask's plan (which blocks are skipped, the booleans
# of the partial ones) is computed on its first use and kept on the mask, as FlexAttention keeps
# a `BlockMask`. attnkit evaluates the first chunk of blocks twice and refuses a predicate whose
# answers differ (random draws); a predicate that reads a tensor you change later keeps its old plan, so
# build a new mask after changing it.
#
# ### Masks that skip in another order
#
# The kernel computes the whole 64-key band of the mask above, of which it uses one key in four.
# Worse, a video model's "temporal" attention (each token sees its own place in every frame)
# touches every block of the grid though it allows one key in 256, and a 2-D neighbourhood on an
# image (NATTEN) spreads each query's keys over 15 rows of the image. Put the tokens in another order and they are
# block-sparse: sorted by their residue, a dilated window is a band within each residue class
# and a strided mask a set of contiguous documents; in tiles of the image (8 × 8, and 4 × 4 for
# 7 × 7 and 9 × 9 neighbourhoods, where that computes about half the entries), a
# neighbourhood touches a few blocks per query block. These constructors carry that order: the
# chunked backend gathers k and v into it and attends, the compiled kernel reading each query
# and writing its output where the token lies (the PyTorch kernel gathers q too and puts the
# outputs back; the same numbers and gradients either way; with a bias, dropout or
# `causal=True`, which follow the token positions, the mask runs in token order: exact, without
# the speed-up). Where the dilation or
# stride divides N nothing is gathered: token t·g + r is position t of residue class r, so the
# classes are g interleaved sequences of N/g tokens, attended in one call that the compiled
# kernel reads in place (a window within each sequence, or all of it).

# %%
dil = masks.dilated_window(n, 16, 4, causal=True)  # 16 keys back, one in 4
frames = masks.strided(n, 256)  # 16 frames of 256 tokens: each place in every frame
natten = masks.neighborhood_2d(64, 64, 15)  # a 64 × 64 image, 15 × 15 neighbourhoods
for name, m in {"dilated": dil, "strided": frames, "2-D neighbourhood": natten}.items():
    same = torch.allclose(
        attnkit.attention(q, k, v, mask=m).out,
        attnkit.attention(q, k, v, mask=m.dense()).out,
        atol=1e-5,
    )
    print(f"{name:17} density {m.density:.4f}  same as its dense mask: {same}")  # fmt: skip

# %% [markdown]
# ```text
# dilated           density 0.0039  same as its dense mask: True
# strided           density 0.0039  same as its dense mask: True
# 2-D neighbourhood density 0.0549  same as its dense mask: True
# ```
#
# For a predicate of your own, `masks.reorder(masks.from_function(fn, n), order)` computes it in
# the token order `order` (a permutation: position a holds token `order[a]`); choose one that puts
# tokens that attend to each other side by side.
#
# How each pattern is skipped, and what it costs per allowed (query, key) pair against the dense
# kernel's time per pair (forward, 1 thread, B=1, H=8, N=4096, D=64, float32, on an AMD EPYC
# Zen 4 shared with other jobs: ratios from one run, ±30 %, or the range of two runs where a
# range is given; 1.0 = time follows the density):
#
# | pattern | how the kernel skips it | before | now |
# | --- | --- | ---: | ---: |
# | causal, prefix-LM, windows, contiguous documents, their `&`, `\|` of overlapping ones | row intervals: each query block computes its rows' key span only; query blocks of 16–128 rows sized to the spans | causal 1.12, prefix-LM 1.24, window 256 1.66 | 1.10, 1.01, 1.34 |
# | narrow windows of 9 / 17 keys (`window(n, 5)` / `window(n, 9)`) | row by row: a block whose rows each see at most 64 keys (backward: 32) of a wider span computes each row over its own keys, without matrix products, four rows at a time, fetching the next rows ahead; such windows keep blocks of 128 rows (a block's set-up paid once for them); with nothing else on the scores, rows of up to 32 keys (16 on AVX2) stay in registers from the product to the output | 3.9–4.6 / 2.6–2.8 | 3.1–3.5 / 2.3–2.7 |
# | `\|` of those with gaps between them: a window `\|` a band 1024 keys away, a causal window of 256 `\|` the first 64 keys, two bands far from the diagonal (half-widths 128) | runs of keys: a row sees up to 16 disjoint runs; a query block computes the stretches of keys its rows' runs cover, each row masked to its own runs | on tiles: 1.70–1.74, 1.42–1.55, 1.75–1.79 | 1.35–1.43, 1.48–1.70, 1.43–1.52 |
# | predicates, scattered documents, `\|` with a predicate or of more than 16 runs | tiles: empty blocks skipped, full ones unmasked, partial ones masked, on the grid (128 × 256 down to 16 × 32) that computes the fewest entries | window 2048 `\|` first 256 keys 1.21 | 1.07 (now runs) |
# | `dilated_window` (128 keys, dilation 4) | interleaved sequences, read in place: a window within each | 1.8 | 1.5–1.7 |
# | `strided` (frames of 64 / 256 tokens) | interleaved sequences, read in place: all of each, the next sequence's rows fetched ahead; sequences of at most 32 tokens as tiles (next row) | 1.7–2.1 / 4.8–5.6 | 1.6–1.7 / 2.8–3.0 |
# | documents of 8–32 tokens, frames of at most 32 tokens (`strided` 1/256) | tiles of 8 rows: where each 8 rows of a block span at most 32 keys, their scores are one small product held in registers (a row a vector lane) and their softmax is taken lane by lane; the backward computes the same tiles, its five products as small register-tiled products, dK and dV summed over the block (forward + backward of documents of 16: 4.0 → 3.3) | documents of 16: 4.7–4.8 | 2.4–2.5 |
# | `neighborhood_2d` (15 × 15 on 64 × 64) | reordered in 8 × 8 tiles: tiles (as 15 runs of 15 keys in row-major order it costs 5.8: a query block spans 46 keys of each of its 15 rows of keys). The tile is chosen per kernel from the estimated cost of its blocks: 7 × 7 and 9 × 9 take 4 × 4 tiles (forward 8.5 → 6.4 and 5.4 → 4.2; 7 × 7 forward + backward 12.2 → 6.5), 15 × 7 takes 8 × 4 (4.6 → 3.8). Only k and v are gathered (the kernel reads the queries where they lie), and a query tile's adjacent key tiles are one matrix product (three of them instead of 7.6): against the previous version in the same runs 3.0–3.2 → 2.5–2.65 (forward + backward 2.7 → 2.4–2.5) | 4.3 | 2.5–2.65 |
# | `neighborhood_2d` in token order (15 × 15 on 64 × 64; with gradients too on AVX-512 and AVX2 builds) | in token order, offsets: each query's 15 runs of 15 keys, 8 queries of an image row a tile (a vector lane each) sharing their runs shifted by one key, so each key is addressed by its offset from the query and every multiply-add of the product computes 8 allowed entries, over the keys transposed once; border tiles mask each lane to its own runs (1.05–1.12 entries computed per allowed one). The backward does the same: each tile's S and dP~ by offset, dQ each query over its own keys, dK and dV as each key's sum over the offsets of the queries that see it, in vector lanes of 8 keys (border tiles add theirs row by row); forward + backward 15 × 15 on 64 × 64 0.85–0.90× and on 128 × 128 0.80–0.82× the reordered time, 7 × 7 0.41–0.44× and 0.57–0.59× (AVX2 build: 0.88× and, 7 × 7 on 64 × 64, 0.56×); a training step still costs 3.7–4.1× the token-order forward. Forward in the same runs: 128 × 128 3.35 → 2.12, 7 × 7 on 64 × 64 6.94 → 2.51 and on 128 × 128 6.66 → 2.46 | 3.20 (reordered) | 1.79 |
#
# What these sparsest masks cost is mostly the cost of touching every row at all. In the same
# units: reading q, k and v once and writing the output (one fused torch op) takes 0.8–0.9 at 9
# keys a row, 0.4–0.5 at 17 keys or one key in 256; the call itself 0.4–0.5 at 9 keys (it no
# longer reads q for the non-finite rule where the lse is finite, which vouches for q: 4–8 % of
# these forwards; the table's window and strided rows are measured so); the
# kernel's row path with one key a row 2.8–3.3 (a row's fixed cost: its query, keys and output
# fetched, its maximum, exponentials, sum and logarithm, ~70 ns); each further key adds about
# 1.5× what a pair costs in the dense kernel. A window of 9 keys costs 1.2–1.6× that one-key
# floor: 2× its density is out of reach. Where its ~95 ns a row go (removing one part at a
# time from a build of the kernel): the products q kᵀ ~40 ns and P v ~19 ns, the rest its
# loads, stores, softmax and set-up; those 72 multiply-adds of 16 lanes alone take ~25 ns at
# this core's one a cycle, and reading q, k, v and writing the output ~23 ns, against ~54 ns
# a row for 2× the density. Peers do no better on the same work
# (`benchmarks/bench_narrow.py --peers`, same units): SDPA on the tokens cut into independent
# documents of 8 / 16 (a batch of tiny sequences, no mask) costs 9.5–11.5 / 3.8–4.6 forward
# and 11.3–11.4 / 4.9–5.8 forward + backward (80 / 32 ns an allowed entry on a quiet run; the
# window of 9 keys 27 ns), and compiled FlexAttention's forward on the window of 9 keys 56–67
# (its blocks of 128 × 128 are computed whole, then masked). A strided mask this
# sparse (one key in 256) reads a sequence's 16 rows 64 KiB apart, beyond the hardware
# prefetcher: the kernel fetches the next sequence's rows while one computes. Forward + backward
# against the dense forward + backward, the same runs: windows of 9 / 17 keys 6.4–6.8 / 3.9–4.1
# → 5.0–5.4 / 3.1–3.3 (now 4.3–4.4 / 2.85–3.0), strided 1/256 4.6–5.0 → 3.8–3.9, strided 1/64 1.7 → 1.5, the dilated
# window 1.5 → 1.4 (reading q, k, v, the output and its gradient once and writing the three
# gradients: 1.2 at 9 keys, 0.65–0.7 at 17 keys and 1/256). Building a plan evaluates a
# predicate on every (query, key) pair once, in chunks of whole blocks of about 512K pairs, and
# keeps only the partial blocks: a band predicate (`(kv - q).abs() < 32`) at N = 65536
# (4.3 · 10⁹ pairs) is planned in 8.5 s on one core, about what torch takes to evaluate the
# predicate alone, with 48 MiB of tensors at its peak (the dense mask: 4 GiB).
#
# `masks.document_ids(lengths)` takes the per-document lengths that flash-attn's `cu_seqlens`
# holds. [Language models](../guides/language-models.md) trains on packed rows.
#
# What the skipping is worth, measured with `attnkit bench --structured` (its table, as
# written): the description runs the forward pass 1.8–2.7× faster than compiled FlexAttention
# with the equivalent block mask, and forward + backward (which FlexAttention does not have on
# the CPU) 9–55× faster than the same mask as a tensor wherever at most a tenth of the pairs may
# attend; a causal or prefix-LM mask, half the grid, still runs about twice as fast.
#
# --8<-- "benchmarks/results/structured.md"
#
# The whole zoo, with score functions, on an AMD EPYC Zen 4 (AVX-512; N = 4096 and 16384, 1
# and 2 threads, 3 repeats, one run of `attnkit bench --structured --sizes 4096 16384` on a
# quiet machine, except that the test suite ran beside the one-thread rows). Every row's forward
# beats compiled FlexAttention's, 1.35× (full documents, 2 threads) to 134× (strided, N =
# 16384); ALiBi and the T5 table as score functions run about twice as fast as SDPA given the
# same bias as a dense tensor; forward + backward costs at most 3.5× the forward on 36 of the 44 rows, 3.52–3.62× on five,
# 3.84× for prefix-LM at N = 16384 on one thread and 3.91–3.96× for the strided mask at N =
# 16384: the backward's five matrix products per
# block against the forward's two put this kernel's floor near 3.3–3.5×.
#
# --8<-- "benchmarks/results/epyc-zen4-avx512/structured.md"
#
# ## Exercises
#
# **1.** Build the causal sliding window of 3 keys over 6 tokens by hand, from `torch.arange`, and
# compare it with `masks.window(6, 3, causal=True).dense()`.
#
# /// details | Answer
# %%
i = torch.arange(6)[:, None]  # query positions, a column
j = torch.arange(6)[None, :]  # key positions, a row
by_hand = (j <= i) & (i - j < 3)  # the past only, and at most 2 steps back
print("same as masks.window:", torch.equal(by_hand, masks.window(6, 3, causal=True).dense()[0, 0]))
show(by_hand)

# %% [markdown]
# ```text
# same as masks.window: True
#   ■ · · · · ·
#   ■ ■ · · · ·
#   ■ ■ ■ · · ·
#   · ■ ■ ■ · ·
#   · · ■ ■ ■ ·
#   · · · ■ ■ ■
# ```
# ///
#
# **2.** A prefix-LM is "causal, except that the prefix is bidirectional". Write
# `masks.prefix(6, 2)` as a causal mask OR-ed with one more condition on the key.
#
# /// details | Answer
# Queries inside the prefix must also see the later prefix keys; queries after the prefix
# already see every prefix key through the causal part. So the extra condition is "the key is
# in the prefix", $j < p$, for every query:

# %%
prefix_by_hand = masks.causal(6)[0, 0] | (torch.arange(6) < 2)[None, :]  # (N, S)
print("same as masks.prefix:", torch.equal(prefix_by_hand, masks.prefix(6, 2).dense()[0, 0]))

# %% [markdown]
# ```text
# same as masks.prefix: True
# ```
# ///
#
# **3.** `masks.causal(5, 3)` has more queries than keys. Which queries may attend to nothing, and
# what does `attnkit.attention` give them?
#
# /// details | Answer
# Bottom-right alignment lets query $i$ see keys $j \le i + S - N = i - 2$, so queries 0 and 1
# see no key at all. Their rows are fully masked: output 0, never NaN.

# %%
more_queries = masks.causal(5, 3)
show(more_queries[0, 0])
q5, k3, v3 = torch.randn(1, 1, 5, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
out5 = attnkit.attention(q5, k3, v3, mask=more_queries).out  # (B, H, N, D)
print("queries 0 and 1 give 0:", bool((out5[0, 0, :2] == 0).all()))
print("any NaN:", bool(out5.isnan().any()))

# %% [markdown]
# ```text
#   · · ·
#   · · ·
#   ■ · ·
#   ■ ■ ·
#   ■ ■ ■
# queries 0 and 1 give 0: True
# any NaN: False
# ```
# ///
#
# **4.** The padded queries of sentence 2 still attend to its two real keys. Mask them as queries
# too (a (B, 1, N, 1) mask, combined with the key padding): what does the module output there?
#
# /// details | Answer
# `pad.transpose(-1, -2)` is the same padding along the queries. Combined, the padded rows
# are fully masked, so their attention output is 0 and the module writes the output bias
# $b_O$ there; the real tokens do not change.

# %%
both_ways = masks.combine(pad, pad.transpose(-1, -2))  # (B, 1, N, S)
show(both_ways[1, 0])
y_both_ways = mha(x, mask=both_ways)
print("padded queries give the output bias:",
      torch.allclose(y_both_ways[1, 2:], mha.proj.bias.expand(3, 16)))  # fmt: skip
print("real tokens unchanged:", torch.allclose(y_both_ways[1, :2], y[1, :2]))

# %% [markdown]
# ```text
#   ■ ■ · · ·
#   ■ ■ · · ·
#   · · · · ·
#   · · · · ·
#   · · · · ·
# padded queries give the output bias: True
# real tokens unchanged: True
# ```
# ///
#
# ## Try next
#
# - `masks.window(8, 3)` (local attention), with `causal=True` too: `show` its `.dense()[0, 0]`.
#   (`masks.sliding_window(8, 3)` builds that dense tensor directly: fine at 8 tokens, 1 GiB at
#   32768, where it warns; `masks.window` is the one to pass to `attention`.)
# - Give a 2-D mask of shape (2, 5) to `attnkit.attention` with a batch of 2 and
#   N = 2: it is refused as ambiguous, with the 4-D spellings of both readings.
# - [Positional encoding](05-positions.md): attention alone does not know the order of the tokens.
