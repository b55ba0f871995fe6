"""Which kernel a wheel's prebuilt libraries offer this CPU (hatch_build.py builds them; the
wheel test in tests/test_wheel.py installs one and runs it without a compiler)."""

from __future__ import annotations

import json

import pytest

from attnkit.functional import _kernel_prebuilt as prebuilt

AVX2 = frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A fake prebuilt folder for `source`, with both libraries and their manifest."""
    source = tmp_path / "attention_cpu.cpp"
    source.write_text("// the kernel\n")
    folder = tmp_path / "prebuilt"
    folder.mkdir()
    libraries = {}
    for isa, flags in (("avx2", AVX2), ("avx512", AVX512)):
        (folder / f"attention_cpu-{isa}.so").write_bytes(b"\x7fELF")
        libraries[isa] = {"file": f"attention_cpu-{isa}.so", "cpu_flags": sorted(flags)}
    manifest = {"sources_sha256": prebuilt.sources_sha256(tmp_path), "libraries": libraries}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(prebuilt, "PREBUILT", folder)
    return source, folder


def test_the_widest_library_this_cpu_runs_comes_first(shipped):
    source, folder = shipped
    assert prebuilt.candidates(source, AVX512) == [
        ("avx512", folder / "attention_cpu-avx512.so"),
        ("avx2", folder / "attention_cpu-avx2.so"),
    ]
    assert prebuilt.candidates(source, AVX2) == [("avx2", folder / "attention_cpu-avx2.so")]
    assert prebuilt.candidates(source, AVX2 - {"fma"}) == []  # an AVX-only CPU: JIT or PyTorch


def test_an_edited_source_or_a_broken_manifest_offers_nothing(shipped):
    source, folder = shipped
    source.write_text("// edited in a checkout\n")
    assert prebuilt.candidates(source, AVX512) == []
    source.write_text("// the kernel\n")
    (source.parent / "simd.h").write_text("// a header beside it, edited\n")
    assert prebuilt.candidates(source, AVX512) == []
    (source.parent / "simd.h").unlink()
    (folder / "attention_cpu-avx512.so").unlink()  # a missing file is passed over
    assert [isa for isa, _ in prebuilt.candidates(source, AVX512)] == ["avx2"]
    digest = prebuilt.sources_sha256(source.parent)
    bad = (f'{{"sources_sha256": "{digest}", "libraries": 2}}',
           f'{{"sources_sha256": "{digest}", "libraries": {{"avx2": 3}}}}')  # fmt: skip
    for text in ("{", "[]", '{"libraries": {}}', *bad):
        (folder / "manifest.json").write_text(text)
        assert prebuilt.candidates(source, AVX512) == []


def test_no_prebuilt_folder_offers_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(prebuilt, "PREBUILT", tmp_path / "absent")
    assert prebuilt.candidates(tmp_path / "x.cpp", AVX512) == []
