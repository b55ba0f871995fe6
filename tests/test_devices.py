"""Every public module and model is constructible on any device and dtype (factory kwargs),
under a default device, and from `meta` via `to_empty` + `attnkit.modules.reset_parameters`.

The table of modules is tests/device_cases.py; forward passes on the meta device are in
tests/test_devices_forward.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnkit.models
import attnkit.modules
import attnkit.vision
from attnkit.models import CausalLM, Transformer
from attnkit.modules import reset_parameters
from tests.device_cases import CASES, IDS, LM, SEQ, build, run

INTEGER_BUFFERS = ("index", "num_batches_tracked")  # Swin's relative index, BatchNorm's count


def test_every_public_module_has_a_case():
    public = {
        obj
        for package in (attnkit.modules, attnkit.models, attnkit.vision)
        for name in package.__all__
        if isinstance(obj := getattr(package, name), type) and issubclass(obj, nn.Module)
    }
    missing = sorted(c.__name__ for c in public - {case.covers for case in CASES})
    assert not missing, f"add a Case to tests/device_cases.py for {missing}"


def _tensors(m: nn.Module):
    return [*m.named_parameters(), *m.named_buffers()]


def _assert_placed(m: nn.Module, device: str, dtype: torch.dtype) -> None:
    tensors = _tensors(m)
    for name, t in tensors:
        assert t.device.type == device, name
        if name.rsplit(".", 1)[-1] in INTEGER_BUFFERS:
            assert t.dtype == torch.long, name  # index buffers keep their integer dtype
        else:
            assert t.dtype == dtype, name


@pytest.fixture
def default_meta():
    previous = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None if previous.type == "cpu" else previous)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_built_on_meta(case):
    m = build(case, device="meta", dtype=torch.float64)
    assert isinstance(m, case.covers)
    _assert_placed(m, "meta", torch.float64)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_built_under_default_device(case, default_meta):
    m = build(case, dtype=torch.float64)
    _assert_placed(m, "meta", torch.float64)
    m32 = build(case)
    _assert_placed(m32, "meta", torch.float32)


@pytest.fixture
def default_float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float_tensors_follow_the_default_dtype(case, default_float64):
    _assert_placed(build(case, device="meta"), "meta", torch.float64)


def test_default_device_fixture_sets_meta(default_meta):
    assert torch.empty(1).device.type == "meta"


def test_default_device_is_cpu_after_the_fixture():
    assert torch.empty(1).device.type == "cpu"


def _poison(m: nn.Module) -> None:
    """What to_empty may leave: NaN in every float tensor, -1 in integer ones."""
    with torch.no_grad():
        for _, t in _tensors(m):
            t.fill_(float("nan") if t.is_floating_point() else -1)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_meta_to_empty_then_reset_parameters(case):
    torch.manual_seed(0)
    m = build(case, device="meta")
    m.to_empty(device="cpu")
    _poison(m)
    assert reset_parameters(m) is m
    # built on the CPU directly, twice: what differs between seeds is random, the rest is not
    torch.manual_seed(1)
    ref = dict(_tensors(build(case)))
    torch.manual_seed(2)
    other = dict(_tensors(build(case)))
    for name, t in _tensors(m):
        want = ref[name].detach()
        assert t.shape == want.shape and t.dtype == want.dtype, name
        if torch.equal(want, other[name]):
            # ones, zeros, gamma_init, computed tables and indices: exactly the fresh values
            assert torch.equal(t, want), name
        else:
            assert torch.isfinite(t).all(), name
            if t.numel() >= 16:  # same initialiser: the same spread (seeded, not flaky)
                ratio = float(t.detach().std() / want.std())
                assert 0.5 < ratio < 2.0, (name, ratio)
    m.eval()
    with torch.no_grad():
        for padded in {False, case.masked}:
            out = run(case, m, "cpu", torch.float32, padded=padded)
            assert out.shape == case.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float64_on_cpu(case):
    m = build(case, dtype=torch.float64).eval()
    _assert_placed(m, "cpu", torch.float64)
    with torch.no_grad():
        for padded in {False, case.masked}:
            out = run(case, m, "cpu", torch.float64, padded=padded)
            assert out.dtype == torch.float64 and out.shape == case.shape
            assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    ("make", "table"),
    [
        (lambda **fk: Transformer(SEQ, **fk), lambda m: m.tgt_embed.table),
        (lambda **fk: CausalLM(LM, **fk), lambda m: m.embed.table),
    ],
    ids=["transformer", "causal-lm"],
)
def test_tied_generator_survives_to_empty_and_is_initialised_as_the_table(make, table):
    m = make(device="meta")
    assert m.generator.weight is table(m).weight
    m.to_empty(device="cpu")
    assert m.generator.weight is table(m).weight  # to_empty makes a new parameter per owner
    m.to(torch.float64)
    assert m.generator.weight is table(m).weight and m.generator.weight.dtype == torch.float64
    torch.manual_seed(0)
    reset_parameters(m)
    # N(0, 1/C) (the table's init), not nn.Linear's uniform(±1/sqrt(C)) whose std is 1/sqrt(3C)
    w = m.generator.weight
    assert abs(float(w.detach().std()) * SEQ.d_model**0.5 - 1.0) < 0.25


def test_reset_parameters_initialises_a_shared_parameter_once():
    calls = []

    class Spy(nn.Linear):
        def reset_parameters(self):
            calls.append(self)
            super().reset_parameters()

    first, second = Spy(3, 3, bias=False), Spy(3, 3, bias=False)
    second.weight = first.weight
    own = Spy(3, 3)
    calls.clear()
    reset_parameters(nn.Sequential(first, second, own))
    assert calls == [first, own]


def test_float64_model_matches_float32_model():
    """dtype=float64 is the same model as float32 cast up: weights copied, outputs close."""
    case = next(c for c in CASES if c.id == "vit")
    m32 = build(case).eval()
    m64 = build(case, dtype=torch.float64).eval()
    m64.load_state_dict({k: v.double() for k, v in m32.state_dict().items()})
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(m64(x.double()), m32(x).double(), atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_computed_tables_check_their_sizes_on_every_device(device):
    from attnkit.models import ViTConfig

    with pytest.raises(ValueError, match="dim must be a multiple of 4, got 6"):
        attnkit.models.ViT(ViTConfig(dim=6, num_heads=2), device=device)
