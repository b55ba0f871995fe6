"""MkDocs hook (mkdocs.yml `hooks:`): every tutorial page can be downloaded as a Jupyter notebook.

The notebook is made from the page itself when the site is built, in the page's language: the
prose becomes markdown cells, every ```python block a code cell, and the ```text block that
follows one (what the page shows it printing) that cell's output, so the notebook opens with
the outputs of the page. tests/docs/test_pages.py runs every page and fails when the code no
longer prints them, so the outputs are the code's. The figures the page shows travel inside
the notebook as cell attachments (it works offline, wherever it is saved); the browser-only
parts of a page (interactive figures, embedded HTML) stay on the site.

The page gets a link to its notebook under its title: tutorials/01-self-attention/ links
01-self-attention.ipynb, written next to its index.html (zh/tutorials/... for Chinese).
"""

from __future__ import annotations

import base64
import json
import posixpath
import re
from pathlib import Path

SITE = "https://attnkit.github.io/attnkit/"  # mkdocs.yml's site_url
TUTORIAL = re.compile(r"(?:^|/)tutorials/(\d\d-[^/]+)\.md$")
_OUTPUT = re.compile(r"\A```text\n(.*?)\n```[ \t]*(?:\n|\Z)", re.S)
_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.(?:png|jpg|jpeg|gif|svg))\)")
_PLAY = re.compile(r'^<div class="ak-play"[^>]*></div>\n?', re.M)
_DETAILS = re.compile(r"^/// details \| (.+)$", re.M)
_END = re.compile(r"^///[ \t]*$\n?", re.M)
_ANCHOR = re.compile(r"^(#+ .*?) \{#[^}]*\}$", re.M)
_MIME = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
         "svg": "image/svg+xml"}  # fmt: skip
# raw HTML: a markdown link to a file that is not in docs/ fails the strict build
LINK = {
    "en": 'Run it yourself: <a href="{name}" download>download this tutorial as a Jupyter '
    "notebook</a> (the page's code with the outputs shown here, and its figures).",
    "zh": '自己运行：<a href="{name}" download>下载本教程的 Jupyter 笔记本</a>'
    "（包含页面上的代码、这里显示的输出和图片）。",
}


def _language(src_uri: str) -> str:
    return "zh" if src_uri.startswith("zh/") or "/zh/" in src_uri else "en"


def _site_url(target: str, page_path: Path, site_url: str) -> str:
    """A page-relative link as the published site's address: ../guides/x.md#a on
    docs/zh/tutorials/p.md -> SITE/zh/guides/x/#a (assets are shared: SITE/assets/...)."""
    path, _, anchor = target.partition("#")
    docs = page_path.parents[2]  # docs/<lang>/tutorials/<page>.md
    rel = Path(posixpath.normpath(posixpath.join(page_path.parent.as_posix(), path)))
    parts = rel.relative_to(docs).parts
    lang, rest = (parts[0], parts[1:]) if parts[0] in ("en", "zh") else ("en", parts)
    url = "/".join(rest)
    if url.endswith(".md"):
        url = url[: -len(".md")]
        url = url[: -len("index")] if url == "index" or url.endswith("/index") else url + "/"
    prefix = "" if lang == "en" else f"{lang}/"
    return site_url.rstrip("/") + "/" + prefix + url + (f"#{anchor}" if anchor else "")


def _prose(text: str, folder: Path, attachments: dict, site_url: str) -> str:
    """A markdown cell's text: site-only markup dropped, local images made attachments, links
    to other pages made links to the published site."""
    text = _PLAY.sub("", text)
    text = _DETAILS.sub(lambda m: f"**{m.group(1)}**", text)
    text = _END.sub("", text)
    text = _ANCHOR.sub(r"\1", text)

    def attach(match: re.Match) -> str:
        alt, target = match.groups()
        path = (folder / target).resolve()
        if "://" in target or not path.is_file():
            return match.group(0)
        mime = _MIME[path.suffix[1:].lower()]
        attachments[path.name] = {mime: base64.b64encode(path.read_bytes()).decode("ascii")}
        return f"![{alt}](attachment:{path.name})"

    def link(match: re.Match) -> str:
        label, target = match.groups()
        if "://" in target or target.startswith(("#", "mailto:", "attachment:")):
            return match.group(0)
        return f"[{label}]({_site_url(target, folder / 'page.md', site_url)})"

    return re.sub(r"\n{3,}", "\n\n", _LINK.sub(link, _IMAGE.sub(attach, text)))


def notebook(markdown: str, page_path: Path, site_url: str = SITE) -> dict:
    """The nbformat-4 notebook of a page: its code cells carry the outputs the page shows."""
    import jupytext

    source = jupytext.reads(markdown, fmt="md")
    cells: list[dict] = []
    for cell in source.cells:
        text = cell.source
        if cell.cell_type == "code":
            cells.append({"cell_type": "code", "execution_count": None, "id": f"c{len(cells)}",
                          "metadata": {}, "outputs": [], "source": text})  # fmt: skip
            continue
        shown = _OUTPUT.match(text)
        if shown and cells and cells[-1]["cell_type"] == "code" and not cells[-1]["outputs"]:
            out = shown.group(1) + "\n"
            cells[-1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": out}]
            text = text[shown.end() :]
        attachments: dict = {}
        text = _prose(text, page_path.parent, attachments, site_url).strip("\n")
        if not text:
            continue
        cell_out = {"cell_type": "markdown", "id": f"c{len(cells)}", "metadata": {}, "source": text}
        if attachments:
            cell_out["attachments"] = attachments
        cells.append(cell_out)
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _tutorial(page) -> str | None:
    match = TUTORIAL.search(page.file.src_uri)
    return match.group(1) if match else None


def on_page_markdown(markdown: str, page, config, files) -> str:
    name = _tutorial(page)
    if name is None:
        return markdown
    lang = _language(page.file.src_uri)
    page.ak_notebook = notebook(markdown, Path(page.file.abs_src_path), config.site_url or SITE)
    link = '<p class="ak-notebook">' + LINK[lang].format(name=f"{name}.ipynb") + "</p>"
    title, _, rest = markdown.partition("\n")
    return f"{title}\n\n{link}\n{rest}" if title.startswith("# ") else f"{link}\n\n{markdown}"


def on_post_page(output: str, page, config) -> str:
    nb = getattr(page, "ak_notebook", None)
    if nb is not None:
        target = Path(page.file.abs_dest_path).parent / f"{_tutorial(page)}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)  # mkdocs writes the page after this
        target.write_text(json.dumps(nb, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return output
