"""Session set-up and fixtures shared by several test modules.

Set before JAX is imported, in the environment, so that subprocesses inherit them:

* float32 matmuls at ``highest`` precision (``JAX_DEFAULT_MATMUL_PRECISION``): the
  numerical-equivalence tests compare with float64 references at float32 tolerances,
  which a GPU's default TensorFloat-32 (or a TPU's bfloat16 passes) would not meet; the
  experiments' ``--matmul_precision`` defaults to it too. On the CPU every precision
  computes the same. ``tests/test_precision.py`` tests the default precision itself.
* XLA's backend (LLVM on the CPU) at optimisation level 0 (``XLA_FLAGS``, unless it sets
  a level already): the tests' programs are small and run a few times, so compiling them
  is most of the suite's time, and level 0 compiles them about 30 % faster. Results can
  differ from the default level's in float32 rounding, so every process of the suite,
  subprocesses too, runs at the same level: the exact-resume tests compare a run in the
  pytest process with runs in subprocesses bit for bit.
* compiled XLA programs are cached on disk (JAX's persistent compilation cache), shared
  by the xdist workers and the subprocess tests, which run the same small models: each
  program is compiled once. The cache is kept between runs in ``$RHNZOO_TEST_JAX_CACHE``
  (default ``<user cache>/rhnzoo/jax-test-cache``; JAX keys entries by its version,
  backend and flags), so a rerun compiles only what changed; a session that finds it
  over 2 GB empties it first (JAX's own size cap, ``jax_compilation_cache_max_size``,
  locks a file on every read and write and made a cold run 1.6x slower here).
  ``RHNZOO_TEST_JAX_CACHE=none`` turns it off; ``tmp`` uses a fresh directory for the
  session, deleted after it (a cold cache, as on a new machine). No test needs the cache.
"""

import atexit
import json
import os
import pathlib
import resource
import shutil
import tempfile
import time
import urllib.error

os.environ["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"


def _test_cache() -> str | None:
    where = os.environ.get("RHNZOO_TEST_JAX_CACHE", "")
    if where == "none":
        return None
    if where == "tmp":
        where = tempfile.mkdtemp(prefix="rhnzoo-test-jax-cache-")
        atexit.register(shutil.rmtree, where, ignore_errors=True)
    elif not where:
        user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        where = os.path.join(user_cache, "rhnzoo", "jax-test-cache")
        entries = list(os.scandir(where)) if os.path.isdir(where) else []
        if sum(e.stat().st_size for e in entries) > 2 << 30:
            shutil.rmtree(where, ignore_errors=True)
    os.environ["RHNZOO_TEST_JAX_CACHE"] = where  # xdist workers and subprocesses: the same
    return where


if "JAX_COMPILATION_CACHE_DIR" not in os.environ and (_cache := _test_cache()):
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=_cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]
    ).strip()

import pytest  # noqa: E402

pytest_plugins = ["map_limit"]  # JAX's caches emptied before XLA:CPU runs out of mappings

from rhnzoo.data import common as data_common  # noqa: E402


# Costliest first: the committed per-test time table ``tests/durations.json`` ({nodeid:
# CPU-s}, made by ``tests/durations.py`` from a ``RHNZOO_TEST_TIMES`` log) orders the test
# files by their summed cost, so an xdist worker never starts a costly file last; a file
# keeps its own order (its module- and class-scoped fixtures are set up once) and files
# not in the table run last, in collection order. Deterministic: every xdist worker
# collects the same order.
DURATIONS = os.path.join(os.path.dirname(__file__), "durations.json")


def pytest_collection_modifyitems(session, config, items):
    try:
        with open(DURATIONS) as f:
            table = json.load(f)
    except (OSError, ValueError):
        return
    cost: dict[str, float] = {}
    for nodeid, seconds in table.items():
        path = nodeid.split("::")[0]
        cost[path] = cost.get(path, 0.0) + float(seconds)
    # A test's path relative to the rootdir, as the table's node ids have it.
    order = {path: rank for rank, path in enumerate(sorted(cost, key=lambda p: -cost[p]))}
    first = {}
    for i, item in enumerate(items):
        first.setdefault(item.nodeid.split("::")[0], i)
    items.sort(
        key=lambda item: (
            order.get(path := item.nodeid.split("::")[0], len(order)),
            first[path],
        )
    )


@pytest.fixture(scope="session")
def generated_ptb(tmp_path_factory) -> "pathlib.Path":
    """``<tmp>/ptb``: the generated PTB of ``tests/corpus.py`` (its parent as
    ``RHNZOO_DATA``), written once a session (each xdist worker its own); read only."""
    import corpus

    return corpus.write_ptb(tmp_path_factory.mktemp("generated-data") / "ptb")


@pytest.fixture(scope="session")
def tiny_lm_run(tmp_path_factory):
    """A 3-step PTB ``small`` run (hidden 8, depth 2) on a generated PTB, trained once a
    session (each xdist worker its own): ``(workdir, data_dir, corpus)``; read only (the
    export and generation apps' tests)."""
    from corpus import write_ptb
    from rhnzoo import data
    from rhnzoo.configs import lm as lm_configs
    from rhnzoo.tasks import lm as lm_training

    tmp = tmp_path_factory.mktemp("tiny-lm")
    data_dir = write_ptb(tmp / "data", train=1000, valid=200, test=200)
    corpus = data.load_ptb(data_dir, download=False, verify=False)
    config = lm_configs.get_config(
        "small",
        hidden_size=8,
        depth=2,
        batch_size=4,
        num_steps=10,
        max_steps=3,
        eval_batch_size=4,
        eval_num_steps=20,
        data_dir=str(data_dir),
        verify_data=False,
        progress=False,
    )
    lm_training.train_and_evaluate(config, corpus, workdir=tmp / "run", log=None)
    return tmp / "run", data_dir, corpus


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
    return sum(
        r.ru_utime + r.ru_stime
        for r in (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    )


if _TIMES:

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(item):
        item._rhnzoo_start = (_cpu_s(), time.perf_counter())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item, nextitem):
        yield
        cpu0, wall0 = getattr(item, "_rhnzoo_start", (_cpu_s(), time.perf_counter()))
        line = {
            "nodeid": item.nodeid,
            "cpu_s": round(_cpu_s() - cpu0, 3),
            "wall_s": round(time.perf_counter() - wall0, 3),
            "slow": item.get_closest_marker("slow") is not None,
        }
        with open(_TIMES, "a") as f:
            f.write(json.dumps(line) + "\n")
