"""`pip install bindings/python` into a fresh virtual environment, then the installed
package (not the source tree) finds the library by pkg-config or $DSINFER_LIBRARY."""
import os
import shutil
import subprocess
import sys

import pytest

import dsinfer
from conftest import REPO


def test_pip_install_and_import(tmp_path):
    py = "/usr/bin/python3"
    try:
        import ensurepip  # noqa: F401  (Debian: python3-venv)
    except ImportError:
        pytest.skip("python3-venv is not installed (no ensurepip)")
    src = tmp_path / "src"
    # a copy, so that setuptools' build/ and *.egg-info do not land in the checkout
    shutil.copytree(os.path.join(REPO, "bindings", "python"), src,
                    ignore=shutil.ignore_patterns("tests", "__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    # system site packages: Debian's setuptools and wheel build the package offline
    subprocess.run([py, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    vpy = str(venv / "bin" / "python")
    out = subprocess.run([vpy, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                          "--disable-pip-version-check", "-q", str(src)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    prefix = os.environ.get("DSI_PREFIX")  # an install tree: found through pkg-config
    if prefix:
        env.pop("DSINFER_LIBRARY", None)
        pcs = [os.path.join(d, f) for d, _, fs in os.walk(prefix) for f in fs if f == "dsinfer.pc"]
        assert pcs, "no dsinfer.pc under " + prefix
        env["PKG_CONFIG_PATH"] = os.path.dirname(pcs[0])
    else:
        env["DSINFER_LIBRARY"] = dsinfer.library_path
    code = ("import dsinfer, sys; print(dsinfer.__file__); print(dsinfer.library_path); "
            "print(dsinfer.version())")
    out = subprocess.run([vpy, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    pkg_file, lib, ver = out.stdout.split("\n")[:3]
    assert pkg_file.startswith(str(venv)), "imported the installed copy"
    assert ver == dsinfer.version()
    if prefix:
        assert lib.startswith(os.path.abspath(prefix)), lib
