"""The version: one source (pyproject.toml), read back by ``xmc_resumption.__version__`` and
``xmc --version``, named by the CHANGELOG's newest entry; the MIT LICENSE is the one the
distribution declares."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

import pytest

import xmc_resumption
from tests.support.helpers import ROOT, run_module
from xmc_resumption.cli import main

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_version_is_pyprojects() -> None:
    assert xmc_resumption.__version__ == PYPROJECT["version"] == importlib.metadata.version("xmc-resumption")
    assert re.fullmatch(r"\d+\.\d+\.\d+", xmc_resumption.__version__)


def test_xmc_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"xmc {xmc_resumption.__version__}\n"


def test_xmc_version_needs_no_redis_nor_temporal() -> None:
    """``python -m xmc_resumption --version`` as an operator runs it, with nothing configured."""
    proc = run_module("xmc_resumption", "--version", XMC_REDIS_URL="redis://127.0.0.1:1/0")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"xmc {xmc_resumption.__version__}\n", "")


def test_the_changelogs_newest_entry_is_this_version() -> None:
    versions = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    assert versions[0] == xmc_resumption.__version__
    assert len(versions) == len(set(versions))


def test_the_license_is_mit_as_declared() -> None:
    assert PYPROJECT["license"] == "MIT" and PYPROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in text
    metadata = importlib.metadata.metadata("xmc-resumption")
    assert metadata["License-Expression"] == "MIT"
