"""A Hugging Face decoder's head view, recorded on the attnkit backend, in headless Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.viz.test_browser import ARGS, VISIBLE_LINES, playwright_and_chromium

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("attnkit.integrations.transformers")

import attnkit  # noqa: E402
from attnkit.viz import AttentionMaps, head_view, write_html  # noqa: E402

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]


def _gpt2_view(tmp_path) -> AttentionMaps:
    config = transformers.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, pad_token_id=0)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="attnkit"
    )
    ids = torch.tensor([[5, 17, 42, 8, 23, 11, 70, 3]])
    with torch.no_grad(), attnkit.record_attention(model.eval()) as rec:
        model(input_ids=ids)
    assert rec.stack().triu(diagonal=1).abs().max() == 0  # (L, B, H, N, S): causal
    tokens = [f"t{int(i)}" for i in ids[0]]
    return AttentionMaps.from_layers(tokens, rec.layers(), layer_names=rec.names)


def test_decoder_head_view_draws_no_line_to_a_future_token(tmp_path):
    sync_api, chromium = playwright_and_chromium()
    maps = _gpt2_view(tmp_path / "gpt2")
    out = REPO / "test-artifacts"
    out.mkdir(exist_ok=True)
    page_path = write_html(out / "head_view_gpt2.html", head_view(maps, head=0))
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1000, "height": 700})
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto(page_path.as_uri())
            pg.wait_for_selector("body[data-ready='1']", timeout=10_000)
            assert errors == []
            for layer in ("0", "1"):
                for head in ("0", "1", "2", "3"):
                    pg.select_option("#ak-layer", layer)
                    pg.select_option("#ak-head", head)
                    lines = pg.evaluate(VISIBLE_LINES)
                    assert lines, (layer, head)
                    assert all(k <= q for q, k, _ in lines), (layer, head)  # causal picture
                    assert any(q == 0 and k == 0 for q, k, _ in lines)  # token 0 sees itself
        finally:
            browser.close()


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_explain_cli_decoder_head_view_is_causal_in_the_browser(family, tmp_path, capsys):
    """`attnkit explain --checkpoint DIR` on a saved decoder: its head_view.html draws no line
    from a token to a later one, for every layer and head, and the mean."""
    from attnkit.cli.main import main
    from tests.integrations.checkpoints import save_text_checkpoint

    sync_api, chromium = playwright_and_chromium()
    folder = save_text_checkpoint(family, tmp_path / family)
    out = tmp_path / "out"
    argv = ["explain", "the cat sat because it was tired", "--checkpoint", str(folder)]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1000, "height": 700})
            errors: list[str] = []
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.goto((out / "head_view.html").as_uri())
            pg.wait_for_selector("body[data-ready='1']", timeout=10_000)
            assert errors == []
            heads = pg.evaluate(
                "() => Array.from(document.querySelectorAll('#ak-head option'), o => o.value)"
            )
            assert heads == ["4", "0", "1", "2", "3"]  # "4": the mean of the 4 heads
            for layer in ("0", "1"):
                for head in heads:
                    pg.select_option("#ak-layer", layer)
                    pg.select_option("#ak-head", head)
                    lines = pg.evaluate(VISIBLE_LINES)
                    assert lines, (layer, head)
                    assert all(k <= q for q, k, _ in lines), (layer, head)  # causal picture
                    assert any(k < q for q, k, _ in lines)  # and it looks back
        finally:
            browser.close()
