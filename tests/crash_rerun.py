"""A pytest-xdist plugin (loaded by conftest): a test whose worker process dies (a
segmentation fault or an abort, not a test failure) runs once more, in a fresh worker.

Why: XLA:CPU has crashed xdist workers late in long runs, while compiling or while
(de)serialising an executable of the persistent compilation cache, in tests that pass
alone and on rerun (BUILD_NOTES, known gaps: "XLA:CPU crashes in long-lived xdist
workers"; the runs: docs/runs/known_gaps_5f11b3e.md); the defect is not isolated. A
test that crashes its worker twice fails, as does any crash past :data:`MAX_RERUNS` in
one session, so a deterministic crash still fails the suite. A rerun is reported as
``R`` and counted in the summary (``1 rerun``).
"""

import pytest

MAX_RERUNS = 3  # crashed tests rerun per session

_rerun: set[str] = set()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without xdist
def pytest_handlecrashitem(crashitem, report, sched):
    if crashitem in _rerun or len(_rerun) >= MAX_RERUNS:
        return
    _rerun.add(crashitem)
    sched.mark_test_pending(crashitem)
    report.outcome = "rerun"
    report.longrepr = f"{report.longrepr}; rerun in a fresh worker (tests/crash_rerun.py)"


def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
