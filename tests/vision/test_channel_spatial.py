import pytest
import torch
import torch.nn.functional as F

from attnkit.vision import CBAM, SpatialAttention, SqueezeExcitation


def _se_reference(se: SqueezeExcitation, x: torch.Tensor) -> torch.Tensor:
    """SE written out by hand in float64 from the module's weights."""
    c1, c2 = se.mlp[0], se.mlp[2]
    w1, b1 = c1.weight.double().flatten(1), c1.bias.double()
    w2, b2 = c2.weight.double().flatten(1), c2.bias.double()
    x = x.double()

    def mlp(z):  # z (B, C)
        return torch.relu(z @ w1.T + b1) @ w2.T + b2

    logits = mlp(x.mean((2, 3)))
    if se.pool == "avg+max":
        logits = logits + mlp(x.amax((2, 3)))
    return x * torch.sigmoid(logits)[:, :, None, None]


@pytest.mark.parametrize("pool", ["avg", "avg+max"])
@pytest.mark.parametrize("shape", [(2, 16, 5, 7), (1, 3, 1, 1), (3, 32, 8, 8)])
def test_se_matches_float64_reference(pool, shape):
    torch.manual_seed(0)
    se = SqueezeExcitation(shape[1], reduction=4, pool=pool)
    x = torch.randn(shape)
    torch.testing.assert_close(se(x).double(), _se_reference(se, x), rtol=1e-5, atol=1e-5)
    gates = se.gates(x)
    assert gates.shape == (shape[0], shape[1], 1, 1)
    assert gates.min() >= 0 and gates.max() <= 1
    torch.testing.assert_close(se(x), x * gates)


def test_spatial_matches_float64_reference():
    torch.manual_seed(1)
    sa = SpatialAttention(7)
    x = torch.randn(2, 6, 9, 5)
    xd = x.double()
    pooled = torch.stack([xd.mean(1), xd.amax(1)], 1)
    ref = xd * torch.sigmoid(
        F.conv2d(pooled, sa.conv.weight.double(), sa.conv.bias.double(), padding=3)
    )
    torch.testing.assert_close(sa(x).double(), ref, rtol=1e-5, atol=1e-5)
    gates = sa.gates(x)
    assert gates.shape == (2, 1, 9, 5) and gates.min() >= 0 and gates.max() <= 1


def test_cbam_is_channel_then_spatial():
    torch.manual_seed(2)
    cbam = CBAM(8, reduction=2)
    x = torch.randn(2, 8, 6, 6)
    c = x * cbam.channel.gates(x)
    torch.testing.assert_close(cbam(x), c * cbam.spatial.gates(c))
    assert cbam(x).shape == x.shape


def test_gates_backpropagate():
    cbam = CBAM(4, reduction=2)
    x = torch.randn(1, 4, 5, 5, requires_grad=True)
    cbam(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    "make, x, match",
    [
        (
            lambda: SqueezeExcitation(8),
            torch.randn(1, 4, 3, 3),
            r"\(B, 8, H, W\), got \(1, 4, 3, 3\)",
        ),
        (lambda: SqueezeExcitation(8, pool="max"), None, "pool must be"),
        (lambda: SpatialAttention(4), None, "odd positive"),
        (lambda: SpatialAttention(), torch.randn(4, 3, 3), r"\(B, C, H, W\), got \(4, 3, 3\)"),
        (lambda: CBAM(8), torch.randn(1, 3, 4, 4), r"\(B, 8, H, W\)"),
    ],
)
def test_errors_name_what_was_wanted(make, x, match):
    with pytest.raises(ValueError, match=match):
        make()(x)
