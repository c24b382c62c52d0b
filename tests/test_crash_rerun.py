"""tests/crash_rerun.py: a test whose xdist worker dies runs once more in a fresh worker;
one that kills its worker every time still fails the suite."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

TESTS = pathlib.Path(__file__).resolve().parent

CRASHING = textwrap.dedent("""
    import os, pathlib, signal

    def test_segfaults_once():
        marker = pathlib.Path(os.environ["CRASH_MARKER"])
        if not marker.exists():
            marker.write_text("crashed")
            os.kill(os.getpid(), signal.SIGSEGV)

    def test_segfaults_when_asked():
        if os.environ.get("CRASH_ALWAYS"):
            os.kill(os.getpid(), signal.SIGSEGV)
""")


def pytest_run(tmp_path, **env):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    env = dict(os.environ, PYTHONPATH=str(TESTS), CRASH_MARKER=str(tmp_path / "marker"), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "crash_rerun",
                           "-p", "no:cacheprovider", "test_crashing.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_a_worker_crash_reruns_the_test_once_and_a_second_crash_fails(tmp_path):
    once = pytest_run(tmp_path / "once")
    assert once.returncode == 0, once.stdout[-2000:]
    assert "2 passed, 1 rerun" in once.stdout
    always = pytest_run(tmp_path / "always", CRASH_ALWAYS="1")
    assert always.returncode == 1, always.stdout[-2000:]
    assert "FAILED test_crashing.py::test_segfaults_when_asked" in always.stdout
