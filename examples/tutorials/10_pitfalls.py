# Made from docs/en/tutorials/10-pitfalls.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Pitfalls: how attention code goes wrong
#
# Attention is a few lines of code, and most mistakes in those lines do not crash: the
# shapes still match, the loss still goes down, and the model is quietly worse. This
# tutorial makes each classic mistake on purpose, shows what it does, shows the right
# version, and gives the check that catches it. Every check is a few lines you can put in
# a test.
#
# The mistakes:
#
# 1. the wrong scale;
# 2. softmax over the wrong axis;
# 3. splitting heads with a `view` but no transpose;
# 4. flattening a feature map into a layout that attends across the batch;
# 5. a head merge that forgets the head axis;
# 6. the wrong mask polarity;
# 7. masking with −1e9 in float16;
# 8. NaN from a row that may attend to nothing;
# 9. sequence-first data fed to batch-first code, so that the batch attends to itself.
#
# The reference for "right" is `attnkit.attention` and `attnkit.MultiHeadAttention`,
# which are themselves tested against float64 and against PyTorch.

# %%
import torch

import attnkit
from attnkit import masks

torch.manual_seed(0)
B, N, C, H = 2, 6, 32, 4  # batch, tokens, width, heads
d = C // H  # head width: 8
x = torch.randn(B, N, C)
q, k, v = torch.randn(3, B, H, N, d).unbind(0)  # each (B, H, N, d)


def report(name, got, want):
    err = (got - want).abs().max().item()
    print(f"{name:28} {'OK' if err < 1e-5 else f'WRONG (max |error| {err:.2f})'}")


def attend(q, k, v, scale):
    """softmax(q·kᵀ·scale)·v, written out."""
    return torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1) @ v


reference = attnkit.attention(q, k, v).out  # (B, H, N, d)

# %% [markdown]
# ## 1. The wrong scale
#
# The scores are divided by $\sqrt{d_k}$, the width of one **head** (Vaswani et al. 2017,
# §3.2.1):
#
# $$
# \text{Attention}(Q, K, V) = \text{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V.
# $$
#
# Dot products of $d_k$ random components have variance $d_k$, and dividing by $\sqrt{d_k}$
# brings them back to 1 so the softmax is not saturated. Two common slips: dividing by $d_k$
# (no square root), or by $\sqrt{C}$, the model width, in multi-head code.

# %%
report("scale 1/d_k", attend(q, k, v, 1 / d), reference)
report("scale 1/√C (model width)", attend(q, k, v, C**-0.5), reference)
report("scale 1/√d_k (head width)", attend(q, k, v, d**-0.5), reference)

# %% [markdown]
# ```text
# scale 1/d_k                  WRONG (max |error| 0.92)
# scale 1/√C (model width)     WRONG (max |error| 0.68)
# scale 1/√d_k (head width)    OK
# ```
#
# The check: compare with a trusted implementation on random inputs. A wrong scale does
# not break training outright (the projections can learn to compensate a constant), which
# is why it survives; it changes how sharp the attention starts and how it trains.
#
# ## 2. Softmax over the wrong axis
#
# Scores are (…, $N$ queries, $S$ keys). Each query distributes its attention over the
# **keys**, so the softmax runs over the last axis. `dim=-2` normalises over the queries
# instead: every key gets weights that sum to 1, which means nothing.

# %%
scores = q @ k.transpose(-2, -1) * d**-0.5  # (B, H, N, S)
wrong = torch.softmax(scores, dim=-2)
right = torch.softmax(scores, dim=-1)
print("dim=-2: rows sum to 1:", torch.allclose(wrong.sum(-1), torch.ones(B, H, N)))
print("dim=-1: rows sum to 1:", torch.allclose(right.sum(-1), torch.ones(B, H, N)))
report("softmax over the queries", wrong @ v, reference)

# %% [markdown]
# ```text
# dim=-2: rows sum to 1: False
# dim=-1: rows sum to 1: True
# softmax over the queries     WRONG (max |error| 1.03)
# ```
#
# The check: the weights of every query row sum to 1 (`weights.sum(-1)`), and with a
# causal mask, changing a *later* token must not change an earlier output.
#
# ## 3. Splitting heads with a view but no transpose
#
# The projection gives (B, N, C). Each head must get all $N$ tokens and its own $d$ channels:
# (B, N, C) → (B, N, H, d) → transpose → (B, H, N, d). Calling `.view(B, H, N, d)`
# directly gives the right shape but the wrong contents: "head 0" then holds the first
# $N \cdot d$ numbers of the tensor, which are the channels of the first tokens, rearranged.

# %%
mha = attnkit.MultiHeadAttention(C, H, qkv_bias=False, out_bias=False).eval()
wq, wk, wv = mha.in_proj.qkv.weight.chunk(3)  # each (C, C)
wo = mha.proj.weight


def mha_by_hand(x, split, merge):
    qh, kh, vh = (split(x @ w.T) for w in (wq, wk, wv))  # each (B, H, N, d)
    return merge(attnkit.attention(qh, kh, vh).out) @ wo.T  # (B, N, C)


def split_view(t):
    return t.view(B, H, N, d)  # wrong: reinterprets memory


def split_right(t):
    return t.view(B, N, H, d).transpose(1, 2)  # (B, N, C) -> (B, N, H, d) -> (B, H, N, d)


def merge_right(o):
    return o.transpose(1, 2).reshape(B, N, C)  # (B, H, N, d) -> (B, N, H, d) -> (B, N, C)


def merge_no_transpose(o):
    return o.reshape(B, N, C)  # wrong (section 5): (B, H, N, d) read as (B, N, H·d)


with torch.no_grad():
    want = mha(x)
    report("split with view only", mha_by_hand(x, split_view, merge_right), want)
    report("split with view + transpose", mha_by_hand(x, split_right, merge_right), want)

# %% [markdown]
# ```text
# split with view only         WRONG (max |error| 0.74)
# split with view + transpose  OK
# ```
#
# A second check needs no reference: without positions, attention is permutation
# equivariant — shuffle the tokens and the outputs shuffle the same way. A wrong split
# mixes tokens with channels and breaks it:

# %%
perm = torch.randperm(N)
with torch.no_grad():
    for name, split in [("view only", split_view), ("view + transpose", split_right)]:
        out = mha_by_hand(x, split, merge_right)
        shuffled = mha_by_hand(x[:, perm], split, merge_right)
        print(f"{name:17} equivariant:", torch.allclose(shuffled, out[:, perm], atol=1e-6))

# %% [markdown]
# ```text
# view only         equivariant: False
# view + transpose  equivariant: True
# ```
#
# ## 4. Flattening a feature map so that attention crosses the batch
#
# A CNN feature map is (B, C, h, w). Attention over its positions needs (B, P, C) with
# $P = hw$: `x.flatten(2).transpose(1, 2)`. Two wrong roads: `x.view(B, h * w, C)` (it
# reads channels as positions), and flattening batch and positions together into one
# sequence of $B \cdot P$ tokens, so that pixels of one image attend to pixels of another.

# %%
fmap = torch.randn(B, C, 3, 3)  # (B, C, h, w)
attn2d = attnkit.MultiHeadAttention(C, H).eval()


def layout_right(f):
    return f.flatten(2).transpose(1, 2)  # (B, C, h, w) -> (B, C, P) -> (B, P, C)


def layout_view(f):
    return f.view(B, -1, C)  # wrong: same shape (B, P, C), channels read as positions


def layout_one_sequence(f):
    return layout_right(f).reshape(1, -1, C)  # wrong: (1, B·P, C), one sequence for all


other = fmap.clone()
other[1] = torch.randn(C, 3, 3)  # change image 1 only
with torch.no_grad():
    for name, layout in [
        ("view", layout_view),
        ("one sequence", layout_one_sequence),
        ("flatten + transpose", layout_right),
    ]:
        first = attn2d(layout(fmap)).reshape(B, 9, C)[0]  # outputs of image 0
        again = attn2d(layout(other)).reshape(B, 9, C)[0]
        print(f"{name:20} image 0 unchanged when image 1 changes:", torch.equal(first, again))

# %% [markdown]
# ```text
# view                 image 0 unchanged when image 1 changes: True
# one sequence         image 0 unchanged when image 1 changes: False
# flatten + transpose  image 0 unchanged when image 1 changes: True
# ```
#
# The batch-independence check catches the second mistake: the outputs of one example
# must not move when another example changes. The `view` mistake keeps examples apart
# (each image still has its own rows) but scrambles them; the permutation check of
# section 3, on the pixels of one image, catches that one.
#
# ## 5. A merge that forgets the head axis
#
# The way back mirrors the split: (B, H, N, d) → transpose → (B, N, H, d) → (B, N, C).
# A bare `.reshape(B, N, C)` (`merge_no_transpose`, defined with the others in section 3)
# skips the transpose and has the right shape again.

# %%
with torch.no_grad():
    report("merge without transpose", mha_by_hand(x, split_right, merge_no_transpose), want)
    report("merge with transpose", mha_by_hand(x, split_right, merge_right), want)

# %% [markdown]
# ```text
# merge without transpose      WRONG (max |error| 0.62)
# merge with transpose         OK
# ```
#
# Same checks as section 3: against a trusted module, and permutation equivariance.
#
# ## 6. Mask polarity
#
# Libraries disagree on what `True` means. In `torch.nn.MultiheadAttention`'s
# `key_padding_mask`, **True = ignore**; in attnkit and `F.scaled_dot_product_attention`,
# **True = may attend**; in Hugging Face's `attention_mask`, **1 = keep**. Passing one as
# the other inverts the mask: the model attends *only* to padding.

# %%
lengths = torch.tensor([6, 4])  # the second sequence has 2 padding tokens
torch_kpm = torch.arange(N)[None, :] >= lengths[:, None]  # (B, S), torch: True = ignore
wrong = attnkit.attention(q, k, v, mask=torch_kpm[:, None, None, :], need_weights=True)
right = attnkit.attention(
    q, k, v, mask=masks.from_torch_key_padding_mask(torch_kpm), need_weights=True
)
print(
    "weight on padding keys, mask passed as is:",
    round(wrong.weights[1, ..., 4:].sum(-1).mean().item(), 3),
)
print("weight on padding keys, converted:        ", right.weights[1, ..., 4:].sum().item())
print(
    "same as masks.padding:",
    torch.equal(masks.from_torch_key_padding_mask(torch_kpm), masks.padding(lengths, N)),
)

# %% [markdown]
# ```text
# weight on padding keys, mask passed as is: 1.0
# weight on padding keys, converted:         0.0
# same as masks.padding: True
# ```
#
# The check: after the call, the weights on padding keys must be exactly 0. attnkit's
# converters (`masks.from_torch_key_padding_mask`, `from_hf_attention_mask`,
# `from_keras_attention_mask`, `from_zero_blocked`) make every convention explicit.
#
# ## 7. −1e9 in float16
#
# A classic way to mask is to add a large negative number to the blocked scores. In
# float16 the largest finite number is 65,504: $-10^9$ does not exist. `masked_fill` refuses
# it; an additive mask built in float16 silently becomes −inf, and then a row with
# nothing to attend to is $-\infty - (-\infty) = \text{NaN}$ inside the softmax.

# %%
print("largest float16:", torch.finfo(torch.float16).max)
print("-1e9 as float16:", torch.tensor(-1e9, dtype=torch.float16).item())
scores16 = scores.half()
keep = torch.ones(N, N, dtype=torch.bool).tril()  # causal, True = may attend
keep[0] = False  # query 0 may attend to nothing
try:
    scores16.masked_fill(~keep, -1e9)
except RuntimeError as error:
    print("masked_fill(-1e9):", str(error).split(" without")[0])
bias16 = (~keep).half() * -1e9  # additive mask in float16: -inf, not -1e9
print(
    "softmax with the -1e9 bias, query 0:",
    torch.softmax(scores16.float() + bias16, -1)[0, 0, 0].tolist(),
)

q16, k16, v16 = q.half(), k.half(), v.half()
out16 = attnkit.attention(q16, k16, v16, mask=keep).out  # boolean mask, applied with where
out32 = attnkit.attention(q, k, v, mask=keep).out
print(
    "attnkit float16: finite:",
    bool(torch.isfinite(out16).all()),
    " query 0 output:",
    out16[0, 0, 0].abs().max().item(),
)
print("close to float32 (within 0.01):", torch.allclose(out16.float(), out32, atol=1e-2))

# %% [markdown]
# ```text
# largest float16: 65504.0
# -1e9 as float16: -inf
# masked_fill(-1e9): value cannot be converted to type c10::Half
# softmax with the -1e9 bias, query 0: [nan, nan, nan, nan, nan, nan]
# attnkit float16: finite: True  query 0 output: 0.0
# close to float32 (within 0.01): True
# ```
#
# The check: run the masked path in the dtype you deploy (float16 / bfloat16) and assert
# the outputs are finite and close to a float32 run. attnkit never adds a literal: a
# boolean mask is applied with `where`, in any dtype.
#
# ## 8. NaN from a row that may attend to nothing
#
# Even with $-\infty$ instead of $-10^9$, a query whose every key is masked has a softmax of
# $0/0 = \text{NaN}$, and the NaN spreads to everything computed after it, gradients included.
# It happens in practice: a left-padded batch, a padded query in cross-attention, a
# sliding window with nothing in range. `torch.nn.MultiheadAttention` returns NaN there;
# attnkit returns 0 and a zero gradient.

# %%
key_mask = torch.zeros(B, N, dtype=torch.bool)  # torch: True = ignore
key_mask[1] = True  # sequence 1 may attend to nothing
theirs = torch.nn.MultiheadAttention(C, H, batch_first=True).eval()
with torch.no_grad():
    out_torch, _ = theirs(x, x, x, key_padding_mask=key_mask)
print("torch.nn.MultiheadAttention, NaN in sequence 1:", bool(out_torch[1].isnan().any()))

xs = x.clone().requires_grad_()
ours = attnkit.MultiHeadAttention(C, H)
out = ours(xs, mask=masks.from_torch_key_padding_mask(key_mask))
out.sum().backward()
print(
    "attnkit: NaN anywhere:",
    bool(out.isnan().any()),
    " gradient finite:",
    bool(xs.grad.isfinite().all()),
)
print(
    "attnkit: sequence 1 output = output projection bias only:",
    torch.allclose(out[1], ours.proj.bias.expand(N, C)),
)

# %% [markdown]
# ```text
# torch.nn.MultiheadAttention, NaN in sequence 1: True
# attnkit: NaN anywhere: False  gradient finite: True
# attnkit: sequence 1 output = output projection bias only: True
# ```
#
# The check: build a batch with one fully masked row and assert no NaN in the output and
# in the gradients. attnkit's contract is that such a row gets attention output 0 (here
# the output is just $W^O$'s bias) on every backend.
#
# ## 9. Sequence-first data in batch-first code
#
# `torch.nn.MultiheadAttention` and `nn.Transformer` take (N, B, C), sequence first, unless
# told `batch_first=True`; much classic PyTorch code does the same (fairseq's Transformer
# layers work on (N, B, C) inside; the original Transformer code, tensor2tensor, is batch-first). Attention code written for (B, N, C), like `attend` above or attnkit's modules, reads
# dim 0 as the batch. Given (N, B, C), it treats each *position* as an example and the B
# sequences as its tokens: the scores come out (N, B, B), and sequences attend to each other.
# Nothing fails, since every shape still matches.

# %%
seq_first = x.transpose(0, 1)  # (N, B, C): what a sequence-first pipeline hands over
for name, t in [("(B, N, C)", x), ("(N, B, C)", seq_first)]:
    print(f"scores from {name}:", tuple((t @ t.transpose(-2, -1)).shape))

layer = attnkit.MultiHeadAttention(C, H).eval()  # batch first, like every attnkit module
changed = x.clone()
changed[1] = torch.randn(N, C)  # change sequence 1 only
with torch.no_grad():
    wrong = layer(seq_first)[:, 0]  # reads (N, B, C) as N examples of B tokens each
    again = layer(changed.transpose(0, 1))[:, 0]
    print("wrong: sequence 0 unchanged when sequence 1 changes:", torch.equal(wrong, again))

    right = layer(seq_first.transpose(0, 1))  # fix 1: back to (B, N, C) before the layer
    unmoved = torch.equal(right[0], layer(changed)[0])
    alone = torch.allclose(right[0], layer(x[:1])[0], atol=1e-6)
    print(f"fix 1, transpose first: sequence 0 unchanged: {unmoved}, as if alone: {alone}")

    drop_in = attnkit.nn.MultiheadAttention(C, H).eval()  # torch's signature: batch_first=False
    out, _ = drop_in(seq_first, seq_first, seq_first)  # (N, B, C) in, (N, B, C) out
    one = seq_first[:, :1]  # (N, 1, C): sequence 0 alone
    alone = torch.allclose(out[:, :1], drop_in(one, one, one)[0], atol=1e-6)
    print(f"fix 2, a layer made for (N, B, C): out {tuple(out.shape)}, as if alone: {alone}")

# %% [markdown]
# ```text
# scores from (B, N, C): (2, 6, 6)
# scores from (N, B, C): (6, 2, 2)
# wrong: sequence 0 unchanged when sequence 1 changes: False
# fix 1, transpose first: sequence 0 unchanged: True, as if alone: True
# fix 2, a layer made for (N, B, C): out (6, 2, 32), as if alone: True
# ```
#
# The check is the batch-independence check of section 4: change one example and assert the
# others do not move. A shape check helps too: scores must be (…, N, S), and B ≠ N in the
# test batch, so that (N, B, B) cannot pass for (B, N, N). Pick the layout once at the boundary
# of your code and state it (attnkit's modules are always batch first; its
# `attnkit.nn.MultiheadAttention` keeps torch's `batch_first` flag).
#
# ## Summary
#
# | mistake | symptom | check |
# | --- | --- | --- |
# | wrong scale | trains, but differently | compare with a trusted implementation |
# | softmax over queries | weights do not sum to 1 per query | `weights.sum(-1) == 1` |
# | split heads with `view` only | tokens mixed with channels | compare with a module; permutation equivariance |
# | feature map as one sequence | images attend to each other | change one example, others must not move |
# | merge without transpose | heads mixed with tokens | compare with a module; permutation equivariance |
# | mask polarity | attends only to padding | weights on padding keys are 0 |
# | −1e9 in float16 | error, or −inf then NaN | run masks in float16, outputs finite |
# | fully masked row | NaN in output and gradients | one all-masked row in a test batch |
# | (N, B, C) into batch-first code | scores (N, B, B); sequences attend to each other | change one example, others must not move; B ≠ N in tests |
#
# ## Exercises
#
# 1. A causal mask built with `triu` instead of `tril` (True = may attend) lets each query see
#    the future instead of the past. Write the check that catches it without a reference.
#
# /// details | Answer
# Changing a later token must not change an earlier output:

# %%
tril = torch.ones(N, N, dtype=torch.bool).tril()  # key j <= query i
k2, v2 = k.clone(), v.clone()
k2[..., -1, :], v2[..., -1, :] = 1.0, 1.0  # change the last token's key and value
for name, keep in [("triu", tril.T), ("tril", tril)]:
    first = attnkit.attention(q, k, v, mask=keep).out[..., 0, :]  # query 0's output
    again = attnkit.attention(q, k2, v2, mask=keep).out[..., 0, :]
    print(f"{name}: query 0 unchanged when the last token changes:", torch.equal(first, again))


# %% [markdown]
# ```text
# triu: query 0 unchanged when the last token changes: False
# tril: query 0 unchanged when the last token changes: True
# ```
# ///
#
# 2. Write `batch_independent(fn, x)`, true when `fn`'s output for example 0 does not depend on
#    the other examples, and use it on the layer of section 9 fed both ways.
#
# /// details | Answer
# %%
def batch_independent(fn, x):
    """Whether fn's output for example 0 ignores the other examples of x (B, N, C)."""
    other = x.clone()
    other[1:] = torch.randn_like(other[1:])
    with torch.no_grad():
        return torch.equal(fn(x)[0], fn(other)[0])


print("batch first:", batch_independent(layer, x))
print("sequence first:", batch_independent(lambda t: layer(t.transpose(0, 1)).transpose(0, 1), x))

# %% [markdown]
# ```text
# batch first: True
# sequence first: False
# ```
# ///
#
# 3. Which scale does `torch.nn.functional.scaled_dot_product_attention` use when you give it
#    none? Check it with `report`.
#
# /// details | Answer
# $1/\sqrt{E}$ with $E$ the last dimension of the query, which for (B, H, N, d) inputs is the
# head width $d_k$:

# %%
sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # q, k, v: (B, H, N, d)
report("F.sdpa, default scale", sdpa, reference)

# %% [markdown]
# ```text
# F.sdpa, default scale        OK
# ```
#
# Called on (B, N, C) tensors before splitting heads it would use $1/\sqrt{C}$: the slip of
# section 1.
# ///
#
# 4. bfloat16 has float32's range. Does −1e9 work there? What does a row that may attend to
#    nothing get?
#
# /// details | Answer
# %%
print("-1e9 as bfloat16:", torch.tensor(-1e9, dtype=torch.bfloat16).item())
row = scores[0, 0, 0].bfloat16().masked_fill(torch.ones(N, dtype=torch.bool), -1e9)
print("softmax of a fully masked row:", [round(p, 3) for p in torch.softmax(row, -1).tolist()])

# %% [markdown]
# ```text
# -1e9 as bfloat16: -998244352.0
# softmax of a fully masked row: [0.167, 0.167, 0.167, 0.167, 0.167, 0.167]
# ```
#
# No NaN, and no error: the row attends evenly to keys it may not see, a wrong answer that
# nothing reports. attnkit gives that row 0 (section 8).
# ///
#
# ## Try next
#
# - attnkit's own tests do all of these checks on every backend: `tests/functional/` and
#   `tests/modules/` are worth reading.
# - Tutorial [06 — the Transformer](06-transformer.md) uses causal, padding and
#   cross-attention masks together; [09 — channel and spatial attention](09-channel-spatial.md)
#   flattens feature maps the right way.
# - API reference: [`attnkit.attention` and `attnkit.masks`](../api/core.md), and
#   [`MultiHeadAttention`](../api/modules.md).
