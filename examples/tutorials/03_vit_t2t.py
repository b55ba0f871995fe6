# Made from docs/en/tutorials/03-vit-t2t.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # ViT and T2T-ViT: attention that changes the width
#
# A Vision Transformer (ViT) cuts an image into patches and lets the patches attend
# to each other. T2T-ViT ("Tokens-to-Token", Yuan et al. 2021) first builds better
# tokens: it cuts the image into *overlapping* pieces and runs an attention whose
# output is **wider than its input**, 49 → 64 here. That one change moves the skip
# connection, changes the parameter count, and raises a question that
# implementations answer differently: which width sets the softmax scale?
#
# You will learn:
#
# - how ViT's patches and T2T's soft split turn images into tokens (batch 13, 100 tokens of
#   width 49), with a picture of the soft split;
# - every intermediate shape of T2T attention with chan = 64, for 1 head and for 4 heads;
# - why the skip connection goes through V, and the parameter counts $49 \cdot 64 \cdot 3$ and
#   $64 \cdot 64 + 64$;
# - the two softmax scales found in the wild, as an explicit option of `attnkit.T2TAttention`,
#   and how much the choice changes.
#
# ## ViT: patches, and an attention that keeps the width
#
# Thirteen grayscale 28 × 28 images (random pixels: only the shapes matter here). ViT
# cuts each into 4 × 4 = 16 patches of 7 × 7 pixels and projects each patch to a
# token of width 64. Attention then maps (B, N, 64) to (B, N, 64), so the block can
# add its input back: $x + \mathrm{attention}(x)$.

# %%
import torch

import attnkit
from attnkit.models import PatchEmbed, T2TEmbed

torch.manual_seed(0)
images = torch.randn(13, 1, 28, 28)  # (B, channels, height, width)
patches = PatchEmbed(28, 7, 1, 64)(images)  # 7 × 7 patches, each projected to width 64
print("ViT tokens:", tuple(patches.shape))
block = attnkit.EncoderBlock(64, 4, 128).eval()  # x + attention(norm(x)), then the MLP
print("after a ViT block:", tuple(block(patches).shape))

# %% [markdown]
# ```text
# ViT tokens: (13, 16, 64)
# after a ViT block: (13, 16, 64)
# ```
#
# ## T2T-ViT: a soft split gives 100 tokens of width 49
#
# T2T's *soft split* is an `nn.Unfold` whose windows overlap: 7 × 7 windows moved by
# 3 pixels (padding 3) give 10 × 10 = 100 windows per image, and each window's
# 7 · 7 = 49 pixels become one token. The tokens are not projected: they are 49 wide.
# (T2T-ViT's first split on 224-pixel colour images moves its 7 × 7 windows by 4 pixels
# and gives 3,136 tokens of width 3 · 49 = 147; the idea is the same.)

# %%
soft_split = torch.nn.Unfold(kernel_size=7, stride=3, padding=3)
windows = soft_split(images)  # (B, 1·7·7, 10·10)
x = windows.transpose(1, 2)  # (B, N, 49) = (13, 100, 49)
print("unfold:", tuple(windows.shape), " tokens:", tuple(x.shape))

# %% [markdown]
# ```text
# unfold: (13, 49, 100)  tokens: (13, 100, 49)
# ```
#
# A picture makes the overlap visible. Random pixels hide it, so draw the split of a ring
# instead: three windows outlined on the padded image, the windows themselves, and the rows
# of the token matrix they become (each window read row by row into 49 numbers). Windows 22
# and 23 are neighbours in a row: they share $7 - 3 = 4$ columns of pixels, and window 32,
# below 22, shares 4 rows with it.

# %%
from attnkit.viz import soft_split_figure

r = torch.arange(28.0)
distance = ((r[:, None] - 13.5) ** 2 + (r[None, :] - 13.5) ** 2).sqrt()  # from the centre
ring = ((distance - 9).abs() < 2.5).float()  # (28, 28): 1 on the ring, 0 elsewhere
fig = soft_split_figure(ring, kernel_size=7, stride=3, padding=3, windows=(22, 23, 32), lang="en")
fig.savefig("03-soft-split.png", dpi=100)
print("ring tokens:", tuple(soft_split(ring[None, None]).transpose(1, 2).shape))

# %% [markdown]
# ```text
# ring tokens: (1, 100, 49)
# ```
#
# ![A ring of 28 × 28 pixels cut by 7 × 7 windows moved by 3 pixels: three overlapping windows outlined, the windows themselves, and the 100 × 49 token matrix with their rows marked](../../assets/tutorials/03-soft-split.png)
#
# With a stride equal to the window (`Unfold(7, stride=7)`) the windows no longer overlap:
# that is ViT's patching, 16 tokens of 49 pixels (exercise 2 checks it).
#
# ## T2T attention, shape by shape
#
# T2T's attention reads tokens of width 49 and computes q, k and v of width
# chan = 64 with one fused matrix (49 → 3·64, no bias). With H heads each head is
# chan/H wide. After attention and the output projection (64 → 64), the output is
# 64 wide, so the input x (49 wide) cannot be added to it. T2T adds **v** instead:
#
# $$
# \mathrm{out} = v + \mathrm{proj}\big(\mathrm{softmax}(q k^\top \cdot \mathrm{scale})\, v\big)
# $$
#
# Below, `walk` writes `attnkit.T2TAttention` out step by step in float64, records
# the shape after every step, and checks the result against the module. Run it for
# 1 head and for 4 heads:

# %%
from torch import Tensor


def walk(t2t: attnkit.T2TAttention, x: Tensor) -> tuple[Tensor, dict]:
    """T2TAttention written out in float64; returns the output and every step's shape."""
    mha = t2t.attn
    B, N, _ = x.shape
    H, chan = mha.num_heads, mha.out_dim
    shapes = {"x": x.shape}
    qkv = x.double() @ mha.in_proj.qkv.weight.double().T  # (B, N, 3·chan)
    shapes["qkv = x·W_qkvᵀ"] = qkv.shape
    qkv = qkv.reshape(B, N, 3, H, chan // H)  # (B, N, 3, H, chan/H)
    shapes["reshape"] = qkv.shape
    qkv = qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, N, chan/H)
    shapes["permute"] = qkv.shape
    q, k, v = qkv  # (B, H, N, chan/H) each
    shapes["q, k, v"] = q.shape
    scores = q @ k.transpose(-2, -1) * mha.attend.scale  # (B, H, N, N)
    shapes["q·kᵀ·scale"] = scores.shape
    o = scores.softmax(dim=-1) @ v  # (B, H, N, chan/H)
    shapes["softmax·v"] = o.shape
    o = o.transpose(1, 2).reshape(B, N, chan)  # (B, H, N, chan/H) -> (B, N, chan)
    shapes["merge heads"] = o.shape
    o = o @ mha.proj.weight.double().T + mha.proj.bias.double()  # (B, N, chan)
    shapes["proj"] = o.shape
    v_merged = v.transpose(1, 2).reshape(B, N, chan)  # (B, N, chan): v's heads side by side
    shapes["v (merged)"] = v_merged.shape
    out = v_merged + o  # the skip connection through V
    shapes["v + proj(o)"] = out.shape
    return out, shapes


t2t1 = attnkit.T2TAttention(49, 64, num_heads=1).eval()
t2t4 = attnkit.T2TAttention(49, 64, num_heads=4).eval()
out1, shapes1 = walk(t2t1, x)
out4, shapes4 = walk(t2t4, x)
print(f"{'step':16} {'1 head':22} 4 heads")
for step in shapes1:
    print(f"{step:16} {tuple(shapes1[step])!s:22} {tuple(shapes4[step])}")
for t2t, out in ((t2t1, out1), (t2t4, out4)):
    same = torch.allclose(t2t(x).double(), out, atol=1e-5)
    print(f"heads={t2t.attn.num_heads}: equal to attnkit.T2TAttention: {same}")

# %% [markdown]
# ```text
# step             1 head                 4 heads
# x                (13, 100, 49)          (13, 100, 49)
# qkv = x·W_qkvᵀ   (13, 100, 192)         (13, 100, 192)
# reshape          (13, 100, 3, 1, 64)    (13, 100, 3, 4, 16)
# permute          (3, 13, 1, 100, 64)    (3, 13, 4, 100, 16)
# q, k, v          (13, 1, 100, 64)       (13, 4, 100, 16)
# q·kᵀ·scale       (13, 1, 100, 100)      (13, 4, 100, 100)
# softmax·v        (13, 1, 100, 64)       (13, 4, 100, 16)
# merge heads      (13, 100, 64)          (13, 100, 64)
# proj             (13, 100, 64)          (13, 100, 64)
# v (merged)       (13, 100, 64)          (13, 100, 64)
# v + proj(o)      (13, 100, 64)          (13, 100, 64)
# heads=1: equal to attnkit.T2TAttention: True
# heads=4: equal to attnkit.T2TAttention: True
# ```
#
# Every row of the score maps is 100 long: each token attends to all 100 tokens of
# its image, whatever the number of heads. With one head, "v (merged)" is just v
# without its head axis (the reference code, whose reshape gives every head the full
# width chan and so only works with one head, writes `v.squeeze(1)`); with 4 heads, the
# heads of v are put back side by side, exactly as the attention output is merged.
#
# ## The parameter count
#
# The fused projection has $49 \cdot 64 \cdot 3 = 9{,}408$ weights (no bias, as in T2T-ViT), the
# output projection $64 \cdot 64 + 64 = 4{,}160$. Splitting into heads changes neither.

# %%
for t2t in (t2t1, t2t4):
    qkv = sum(p.numel() for p in t2t.attn.in_proj.parameters())
    proj = sum(p.numel() for p in t2t.attn.proj.parameters())
    print(f"{t2t.attn.num_heads} head(s): qkv {qkv:,}  proj {proj:,}  total {qkv + proj:,}")
print(f"49·64·3 = {49 * 64 * 3:,}   64·64 + 64 = {64 * 64 + 64:,}")

# %% [markdown]
# ```text
# 1 head(s): qkv 9,408  proj 4,160  total 13,568
# 4 head(s): qkv 9,408  proj 4,160  total 13,568
# 49·64·3 = 9,408   64·64 + 64 = 4,160
# ```
#
# ## Which softmax scale?
#
# Scaled dot-product attention divides the scores by $\sqrt{d_k}$, the width of the vectors
# in the dot product: here the head width chan/H. But the T2T-ViT reference code
# (`models/token_transformer.py`) computes its scale from the **input** width:
# `head_dim = dim // num_heads` with `dim` = 49, so it multiplies by $49^{-1/2} = 1/7$
# where $1/\sqrt{64} = 1/8$ would be the textbook value. An implementation that builds the
# T2T attention from a standard multi-head attention takes the scale from the head
# width and gets 1/8. Both train; they are not the same function, and
# weights trained with one do not give the same outputs under the other.
#
# `attnkit.T2TAttention` makes the choice explicit with `scale=`:
# `"input"` ($\lfloor \mathrm{dim}/H \rfloor^{-1/2}$, the reference code's, the default), `"head"`
# ($\lfloor \mathrm{chan}/H \rfloor^{-1/2} = 1/\sqrt{d_k}$) or a number. Same weights, both scales:

# %%
for heads in (1, 4):
    by_input = attnkit.T2TAttention(49, 64, heads, scale="input").eval()
    by_head = attnkit.T2TAttention(49, 64, heads, scale="head").eval()
    by_head.load_state_dict(by_input.state_dict())  # identical weights
    s_in, s_head = by_input.attn.attend.scale, by_head.attn.attend.scale
    print(f"{heads} head(s): scale input {s_in:.4f}, head {s_head:.4f}")
    outs = {}
    for name, t2t in (("input", by_input), ("head", by_head)):
        with attnkit.record_attention(t2t) as rec, torch.no_grad():
            outs[name] = t2t(x)
        p = rec["attn"]  # (B, H, N, N): the recorded probabilities
        top = p.amax(-1).mean()  # the largest weight of each row, averaged
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1).mean()
        print(f"  {name:5}: largest weight {top:.4f}, entropy {entropy:.4f} nats")
    print(f"  outputs differ by up to {(outs['input'] - outs['head']).abs().max():.4f}")

# %% [markdown]
# ```text
# 1 head(s): scale input 0.1429, head 0.1250
#   input: largest weight 0.0220, entropy 4.5543 nats
#   head : largest weight 0.0200, entropy 4.5663 nats
#   outputs differ by up to 0.0174
# 4 head(s): scale input 0.2887, head 0.2500
#   input: largest weight 0.0221, entropy 4.5530 nats
#   head : largest weight 0.0199, entropy 4.5661 nats
#   outputs differ by up to 0.0168
# ```
#
# The "input" multiplier is the larger one: $1/7$ against $1/8$ with one head ($8/7 = 1.14$
# times larger), $12^{-1/2}$ against $16^{-1/2}$ with four heads ($\lfloor 49/4 \rfloor = 12$; 1.15
# times larger). Every score is multiplied by that ratio, so "input" makes each map a little
# sharper: a larger top weight and a lower entropy. These weights are untrained, so
# the maps are still close to uniform ($\ln 100 = 4.605$ nats is the entropy of a uniform
# row over 100 tokens) and the outputs differ by at most 0.017; trained scores are larger
# and the gap grows with them. A weight file from one convention must be loaded with
# the same `scale`: `T2TAttention(..., scale="input")` for the reference code's weights.
#
# ## Back to a grid, and the whole T2T embedding
#
# The 100 output tokens of width 64 are put back on their 10 × 10 grid, and the next
# soft split cuts that map again. `attnkit.models.T2TEmbed` chains these stages: here a
# 7/3 split, the T2T attention (with its feed-forward), then a 3/2 split of the 64-channel
# map projected to the model width 96.

# %%
grid = out1.float().transpose(1, 2).unflatten(2, (10, 10))  # (B, chan, 10, 10)
print("re-gridded:", tuple(grid.shape))
embed = T2TEmbed(28, 1, 96, splits=((7, 3), (3, 2)), chan=64).eval()
tokens = embed(images)
print("T2T tokens:", tuple(tokens.shape), " grid:", embed.grid)

# %% [markdown]
# ```text
# re-gridded: (13, 64, 10, 10)
# T2T tokens: (13, 25, 96)  grid: (5, 5)
# ```
#
# From here a T2T-ViT is a plain ViT on these 25 tokens (`attnkit.models.ViT` with
# `ViTConfig(tokens="t2t")`, and `attnkit train t2t` trains one on the digits).
#
# ## Exercises
#
# **1.** How many tokens does the 7/3 soft split (padding 3) make of a 32 × 32 image? Work it
# out with $\lfloor (32 + 2 \cdot 3 - 7) / 3 \rfloor + 1$ per side, then check.
#
# /// details | Answer
# %%
per_side = (32 + 2 * 3 - 7) // 3 + 1
print("by formula:", per_side**2, " unfold:", soft_split(torch.randn(1, 1, 32, 32)).shape[-1])

# %% [markdown]
# ```text
# by formula: 121  unfold: 121
# ```
# ///
#
# **2.** Show that ViT's patching is an `Unfold` whose stride equals its window: cut the images
# into 7 × 7 patches with a reshape and compare.
#
# /// details | Answer
# %%
by_unfold = torch.nn.Unfold(kernel_size=7, stride=7)(images).transpose(1, 2)  # (13, 16, 49)
grid = images.reshape(13, 1, 4, 7, 4, 7)  # (B, 1, patch row, pixel row, patch col, pixel col)
by_reshape = grid.permute(0, 2, 4, 1, 3, 5).reshape(13, 16, 49)
print(tuple(by_unfold.shape), torch.equal(by_unfold, by_reshape))

# %% [markdown]
# ```text
# (13, 16, 49) True
# ```
#
# `PatchEmbed` then projects each 49-pixel row to width 64 (a convolution with stride 7 does
# both at once).
# ///
#
# **3.** The soft split copies pixels into several tokens. How many tokens does each pixel of a
# 28 × 28 image land in? (`nn.Fold` adds windows back onto the image.)
#
# /// details | Answer
# %%
fold = torch.nn.Fold(output_size=28, kernel_size=7, stride=3, padding=3)
counts = fold(soft_split(torch.ones(1, 1, 28, 28)))[0, 0]  # (28, 28): windows per pixel
values, pixels = counts.unique(return_counts=True)
print({int(v): int(n) for v, n in zip(values, pixels, strict=True)})

# %% [markdown]
# ```text
# {4: 400, 6: 320, 9: 64}
# ```
#
# Every pixel is in 4, 6 or 9 tokens: $2$ or $3$ windows cover it along each axis. The 100
# tokens hold $100 \cdot 49 = 4{,}900$ pixel values for 784 pixels (and some padding).
# ///
#
# **4.** T2T-ViT's first stage reads tokens of width $3 \cdot 49 = 147$ (colour images) into
# chan = 64 with one head. Which multiplier does each `scale` convention give?
#
# /// details | Answer
# %%
for scale in ("input", "head"):
    t2t = attnkit.T2TAttention(147, 64, scale=scale)
    print(f"{scale:5}: {t2t.attn.attend.scale:.4f}")
print(f"147^-0.5 = {147**-0.5:.4f}   64^-0.5 = {64**-0.5:.4f}")

# %% [markdown]
# ```text
# input: 0.0825
# head : 0.1250
# 147^-0.5 = 0.0825   64^-0.5 = 0.1250
# ```
#
# Here "input" is the *smaller* multiplier (147 > 64): the two conventions differ in either
# direction, depending on whether the input is wider than chan.
# ///
#
# ## Try next
#
# - `attnkit.T2TAttention(49, 64, scale=0.1)` sets the multiplier yourself.
# - Check the parameter count of `T2TEmbed` against the sums above plus the
#   LayerNorms, the feed-forward and the last projection.
# - [What attention costs](07-cost.md), the next tutorial: the N² wall that many patches hit.
# - [Multi-head attention](02-multi-head.md): the split into heads in detail.
