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
import json
import os
import resource
import shutil
import tempfile
import time
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


# Per-test cost, opt in: ``RHNZOO_TEST_TIMES=/tmp/times.jsonl python -m pytest ...`` appends
# one JSON line per test, {nodeid, cpu_s, wall_s, slow}, at its teardown (cpu_s: user +
# system time of this process and its waited-for subprocesses, set-up to teardown, so a
# module-scoped fixture is charged to its first test; each xdist worker appends its own
# lines). Rank: ``jq -s 'sort_by(-.cpu_s)[:15]' /tmp/times.jsonl``.
_TIMES = os.environ.get("RHNZOO_TEST_TIMES")


def _cpu_s():
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


if _TIMES:

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(item):
        item._rhnzoo_start = (_cpu_s(), time.perf_counter())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item, nextitem):
        yield
        cpu0, wall0 = getattr(item, "_rhnzoo_start", (_cpu_s(), time.perf_counter()))
        line = {"nodeid": item.nodeid, "cpu_s": round(_cpu_s() - cpu0, 3),
                "wall_s": round(time.perf_counter() - wall0, 3),
                "slow": item.get_closest_marker("slow") is not None}
        with open(_TIMES, "a") as f:
            f.write(json.dumps(line) + "\n")
