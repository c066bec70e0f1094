"""Shared paths for the tests of the Python package: the TVM goldens of the repository (what
real TVM wrote), and the `mblob` command-line binary (for comparing `inspect`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "tests" / "fixtures" / "tvm-goldens"


def golden(*parts: str) -> Path:
    p = GOLDENS.joinpath(*parts)
    assert p.exists(), f"missing golden {p}"
    return p


def manifest(*parts: str) -> dict:
    return json.loads(golden(*parts).read_text())


@pytest.fixture(scope="session")
def mblob_cli() -> str:
    """The `mblob` binary: $MBLOB_BIN, else the repository's target/debug or target/release
    build, else `mblob` on PATH. The comparison tests are skipped (visibly) without one."""
    given = os.environ.get("MBLOB_BIN")
    if given and not os.access(given, os.X_OK):
        pytest.fail(f"MBLOB_BIN={given} is not an executable")
    candidates = [given, REPO / "target/debug/mblob", REPO / "target/release/mblob"]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("mblob")
    if found:
        return found
    pytest.skip("no mblob binary (build it with `cargo build` or set MBLOB_BIN)")
