"""training/sweep.py, the multi-run runner, on the engine's toy task: finished runs are not
trained again, a killed one resumes, incompatible workdirs are refused before any training."""

import dataclasses

import pytest

import engine_toy
from rhnzoo.training import engine, sweep


def toy_runs(task, epochs=2):
    cfg = engine.RunConfig(epochs=epochs, progress=False, log_every=100)
    train = lambda workdir: engine.run(task, cfg, workdir, {"toy": 1}, log=None).results
    return [sweep.Run(name, {"toy": 1}, train) for name in ("a", "b")]


def test_runner_skips_finished_runs_and_resumes_a_killed_one(tmp_path):
    calls = []
    task = engine_toy.make_task()

    def final_evaluate(params, track):
        calls.append(1)
        return task.final_evaluate(params, track)

    counted = dataclasses.replace(task, final_evaluate=final_evaluate)

    def killed(params, track):  # a run killed during its final evaluation: no results.json
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep.run_all(toy_runs(dataclasses.replace(task, final_evaluate=killed))[:1], tmp_path,
                      log=None)  # fmt: skip
    assert (tmp_path / "a" / "checkpoints").is_dir() and not (tmp_path / "a" / "results.json").exists()
    lines = []
    first = sweep.run_all(toy_runs(counted), tmp_path, log=lines.append)
    assert len(calls) == 2 and all(r["step"] == 2 * (engine_toy.N_TRAIN // engine_toy.BATCH)
                                   for r in first.values())  # fmt: skip
    again = sweep.run_all(toy_runs(counted), tmp_path, log=lines.append)
    assert len(calls) == 2 and again == first  # nothing trained or evaluated again
    rows = sweep.collect(tmp_path, ["a", "b", "c"])
    assert rows["c"] is None and rows["a"]["results"] == first["a"]
    assert len(rows["a"]["history"]) == 2


def test_incompatible_workdir_stops_the_sweep_before_training(tmp_path):
    task = engine_toy.make_task()
    sweep.run_all(toy_runs(task)[1:], tmp_path, log=None)  # b exists with {"toy": 1}
    runs = [dataclasses.replace(r, config={"toy": 2}) for r in toy_runs(task)]
    with pytest.raises(ValueError, match="incompatible"):
        sweep.run_all(runs, tmp_path, log=None)
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_hsg_depth_sweep_runs_in_process_and_skips_finished_runs(tmp_path):
    """experiments/sweep.py on the runner: two tiny PTB runs, then a rerun that trains nothing."""
    import os
    import pathlib
    import subprocess
    import sys

    if not (pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "ptb").is_dir():
        pytest.skip("real PTB files not found (set RHNZOO_DATA)")
    root = pathlib.Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "experiments" / "sweep.py"), f"--root={tmp_path}",
           "--depths=1", "--", "--hidden_size=8", "--batch_size=4", "--num_steps=10",
           "--max_steps=2", "--noprogress", "--eval_batch_size=20", "--eval_num_steps=200"]  # fmt: skip
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "d1_rhn" / "results.json").is_file()
    assert (tmp_path / "d1_hsg" / "results.json").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    assert again.returncode == 0 and again.stdout.count("already finished: final (") == 2
