"""Shared test configuration: codebooks are cached in a per-session temporary directory."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _kvasym_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Point KVASYM_CACHE_DIR at a fresh temporary directory for the whole session."""
    old = os.environ.get("KVASYM_CACHE_DIR")
    os.environ["KVASYM_CACHE_DIR"] = str(tmp_path_factory.mktemp("kvasym_cache"))
    yield
    if old is None:
        os.environ.pop("KVASYM_CACHE_DIR", None)
    else:
        os.environ["KVASYM_CACHE_DIR"] = old
