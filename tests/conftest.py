"""Session set-up and fixtures shared by several test modules.

Set before JAX is imported, in the environment, so that subprocesses inherit them:

* float32 matmuls at ``highest`` precision (``JAX_DEFAULT_MATMUL_PRECISION``): the
  numerical-equivalence tests compare with float64 references at float32 tolerances,
  which a GPU's default TensorFloat-32 (or a TPU's bfloat16 passes) would not meet; the
  experiments' ``--matmul_precision`` defaults to it too. On the CPU every precision
  computes the same. ``tests/test_precision.py`` tests the default precision itself.
* compiled XLA programs are cached on disk for the session (JAX's persistent
  compilation cache, in a temporary directory): the many subprocess tests that run the
  same small models compile each program once.
"""

import atexit
import os
import shutil
import tempfile
import urllib.error

os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="rhnzoo-test-jax-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_cache,
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")  # fmt: skip

import pytest  # noqa: E402

from rhnzoo.data import common as data_common  # noqa: E402


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No RHNZOO_DATA, cache under tmp_path/cache, no network."""

    def offline(url, dest, timeout=60.0):
        raise urllib.error.URLError(f"no network for {url}")

    monkeypatch.delenv("RHNZOO_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(data_common, "fetch", offline)
    return tmp_path / "cache" / "rhnzoo"
