"""training/sweep.py, the multi-run runner, on the engine's toy task: finished runs are not
trained again, a killed one resumes, incompatible workdirs are refused before any training;
with --jobs the runs train in child processes (the same results, a failing run recorded,
a signal passed on so that every child saves)."""

import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import engine_toy
import pytest

from rhnzoo import engine

from rhnzoo.engine import progress

from rhnzoo.studies import sweep, tables
from rhnzoo.engine import workdir as workdir_lib

TOY_CONFIG = engine_toy.ToyConfig()


def toy_runs(task, epochs=2):
    cfg = TOY_CONFIG.replace(epochs=epochs, progress=False, log_every=100)
    train = lambda workdir, on_divergence: (
        engine.run(task, cfg, workdir, log=None, on_divergence=on_divergence).results
    )
    return [sweep.Run(name, TOY_CONFIG, train) for name in ("a", "b")]


def test_runner_skips_finished_runs_and_resumes_a_killed_one(tmp_path):
    calls = []
    task = engine_toy.make_task()

    def eval_batches(split, final):
        calls.extend([1] if final and split == "test" else [])  # one final evaluation
        return task.eval_batches(split, final)

    counted = dataclasses.replace(task, eval_batches=eval_batches)

    def killed(split, final):  # a run killed during its final evaluation: no results.json
        if final:
            raise KeyboardInterrupt
        return task.eval_batches(split, final)

    with pytest.raises(KeyboardInterrupt):
        sweep.run_all(
            toy_runs(dataclasses.replace(task, eval_batches=killed))[:1], tmp_path, log=None
        )
    assert (tmp_path / "a" / "checkpoints").is_dir() and not (
        tmp_path / "a" / "results.json"
    ).exists()
    lines = []
    first = sweep.run_all(toy_runs(counted), tmp_path, log=lines.append)
    assert len(calls) == 2 and all(
        r["step"] == 2 * (engine_toy.N_TRAIN // engine_toy.BATCH) for r in first.values()
    )
    again = sweep.run_all(toy_runs(counted), tmp_path, log=lines.append)
    assert len(calls) == 2 and again == first  # nothing trained or evaluated again
    rows = sweep.collect(tmp_path, ["a", "b", "c"])
    assert rows["c"] is None and rows["a"]["results"] == first["a"]
    assert len(rows["a"]["history"]) == 2


def test_incompatible_workdir_stops_the_sweep_before_training(tmp_path):
    task = engine_toy.make_task()
    sweep.run_all(toy_runs(task)[1:], tmp_path, log=None)  # b exists with lr 0.01
    runs = [dataclasses.replace(r, config=TOY_CONFIG.replace(lr=0.02)) for r in toy_runs(task)]
    with pytest.raises(ValueError, match="incompatible"):
        sweep.run_all(runs, tmp_path, log=None)
    assert not (tmp_path / "a").exists()


class Clock:
    """``progress.now`` for the runner's estimate: time moves only when a fake run trains."""

    def __init__(self, monkeypatch):
        self.t = 0.0
        monkeypatch.setattr(progress, "now", lambda: self.t)

    def run(self, name, seconds, size=1.0):
        """A :class:`sweep.Run` whose training takes ``seconds`` and writes results.json
        (none if it holds one: already finished)."""

        def train(workdir, on_divergence):
            if (workdir / "results.json").is_file():
                return json.loads((workdir / "results.json").read_text())
            self.t += seconds
            results = {"final": f"final ({name})"}
            workdir_lib.prepare_workdir(workdir, TOY_CONFIG)
            workdir_lib.write_json(workdir / "results.json", results)
            return results

        return sweep.Run(name, TOY_CONFIG, train, size=size)


def test_each_run_done_estimates_the_runs_left_scaled_by_their_size(tmp_path, monkeypatch):
    """Runs of sizes 1, 2, 3, 4 taking 60 s per unit: after the first, 9 units x 60 s
    for the 3 runs left; after the second, 7 x 60 s (the in-process lines name no final
    line: the run printed it). Rerun with one more: the finished runs take no time and
    are not timed, nor is a resumed one (c, its config.json written before)."""
    clock = Clock(monkeypatch)
    runs = [
        clock.run(name, 60.0 * size, size)
        for name, size in (("a", 1), ("b", 2), ("c", 3), ("d", 4))
    ]
    lines = []
    sweep.run_all(runs, tmp_path, log=lines.append)
    done = [l for l in lines if " done in " in l]
    assert done == [
        "[1/4] a done in 1.0 min; about 9 min for the 3 runs left",
        "[2/4] b done in 2.0 min; about 7 min for the 2 runs left",
        "[3/4] c done in 3.0 min; about 4 min for the 1 run left",
        "[4/4] d done in 4.0 min",
    ]
    lines.clear()
    (tmp_path / "c" / "results.json").unlink()  # c trains again, as does a fresh e
    sweep.run_all([*runs, clock.run("e", 60.0)], tmp_path, log=lines.append)
    assert [l for l in lines if " done in " in l] == [
        "[1/5] a done in 0.0 min",
        "[2/5] b done in 0.0 min",
        "[3/5] c done in 3.0 min",
        "[4/5] d done in 0.0 min",
        "[5/5] e done in 1.0 min",
    ]


def test_children_s_estimate_is_divided_by_the_jobs(tmp_path, monkeypatch):
    """--jobs=2, runs of one size: the first child done in 2 min, the other running as
    long: the 4 runs left take 2 min each, less the running one's 2 min, 2 at a time;
    never less than the longest run left."""
    clock = Clock(monkeypatch)
    runs = [clock.run(name, 0.0) for name in ("a", "b", "c", "d", "e")]
    estimate = sweep.Estimate(runs, tmp_path, at_a_time=2)
    assert estimate.done("a", 120.0, running={"b": 120.0}) == (
        "; about 3 min for the 4 runs left, 2 at a time"
    )  # (0 + 3 x 2 min) / 2
    assert estimate.done("b", 120.0, running={"c": 30.0}) == (
        "; about 3 min for the 3 runs left, 2 at a time"
    )  # (1.5 + 2 + 2 min) / 2
    assert estimate.done("c", 0.0, measured=False, running={"d": 60.0}) == (
        "; about 2 min for the 2 runs left, 2 at a time"
    )  # e: 2 min > (1 + 2 min) / 2


@pytest.mark.slow
def test_hsg_depth_sweep_runs_in_process_and_skips_finished_runs(tmp_path, generated_ptb):
    """experiments/sweep.py on the runner: two tiny PTB runs (the generated PTB of
    tests/corpus.py), then a rerun that trains nothing."""
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    cmd = [
        sys.executable,
        str(root / "experiments" / "sweep.py"),
        f"--root={tmp_path}",
        "--depths=1",
        "--",
        "--hidden_size=8",
        "--batch_size=4",
        "--num_steps=10",
        "--max_steps=2",
        "--noprogress",
        "--eval_batch_size=20",
        "--eval_num_steps=200",
        f"--data_dir={generated_ptb}",
        "--noverify_data",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "d1_rhn" / "results.json").is_file()
    assert (tmp_path / "d1_hsg" / "results.json").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    assert again.returncode == 0 and again.stdout.count("already finished: final (") == 2


# ------------------------------------------------ --jobs: runs as child processes (engine_toy.py)

TOY = pathlib.Path(__file__).resolve().parent / "engine_toy.py"


def toy_sweep(root, *args):
    """``engine_toy.py`` as a sweep of runs under ``root`` (a subprocess)."""
    return [sys.executable, str(TOY), f"--workdir={root}", "--noprogress", *args]


def results_without_times(results):
    return {k: v for k, v in results.items() if not k.endswith("_s")}


@pytest.mark.slow
def test_two_jobs_give_the_runs_of_one_and_a_failing_run_is_recorded(tmp_path):
    seq = subprocess.run(
        toy_sweep(tmp_path / "seq", "--runs=a,b", "--epochs=2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    par = subprocess.run(
        toy_sweep(tmp_path / "par", "--runs=a,bad,b", "--fail=bad", "--epochs=2", "--jobs=2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seq.returncode == 0 and par.returncode == 0, par.stderr[-2000:]
    assert "[1/2] a ->" in seq.stdout and "runs, 2 at a time" in par.stdout
    ran = {line.split()[1]: line for line in par.stdout.splitlines() if line.startswith("[")}
    assert set(ran) == {"a", "b", "bad"} and "FAILED (exit status 1)" in ran["bad"]
    assert "run bad fails on purpose" in ran["bad"] and " done in " in ran["a"]
    seq_rows = sweep.collect(tmp_path / "seq", ["a", "b"])
    par_rows = sweep.collect(tmp_path / "par", ["a", "b", "bad"])
    for name in ("a", "b"):  # the same run, in a child process
        assert results_without_times(par_rows[name]["results"]) == results_without_times(
            seq_rows[name]["results"]
        )
        assert par_rows[name]["failed"] is None
        assert "resumed" not in (tmp_path / "par" / name / sweep.LOG).read_text()
    assert par_rows["bad"]["results"] is None and par_rows["bad"]["config"] is None
    assert par_rows["bad"]["failed"]["error"] == "error: run bad fails on purpose"
    assert par_rows["bad"]["failed"]["exit_status"] == 1


def wait_for_lines(paths, pattern, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if all(p.is_file() and re.search(pattern, p.read_text(), re.M) for p in paths):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} in {[p.read_text() for p in paths if p.is_file()]}")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_killed_parent_leaves_every_child_saved_and_the_sweep_resumes(tmp_path, signum):
    """SIGTERM, and SIGINT to the parent's process group (a Ctrl-C in its terminal):
    passed on to the children once, which save; exit 128 + N once they have. SIGKILL:
    the children see the parent gone, SIGTERM themselves and save."""
    logs = [tmp_path / name / sweep.LOG for name in ("a", "b")]
    parent = subprocess.Popen(
        toy_sweep(tmp_path, "--runs=a,b", "--jobs=2", "--log_every=1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_lines(logs, r"^epoch +1 ")  # both children are training
        if signum == signal.SIGINT:
            os.killpg(parent.pid, signum)
        else:
            parent.send_signal(signum)
        out, err = parent.communicate(timeout=60)
    finally:
        parent.kill()
    if signum != signal.SIGKILL:
        assert parent.returncode == 128 + signum, err[-2000:]
        assert f"signal {signum}: stopping 2 running run(s)" in out
        assert out.count("stopped (its state saved") == 2
    received = signal.SIGTERM if signum == signal.SIGKILL else signum
    wait_for_lines(logs, rf"^stopped by signal {int(received)} ")
    saved = []
    for log in logs:
        saved.append(int(re.search(r"checkpoint saved at step (\d+)", log.read_text())[1]))
        assert not (log.parent / "results.json").exists()
    again = subprocess.run(
        toy_sweep(tmp_path, "--runs=a,b", "--jobs=2", f"--max_steps={max(saved) + 3}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr[-2000:]
    for log, step in zip(logs, saved):
        assert f"resumed {log.parent} at step {step}" in log.read_text()
        results = json.loads((log.parent / "results.json").read_text())
        assert results["step"] == max(saved) + 3


def test_seed_runs_gives_a_run_per_seed_or_one_per_row_of_stacked_seeds():
    rows = [
        (sweep.seed_name(row, k), TOY_CONFIG.replace(seed=k))
        for row in ("a", "b")
        for k in range(3)
    ]
    made = []
    train = lambda config, k: made.append((config.seed, k)) or (lambda workdir, div: {})
    each = sweep.seed_runs(rows, 3, train, size=lambda config: 2.0 + config.seed)
    assert [r.name for r in each] == ["a", "a_s1", "a_s2", "b", "b_s1", "b_s2"]
    assert [(r.seeds, r.size) for r in each[:3]] == [(1, 2.0), (1, 3.0), (1, 4.0)]
    assert made == [(0, None), (1, None), (2, None)] * 2
    made.clear()
    stacked = sweep.seed_runs(rows, 3, train, stack=True)
    assert [(r.name, r.config.seed, r.seeds) for r in stacked] == [("a", 0, 3), ("b", 0, 3)]
    assert made == [(0, 3), (0, 3)]
    assert [r.seeds for r in sweep.seed_runs(rows[:1], 1, train, stack=True)] == [1]
    with pytest.raises(ValueError, match="run 1 is 'b', not seed 1 of 'a'"):
        sweep.seed_runs([rows[0], rows[3], rows[1], rows[4]], 2, train)  # row-minor
    with pytest.raises(ValueError, match="5 runs are not rows of 3 seeds"):
        sweep.seed_runs(rows[:5], 3, train)


def test_mean_sd_is_the_mean_and_sample_standard_deviation():
    assert tables.mean_sd([]) is None
    assert tables.mean_sd([0.5]) == "0.50" and tables.mean_sd([3], ".0f", "%") == "3%"
    assert tables.mean_sd([1.0, 2.0, 6.0]) == "3.00 ± 2.65 (n=3)"  # sd = sqrt(14 / 2)
    assert tables.mean_sd([89.5, 89.5], ".1f") == "89.5 ± 0.0 (n=2)"
    assert sweep.seed_name("lstm", 0) == "lstm" and sweep.seed_name("lstm", 2) == "lstm_s2"


def test_markdown_lays_out_blanks_and_alignment():
    text = tables.markdown(
        ["depth", "acc", "note"], [[10, "97.1", None], [20, None, "x"]], align="rr-"
    )
    assert text.splitlines() == [
        "| depth | acc | note |",
        "|---:|---:|---|",
        "| 10 | 97.1 | — |",
        "| 20 | — | x |",
    ]
    assert tables.markdown(["a"], [[None]], blank="-").splitlines()[1:] == ["|---|", "| - |"]
    with pytest.raises(ValueError, match="one of l, r, c"):
        tables.markdown(["a", "b"], [], align="r")


def test_write_table_replaces_the_file_whole(tmp_path):
    path = tables.write_table(tmp_path / "sub" / "table.md", "| a |\n")
    assert path.read_text() == "| a |\n" and not list(path.parent.glob("*.tmp"))
    tables.write_table(path, "| b |")
    assert path.read_text() == "| b |\n"


@pytest.mark.parametrize("name", ["config.json", "results.json", "metrics.jsonl"])
def test_collect_names_an_unreadable_file_in_one_line(tmp_path, name):
    """Issue 48: a corrupt config.json was a JSONDecodeError traceback without its path."""
    wd = tmp_path / "a"
    wd.mkdir()
    (wd / "config.json").write_text("{}")
    (wd / name).write_text('{"lr": 0.1,\n')  # cut short
    with pytest.raises(ValueError) as error:
        sweep.collect(tmp_path, ["a"])
    assert str(error.value).splitlines() == [str(error.value)]
    assert str(error.value).startswith(f"{wd / name} is unreadable (JSONDecodeError: ")
