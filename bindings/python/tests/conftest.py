"""Shared fixtures: the library under test, the C CLI and the CLI's default model.

Environment (set by scripts/test-bindings.sh; all optional in a build tree):
  DSINFER_LIBRARY  the libdsinfer.so.0 to test (else the binding's own search)
  DSI_CLI          dsinfer-cli of the same build (else <library dir>/bin/dsinfer-cli)
"""
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dsinfer  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
THREADS = 2


def cli_path():
    p = os.environ.get("DSI_CLI") or os.path.join(os.path.dirname(dsinfer.library_path), "bin",
                                                  "dsinfer-cli")
    if not os.path.isfile(p):
        pytest.fail("dsinfer-cli not found at %s (set DSI_CLI)" % p)
    return p


def run_cli(prompt, n, extra=()):
    """Runs the C CLI one-shot, greedy; returns (completion text, default model path)."""
    out = subprocess.run([cli_path(), "-p", prompt, "-n", str(n), "--temp", "0",
                          "-t", str(THREADS)] + list(extra),
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    err = out.stderr.decode("utf-8", "replace")
    m = re.search(r"using the built-in default model (.+)$", err, re.M)
    text = out.stdout.decode("utf-8")
    assert text.endswith("\n"), "the CLI ends its output with a newline"
    return text[:-1], (m.group(1).strip() if m else None)


@pytest.fixture(scope="session")
def default_model_path():
    """The model the CLI uses without -m, found the way the CLI finds it (its own report)."""
    _, path = run_cli("x", 0)
    assert path and os.path.isfile(path), "the CLI did not name an existing default model"
    return path


@pytest.fixture(scope="session")
def ctx():
    c = dsinfer.Context(n_threads=THREADS)
    yield c
    c.close()


@pytest.fixture(scope="session")
def model(ctx, default_model_path):
    m = ctx.load_model(default_model_path)
    yield m
    m.close()
