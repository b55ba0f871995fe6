# Made from docs/en/tutorials/09-channel-spatial.md by tests/docs/make_examples.py; edit the page, not this file.
# %% [markdown]
# # Channel, spatial and self-attention on feature maps
#
# Before Transformers reached vision, CNNs already had "attention": modules that reweight
# a feature map [B, C, H, W]. This tutorial builds the three classic ones by hand, checks
# each against attnkit's module, and puts them next to self-attention:
#
# - **channel attention** (squeeze-and-excitation, SE): *which* channels matter for this
#   image — one gate per channel;
# - **spatial attention** (CBAM's second half): *where* in the image to look — one gate
#   per position;
# - **self-attention over positions** (SAGAN / non-local block): every position gathers
#   from every other position, with softmax weights, like the tokens of a Transformer.
#
# ## The picture in words
#
# ```text
# x: (B, C, H, W)
#
# SE       pool over H, W -> (B, C) -> MLP -> sigmoid -> gates (B, C, 1, 1)   -> x * gates
# spatial  pool over C -> (B, 2, H, W) -> 7×7 conv -> sigmoid -> (B, 1, H, W) -> x * gates
# CBAM     SE (avg and max pooled), then spatial
# SAGAN    1×1 convs -> q, k (B, P, Ck), v (B, P, Cv); P = H·W positions
#          softmax(q·kᵀ) (B, P, P): each row sums to 1 -> weights·v -> 1×1 conv -> x + γ·out
# ```
#
# The gates are sigmoids: each is a number in [0, 1] on its own, and they need not sum to
# anything. Self-attention uses a softmax: each position's weights over all positions sum
# to 1, and the output *mixes* positions instead of scaling them.
#
# ## Channel attention: squeeze and excitation
#
# Squeeze: average each channel over the image, (B, C, H, W) → (B, C). Excite: a small
# MLP ($C \to C/r \to C$, $r = 16$ in the paper) and a sigmoid give one gate per channel:
#
# $$
# g = \sigma\big(W_2\, \mathrm{ReLU}(W_1 \bar{x} + b_1) + b_2\big), \qquad
# \bar{x}_c = \frac{1}{HW} \sum_{i, j} x_{c, i, j}
# $$
#
# The output is the input with each channel multiplied by its gate (Hu et al. 2018).

# %%
import torch

import attnkit
from attnkit.vision import CBAM, SelfAttention2d, SpatialAttention, SqueezeExcitation

torch.manual_seed(0)
B, C, H, W = 2, 64, 16, 16
x = torch.randn(B, C, H, W)

se = SqueezeExcitation(C, reduction=16)
fc1, fc2 = se.mlp[0], se.mlp[2]  # 1×1 convolutions = linear layers on (B, C, 1, 1)
squeezed = x.mean(dim=(2, 3))  # (B, C)
hidden = torch.relu(squeezed @ fc1.weight.view(C // 16, C).T + fc1.bias)  # (B, C/r)
gates = torch.sigmoid(hidden @ fc2.weight.view(C, C // 16).T + fc2.bias)  # (B, C)
manual = x * gates[:, :, None, None]  # (B, C, H, W)

print("squeezed", tuple(squeezed.shape), "hidden", tuple(hidden.shape), "gates", tuple(gates.shape))
print("gates in [0, 1]:", bool(((gates >= 0) & (gates <= 1)).all()))
print("parameters:", sum(p.numel() for p in se.parameters()), "= 2·C·C/r + C/r + C")
torch.testing.assert_close(manual, se(x))
print("equal: True")

# %% [markdown]
# ```text
# squeezed (2, 64) hidden (2, 4) gates (2, 64)
# gates in [0, 1]: True
# parameters: 580 = 2·C·C/r + C/r + C
# equal: True
# ```
#
# SE is cheap: 580 parameters and $2C^2/r = 512$ multiply-adds per image for its MLP, whatever
# $H$ and $W$ (plus the pooling and the scaling, one operation per element).
# It cannot say *where* something is; it only turns channels up and down.
#
# ## Spatial attention and CBAM
#
# CBAM (Woo et al. 2018) adds the missing *where*. Its spatial module pools over the
# channels (mean and max, two maps of H × W), runs one 7×7 convolution over the pair and
# a sigmoid: one gate per position. CBAM applies channel gates first (SE with average
# *and* max pooling through the same MLP), then spatial gates.

# %%
spatial = SpatialAttention(kernel_size=7)
pooled = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], dim=1)  # (B, 2, H, W)
where = torch.sigmoid(spatial.conv(pooled))  # (B, 1, H, W)
print("pooled", tuple(pooled.shape), "spatial gates", tuple(where.shape))
torch.testing.assert_close(x * where, spatial(x))
print("spatial equal: True")

cbam = CBAM(C, reduction=16, kernel_size=7)
mlp = cbam.channel.mlp
channel_gates = torch.sigmoid(mlp(x.mean((2, 3), keepdim=True)) + mlp(x.amax((2, 3), keepdim=True)))
after_channel = x * channel_gates  # (B, C, H, W)
manual = after_channel * cbam.spatial.gates(after_channel)
torch.testing.assert_close(manual, cbam(x))
print("CBAM equal: True")
print("CBAM parameters:", sum(p.numel() for p in cbam.parameters()))

# %% [markdown]
# ```text
# pooled (2, 2, 16, 16) spatial gates (2, 1, 16, 16)
# spatial equal: True
# CBAM equal: True
# CBAM parameters: 679
# ```
#
# The spatial gate of a position depends on a 7×7 neighbourhood only: it is local, like
# the convolution that computes it.
#
# ## Self-attention on a feature map: SAGAN
#
# A convolution sees a small neighbourhood; to relate the left ear of a dog to its right
# ear, a CNN needs many layers. The SAGAN block (Zhang et al. 2019), the "embedded
# Gaussian" non-local block of Wang et al. (2018), lets every position attend to every
# other one. Flatten the map to $P = HW$ positions; 1×1 convolutions give queries and keys
# of $C_k = C/8$ channels and values of $C_v$ channels; attention mixes the values; a last 1×1
# convolution $W_o$ maps them back to $C$, and a learned $\gamma$ scales what is added to the
# input. In SAGAN's paper the values have $C/8$ channels too and its $W_v$ is this last
# convolution (its released code and BigGAN use $C/2$); `SelfAttention2d` keeps $C_v = C$ unless
# told `value_channels=`:
#
# $$
# y = x + \gamma \cdot W_o\big(\mathrm{softmax}(q k^\top)\, v\big)
# $$
#
# $\gamma$ starts at 0, so a fresh block is the identity and learns how much non-local evidence
# to use. SAGAN uses plain dot products, without the $1/\sqrt{d_k}$ scale (`scale=1.0`, the
# default here; pass `scale=None` for $1/\sqrt{d_k}$).
#
# The flattening is where code goes wrong: the map must become (B, P, channels), one row
# per position, with the batch kept apart.

# %%
sagan = SelfAttention2d(C, reduction=8)
print("gamma at init:", sagan.gamma.item(), "-> identity:", torch.equal(sagan(x), x))
with torch.no_grad():
    sagan.gamma.fill_(0.5)  # as if trained

P = H * W
q = sagan.query(x).flatten(2).transpose(1, 2)  # (B, Ck, H, W) -> (B, Ck, P) -> (B, P, Ck)
k = sagan.key(x).flatten(2).transpose(1, 2)  # (B, P, Ck)
v = sagan.value(x).flatten(2).transpose(1, 2)  # (B, P, C)
weights = torch.softmax(q @ k.transpose(1, 2), dim=-1)  # (B, P, P), no 1/√d_k in SAGAN
mixed = (weights @ v).transpose(1, 2).reshape(B, C, H, W)  # (B, P, C) -> (B, C, P) -> (B, C, H, W)
manual = x + sagan.gamma * sagan.out(mixed)
print(
    "q", tuple(q.shape), "k", tuple(k.shape), "v", tuple(v.shape), "weights", tuple(weights.shape)
)
torch.testing.assert_close(manual, sagan(x), atol=1e-5, rtol=1e-5)
print("equal: True")

# The same weights through attnkit's functional core (q, k, v as (B, heads, P, d)):
res = attnkit.attention(q[:, None], k[:, None], v[:, None], scale=1.0, need_weights=True)
torch.testing.assert_close(res.weights[:, 0], weights, atol=1e-6, rtol=1e-5)
with attnkit.record_attention(sagan) as rec:
    sagan(x)
print("recorded", rec.names, tuple(rec[rec.names[0]].shape), "= (B, heads, P, P)")

# %% [markdown]
# ```text
# gamma at init: 0.0 -> identity: True
# q (2, 256, 8) k (2, 256, 8) v (2, 256, 64) weights (2, 256, 256)
# equal: True
# recorded ['attend'] (2, 1, 256, 256) = (B, heads, P, P)
# ```
#
# ## The three kinds of weights, drawn
#
# The gates and weights of the first image, side by side: SE's 64 channel gates, the
# spatial module's 16 × 16 gates, and SAGAN's weights of one position, (8, 8), over all 256
# positions, folded back onto the map.

# %%
from attnkit.viz import channel_spatial_figure

query = 8 * W + 8  # position (8, 8) in the flattened map
row = weights[0, query].detach().reshape(H, W)  # (H, W): where position (8, 8) reads from
fig = channel_spatial_figure(gates[0], where[0, 0], row, position=(8, 8), lang="en")
fig.savefig("09-weights.png", dpi=100)
print(f"channel gates {tuple(gates[0].shape)}, spatial gates {tuple(where[0, 0].shape)}")
print("SAGAN weights of (8, 8) sum to 1:", torch.allclose(row.sum(), torch.tensor(1.0)))

# %% [markdown]
# ```text
# channel gates (64,), spatial gates (16, 16)
# SAGAN weights of (8, 8) sum to 1: True
# ```
#
# ![SE's 64 channel gates as bars, the 16 × 16 spatial gates, and the SAGAN attention weights of position (8, 8) over the map](../../assets/tutorials/09-weights.png)
#
# The two sets of gates are each in $[0, 1]$ on their own; these untrained modules, fed
# random features, put most of them near 0.5. The attention weights are a distribution:
# they are small (about $1/256$ on average) because they share a total of 1 among 256
# positions. Scale a gate and only its channel or position changes; raise one attention
# weight and the others must fall.
#
# ## Side by side
#
# All three keep the shape (B, C, H, W). What differs is what the weights depend on and
# what they cost. On this 16×16 map with C = 64:

# %%
from torch.utils.flop_counter import FlopCounterMode


def macs(module):
    with torch.no_grad(), attnkit.use_backend("reference"), FlopCounterMode(display=False) as fc:
        module(x[:1])
    return fc.get_total_flops() // 2


print(f"{'module':10} {'params':>7} {'MACs/image':>11}  weights")
rows = [
    ("SE", se, "(C,) per image, sigmoid"),
    ("spatial", spatial, "(H, W) per image, sigmoid"),
    ("CBAM", cbam, "both of the above"),
    ("SAGAN", sagan, "(P, P) = (256, 256), softmax rows"),
]
for name, module, what in rows:
    n_params = sum(p.numel() for p in module.parameters())
    print(f"{name:10} {n_params:7,} {macs(module):11,}  {what}")
print(f"SAGAN's q·kᵀ and weights·v: P²·Ck + P²·C = {P * P * (C // 8) + P * P * C:,} MACs")

# %% [markdown]
# ```text
# module      params  MACs/image  weights
# SE             580         512  (C,) per image, sigmoid
# spatial         99      25,088  (H, W) per image, sigmoid
# CBAM           679      26,112  both of the above
# SAGAN        9,361   7,077,888  (P, P) = (256, 256), softmax rows
# SAGAN's q·kᵀ and weights·v: P²·Ck + P²·C = 4,718,592 MACs
# ```
#
# The gates cost almost nothing and see either everything at once (SE: a global average)
# or a 7×7 neighbourhood (spatial). SAGAN costs 270× as much as CBAM here, two thirds of it
# in the two $P^2$ products ($P = 256$; a 32×32 map would make them 16× larger), and in
# exchange lets any position read any other with content-dependent weights: this is the
# same attention as in a Transformer, with pixels as tokens. ViT goes all the way: it drops the convolutions and makes patches the tokens.
#
# ## Exercises
#
# **1.** Count the parameters of an SE block for $C = 256$ channels with $r = 16$, by formula and
# on the module.
#
# /// details | Answer
# %%
c, r = 256, 16
print(f"2·C·C/r + C/r + C = {2 * c * c // r + c // r + c:,}")
print(f"module: {sum(p.numel() for p in SqueezeExcitation(c, reduction=r).parameters()):,}")

# %% [markdown]
# ```text
# 2·C·C/r + C/r + C = 8,464
# module: 8,464
# ```
# ///
#
# **2.** SE cannot see *where* anything is. Shuffle the positions of the map (the same
# shuffle for every channel) and show that the gates do not change and the output is
# shuffled the same way.
#
# /// details | Answer
# %%
perm = torch.randperm(H * W, generator=torch.Generator().manual_seed(0))
shuffled = x.flatten(2)[..., perm].reshape(B, C, H, W)  # positions permuted, channels kept
with torch.no_grad():
    same_gates = torch.allclose(se.gates(shuffled), se.gates(x), atol=1e-6)
    out = se(shuffled).flatten(2)
    same_out = torch.allclose(out, se(x).flatten(2)[..., perm], atol=1e-6)
print("gates unchanged:", same_gates, " output shuffled the same way:", same_out)

# %% [markdown]
# ```text
# gates unchanged: True  output shuffled the same way: True
# ```
#
# The spatial module is the opposite: its 7×7 convolution reads neighbourhoods, so shuffling
# the positions changes its gates.
# ///
#
# **3.** Which of the two sums to 1: the spatial gates of an image, or the SAGAN weights of a
# position? Check both for every image and position.
#
# /// details | Answer
# %%
print("spatial gates sum to 1:", torch.allclose(where.sum((2, 3)), torch.ones(B, 1)))
print("every SAGAN row sums to 1:", torch.allclose(weights.sum(-1), torch.ones(B, P)))

# %% [markdown]
# ```text
# spatial gates sum to 1: False
# every SAGAN row sums to 1: True
# ```
#
# Gates are independent sigmoids; attention weights are a softmax over positions.
# ///
#
# **4.** How many multiply-adds do SAGAN's two $P^2$ products take on a 32×32 map, and how many
# times the 16×16 number is that?
#
# /// details | Answer
# %%
P32 = 32 * 32
big = P32 * P32 * (C // 8) + P32 * P32 * C
small = P * P * (C // 8) + P * P * C
print(f"32×32: {big:,} MACs, {big // small}× the 16×16 map")

# %% [markdown]
# ```text
# 32×32: 75,497,472 MACs, 16× the 16×16 map
# ```
#
# Four times the positions, sixteen times the pairs: the $P^2$ wall of tutorial 07.
# ///
#
# ## Try next
#
# - `attnkit train cnn` trains the small CNN with CBAM on the digits (`attnkit.models.SmallCNN`).
# - `SelfAttention2d(C, num_heads=4, scale=None)` gives multi-head, scaled attention over
#   positions; `attnkit.vision.WindowAttention` restricts it to Swin's windows.
# - Tutorial [07 — the cost](07-cost.md) explains the $P^2$ wall; [10 — pitfalls](10-pitfalls.md)
#   shows what happens when the flattening above attends across the batch.
# - API reference: [`attnkit.vision`](../api/vision.md) (`SqueezeExcitation`, `SpatialAttention`,
#   `CBAM`, `SelfAttention2d`, Swin).
