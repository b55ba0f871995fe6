import subprocess
import sys

import attnkit


def test_version_is_exposed():
    assert attnkit.__version__.count(".") == 2


def test_cli_prints_version():
    out = subprocess.run(
        [sys.executable, "-m", "attnkit", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"attnkit {attnkit.__version__}"
