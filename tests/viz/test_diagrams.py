"""attnkit.viz.diagrams: the tutorial figures show the data they are given (read back from the
artists, not from pixels), and refuse bad input by name."""

from __future__ import annotations

import matplotlib
import pytest
import torch

from attnkit import masks, positional
from attnkit.viz import plot_masks, plot_positional_encoding, plot_transformer

matplotlib.use("Agg")


def _image(ax) -> torch.Tensor:
    return torch.as_tensor(ax.get_images()[0].get_array().data)


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_masks_shown_are_the_masks_and_the_weights_below_them():
    panels = {
        "causal": masks.causal(5),  # (1, 1, N, S): the leading 1s are dropped
        "cross": masks.padding(torch.tensor([2]), 5).expand(1, 1, 3, 5),
        "window": masks.window(7, 2, causal=True).dense()[0, 0],
    }
    weights = {name: torch.rand(m.shape[-2:]) * m[0, 0] if m.dim() == 4 else torch.rand(m.shape)
               for name, m in panels.items()}  # fmt: skip
    fig = plot_masks(panels, weights)
    assert len(fig.axes) == 9  # 3 masks, 3 weights, a colour bar beside each weights panel
    for ax, (name, m) in zip(fig.axes[:3], panels.items(), strict=True):
        assert ax.get_title() == name
        assert torch.equal(_image(ax), m.reshape(m.shape[-2:]).float())
    for ax, bar, w in zip(fig.axes[3:6], fig.axes[6:], weights.values(), strict=True):
        assert torch.equal(_image(ax), w.float())
        assert bar.get_label() == "<colorbar>" and bar.get_ylim()[1] == float(w.max())
    assert "attention weights" in fig.axes[3].get_ylabel()
    alone = plot_masks({"causal": masks.causal(3, 4)})  # bottom-right aligned, one row
    assert len(alone.axes) == 1
    assert _image(alone.axes[0]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_masks_refused_by_name():
    with pytest.raises(ValueError, match="masks must be boolean"):
        plot_masks({"float": torch.ones(2, 2)})
    with pytest.raises(ValueError, match=r"mask 'batch' must be \(N, S\).*\(2, 1, 3, 3\)"):
        plot_masks({"batch": torch.ones(2, 1, 3, 3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="weights must have the masks' titles"):
        plot_masks({"a": masks.causal(3)}, {"b": torch.ones(3, 3)})
    with pytest.raises(ValueError, match=r"weights 'a' \(3, 4\) differ from the mask's \(3, 3\)"):
        plot_masks({"a": masks.causal(3)}, {"a": torch.ones(3, 4)})
    with pytest.raises(ValueError, match="masks is empty"):
        plot_masks({})


def test_positional_encoding_heat_map_and_dot_products():
    pe = positional.sinusoidal(40, 16)
    fig = plot_positional_encoding(pe, starts=(0, 5, 20), max_offset=12)
    heat, curves = fig.axes[0], fig.axes[1]  # then the colour bar
    assert torch.equal(_image(heat), pe)  # positions down, dimensions across
    assert "40 positions × 16 dimensions" in heat.get_title()
    assert [line.get_label() for line in curves.lines] == ["p = 0", "p = 5", "p = 20"]
    table = pe.double()
    for line, p in zip(curves.lines, (0, 5, 20), strict=True):
        assert list(line.get_xdata()) == list(range(13))
        expected = torch.stack([table[p] @ table[p + k] for k in range(13)])
        assert torch.allclose(torch.as_tensor(line.get_ydata()), expected)
    # sin-cos: the dot product depends on the distance only, so the curves coincide
    assert torch.allclose(torch.as_tensor(curves.lines[0].get_ydata()),
                          torch.as_tensor(curves.lines[2].get_ydata()))  # fmt: skip
    with pytest.raises(ValueError, match=r"starts \[30\] \+ max_offset 16 must stay inside"):
        plot_positional_encoding(pe, starts=(30,))
    with pytest.raises(ValueError, match=r"pe must be \(N, C\), got \(2, 40, 16\)"):
        plot_positional_encoding(pe[None].expand(2, 40, 16))


@pytest.mark.parametrize("pre_norm", [False, True])
def test_transformer_diagram_names_every_part_and_its_shapes(pre_norm):
    fig = plot_transformer(src_shape=(3, 8), tgt_shape=(3, 7), d_model=32, d_ff=64, vocab=11,
                           num_heads=2, layers=(2, 3), pre_norm=pre_norm)  # fmt: skip
    texts = _texts(fig)
    for part in ("self-attention", "masked self-attention", "cross-attention", "memory",
                 "linear C → V", "softmax", "2×", "3×", "keys, values"):  # fmt: skip
        assert part in texts, part
    assert texts.count("feed-forward C → F → C") == 2
    assert texts.count("embedding + positions") == 2
    for shape in ("(B, S) = (3, 8)", "(B, T) = (3, 7)", "(B, S, C) = (3, 8, 32)",
                  "(B, T, C) = (3, 7, 32)", "(B, S, F) = (3, 8, 64)", "(B, T, F) = (3, 7, 64)",
                  "(B, T, V) = (3, 7, 11)"):  # fmt: skip
        assert shape in texts, shape
    assert any("C = 32, F = 64, V = 11, H = 2" in t for t in texts)
    # five sublayers: post-norm ends each in "Add & Norm"; pre-norm norms first and adds
    # (x + ·), with one final LayerNorm per stack
    assert texts.count("Add & Norm") == (0 if pre_norm else 5)
    assert texts.count("Add (x + ·)") == (5 if pre_norm else 0)
    assert texts.count("LayerNorm") == (7 if pre_norm else 0)


def test_transformer_diagram_refuses_two_batch_sizes():
    with pytest.raises(ValueError, match=r"batch sizes differ: src \(2, 8\), tgt \(3, 7\)"):
        plot_transformer(src_shape=(2, 8), tgt_shape=(3, 7), d_model=4, d_ff=8, vocab=5,
                         num_heads=1)  # fmt: skip
