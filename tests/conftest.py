"""Fixtures shared by several test modules."""

import urllib.error

import pytest

from rhnzoo.data import common as data_common


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No RHNZOO_DATA, cache under tmp_path/cache, no network."""

    def offline(url, dest, timeout=60.0):
        raise urllib.error.URLError(f"no network for {url}")

    monkeypatch.delenv("RHNZOO_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(data_common, "fetch", offline)
    return tmp_path / "cache" / "rhnzoo"
