"""The run engine without a model (tests/engine_toy.py: linear regression on shuffled
batches): exact resume, signals in training / evaluation / start-up, kill -9, divergence,
corrupt checkpoints, disk errors, strict JSON, unusable workdirs.

No test depends on timing: subprocess tests wait for a line the run prints once it is
training or validating, and assert on what was saved, not on when.
"""

import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import engine_toy
from rhnzoo.training import engine

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOY = ROOT / "tests" / "engine_toy.py"
SPE = engine_toy.N_TRAIN // engine_toy.BATCH  # 12 steps per epoch
TIMING = ("_per_s", "elapsed_s", "_eval_s")  # fields that differ between any two runs


def cfg(**kw):
    return engine.RunConfig(**{"epochs": 3, "progress": False, "log_every": 5, **kw})


def run(workdir, task=None, log=None, **kw):
    return engine.run(task or engine_toy.make_task(), cfg(**kw), workdir, {"toy": 1}, log=log)


def saved_state(workdir):
    mngr = ocp.CheckpointManager(pathlib.Path(workdir, "checkpoints").absolute())
    tree = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore())
    mngr.close()
    return tree


def outputs(workdir):
    """Every output of a run, timing fields removed: final state, best params, metrics, results."""
    workdir = pathlib.Path(workdir)
    untimed = lambda r: {k: v for k, v in r.items() if not k.endswith(TIMING)}
    metrics = [untimed(json.loads(l)) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    mngr = ocp.CheckpointManager((workdir / "best").absolute())
    best = {s: mngr.restore(s, args=ocp.args.StandardRestore()) for s in mngr.all_steps()}
    mngr.close()
    results = untimed(json.loads((workdir / "results.json").read_text()))
    return saved_state(workdir)["state"], best, metrics, results


def assert_same_outputs(a, b):
    (state_a, best_a, metrics_a, results_a), (state_b, best_b, metrics_b, results_b) = a, b
    assert jax.tree.structure(state_a) == jax.tree.structure(state_b)
    for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
        np.testing.assert_array_equal(x, y)
    assert sorted(best_a) == sorted(best_b)
    for x, y in zip(jax.tree.leaves(best_a), jax.tree.leaves(best_b)):
        np.testing.assert_array_equal(x, y)
    assert metrics_a == metrics_b
    assert results_a == results_b


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference run: 30 steps (2.5 epochs), checkpoints every 5 steps."""
    workdir = tmp_path_factory.mktemp("engine") / "full"
    run(workdir, max_steps=30, checkpoint_every_steps=5)
    return outputs(workdir)


def sigterm_at(step):
    """An ``on_batch`` hook that sends SIGTERM to this process when batch ``step`` is made."""

    def hook(epoch, index):
        if epoch * SPE + index == step:
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


@pytest.mark.parametrize("stop_at", [3, 12, 17])  # mid-epoch, the epoch's last step, mid-epoch 2
def test_resume_after_a_signal_reproduces_the_uninterrupted_run(tmp_path, uninterrupted, stop_at):
    """Shuffled batches, the per-step key, the epoch's loss sums and the validation record
    all resume exactly: every output equals the uninterrupted run's."""
    workdir = tmp_path / "w"
    lines = []
    with pytest.raises(engine.Interrupted) as info:
        run(workdir, engine_toy.make_task(on_batch=sigterm_at(stop_at)), lines.append,
            max_steps=30, checkpoint_every_steps=5)  # fmt: skip
    assert info.value.signum == signal.SIGTERM
    assert lines[-1].startswith("stopped by signal 15 in training at step ")
    assert int(saved_state(workdir)["state"]["step"]) == stop_at + 1  # saved where it stopped
    run(workdir, max_steps=30, checkpoint_every_steps=5)
    assert_same_outputs(outputs(workdir), uninterrupted)


def test_signal_at_start_up_saves_and_stops(tmp_path):
    engine.catch_signals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # arrives before the engine starts
        lines = []
        with pytest.raises(engine.Interrupted):
            run(tmp_path / "w", log=lines.append, max_steps=30)
    finally:
        engine.release_signals()
    assert "stopped by signal 15 at start-up at step 0" in lines[-1]
    assert int(saved_state(tmp_path / "w")["state"]["step"]) == 0


def toy(*args):
    return [sys.executable, str(TOY), "--noprogress", *args]


def wait_for(proc, prefix):
    """Reads the run's stdout until a line starting with ``prefix``; returns the lines."""
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return seen
    raise AssertionError(f"the run ended without printing {prefix!r}: {''.join(seen)}")


def test_sigterm_in_training_saves_and_exits_143(tmp_path):
    workdir = tmp_path / "w"
    proc = subprocess.Popen(toy(f"--workdir={workdir}"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(proc, "  step ")  # training has started (log_every=1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert out.strip().splitlines()[-1].startswith("stopped by signal 15 in training at step ")
    assert err.strip() == ""  # one line, no traceback
    step = int(saved_state(workdir)["state"]["step"])
    assert step > 0
    done = subprocess.run(toy(f"--workdir={workdir}", f"--max_steps={step + 2}"),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"resumed {workdir} at step {step}" in done.stdout


def test_sigterm_during_a_long_evaluation_saves_and_exits_143(tmp_path):
    workdir = tmp_path / "w"
    proc = subprocess.Popen(toy(f"--workdir={workdir}", "--slow_eval"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(proc, "validation started")  # an endless evaluation has begun
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert f"stopped by signal 15 during validation at step {SPE}" in out.splitlines()[-1]
    saved = saved_state(workdir)
    assert int(saved["state"]["step"]) == SPE and int(saved["meta"]["validated"]) == -1


def test_kill_9_at_several_moments_then_resume_gives_identical_outputs(tmp_path, uninterrupted):
    """SIGKILL after the 4th, 11th, 12th (end of epoch 1) and 22nd step line of successive
    attempts; whatever the kill interrupted (a step, a checkpoint write, the validation
    record), the finished run's outputs equal the uninterrupted run's."""
    workdir = tmp_path / "w"
    args = toy(f"--workdir={workdir}", "--max_steps=30", "--checkpoint_every_steps=5",
               "--log_every=5", "--epochs=3")  # fmt: skip
    args_every = [a if not a.startswith("--log_every") else "--log_every=1" for a in args]
    for target in (4, 11, 12, 22):
        proc = subprocess.Popen(args_every, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
        for line in proc.stdout:
            if line.startswith("  step ") and int(line.split()[1]) >= target:
                break
        proc.kill()
        proc.communicate(timeout=60)
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # log_every differs between the attempts (1) and the reference (5): drop the step records.
    state, best, metrics, results = outputs(workdir)
    ref_state, ref_best, ref_metrics, ref_results = uninterrupted
    epoch = lambda ms: [m for m in ms if m["kind"] == "epoch"]
    assert_same_outputs((state, best, epoch(metrics), results),
                        (ref_state, ref_best, epoch(ref_metrics), ref_results))  # fmt: skip


def test_exploding_but_finite_loss_stops_the_run(tmp_path):
    lines = []
    with pytest.raises(engine.TrainingDiverged) as info:
        run(tmp_path / "w", engine_toy.make_task(lr=0.05), lines.append,
            max_steps=200, checkpoint_every_steps=2)  # fmt: skip
    message = str(info.value)
    assert "exploded" in message and "non-finite" not in message, message
    intact = int(message.split("last good checkpoint (step ")[1].split(")")[0])
    assert int(saved_state(tmp_path / "w")["state"]["step"]) == intact
    assert "\n" not in message


@pytest.mark.parametrize("damage", ["truncate a data file", "delete _METADATA",
                                    "delete ocdbt.process_0"])  # fmt: skip
def test_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, uninterrupted, damage):
    workdir = tmp_path / "w"
    with pytest.raises(engine.Interrupted):
        run(workdir, engine_toy.make_task(on_batch=sigterm_at(21)), max_steps=30,
            checkpoint_every_steps=5)  # fmt: skip  (checkpoints at 5, 10, 12, 15, 20, 22)
    bad = workdir / "checkpoints" / "22" / "default"
    if damage == "truncate a data file":
        data_file = max((bad / "ocdbt.process_0" / "d").iterdir(), key=lambda p: p.stat().st_size)
        data_file.write_bytes(data_file.read_bytes()[:10])
    elif damage == "delete _METADATA":
        (bad / "_METADATA").unlink()
    else:
        shutil.rmtree(bad / "ocdbt.process_0")
    lines = []
    run(workdir, log=lines.append, max_steps=30, checkpoint_every_steps=5)
    warnings = [l for l in lines if l.startswith("warning:")]
    assert len(warnings) == 1 and "checkpoints/22 is unreadable" in warnings[0], lines
    assert "resuming from step 20" in warnings[0] and "\n" not in warnings[0]
    assert_same_outputs(outputs(workdir), uninterrupted)


def test_a_checkpoint_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device", "/some/dir")

    monkeypatch.setattr(ocp.CheckpointManager, "save", no_space)
    with pytest.raises(engine.RunError) as info:
        run(tmp_path / "w", max_steps=5, checkpoint_every_steps=2)
    assert "no space left on device" in str(info.value) and "\n" not in str(info.value)
    assert "checkpoints/2" in str(info.value)


def test_results_are_strict_json(tmp_path):
    path = tmp_path / "r.json"
    engine.write_json(path, {"a": math.inf, "b": [math.nan, 1.5], "c": np.float32(2.0)})

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {"a": None, "b": [None, 1.5],
                                                                     "c": 2.0}  # fmt: skip


def test_unusable_workdirs_are_refused_with_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        engine.prepare_workdir(tmp_path / "file", {})
    with pytest.raises(ValueError, match="cannot create workdir .*file/sub"):
        engine.prepare_workdir(tmp_path / "file" / "sub", {})
    assert not (tmp_path / "file" / "sub").exists()


def test_resuming_a_workdir_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    """A resumed run whose workdir became read-only: one error line, no traceback (it was a
    PermissionError from metrics.cut_back). Root may write anywhere, so the failures are
    made by hand: a directory where cut_back writes its temporary file, then a workdir
    where no file can be created."""
    run(tmp_path / "w", max_steps=15)
    (tmp_path / "w" / ".metrics.jsonl.tmp").mkdir()
    with pytest.raises(engine.RunError, match="cannot write .*metrics.jsonl") as e:
        run(tmp_path / "w", max_steps=20)
    assert "\n" not in str(e.value)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("tempfile.TemporaryFile", read_only)
    with pytest.raises(ValueError, match="workdir .* is not writable: .*Permission denied"):
        engine.prepare_workdir(tmp_path / "w", {"toy": 1})


@pytest.mark.parametrize("bad", [dict(max_steps=0), dict(max_epochs=-1), dict(max_epochs=0),
                                 dict(checkpoint_every_steps=-1), dict(log_every=0),
                                 dict(epochs=0)])  # fmt: skip
def test_run_length_settings_are_validated(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"--{name} must be an integer >= "):
        cfg(**bad)


def test_tensorboard_event_files_hold_the_metrics(tmp_path):
    """--tensorboard: tensorboardX event files (no TensorFlow) with the epoch and step
    records' scalars, read back with tensorboardX's bundled Event protobuf."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    run(tmp_path / "w", max_steps=15, log_every=5, tensorboard=True)
    (events_file,) = (tmp_path / "w" / "tensorboard").glob("events.out.tfevents.*")
    data, tags = events_file.read_bytes(), {}
    while data:  # TFRecord: length, crc, payload, crc
        (length,) = struct.unpack("<Q", data[:8])
        event = Event.FromString(data[12 : 12 + length])
        data = data[16 + length :]
        for value in event.summary.value:
            tags.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert [s for s, _ in tags["train/train_mse"]] == [5, 10, 15]
    assert [s for s, _ in tags["epoch/valid_mse"]] == [12, 15]
    metrics = [json.loads(l) for l in (tmp_path / "w" / "metrics.jsonl").read_text().splitlines()]
    epoch_valid = [m["valid_mse"] for m in metrics if m["kind"] == "epoch"]
    assert [v for _, v in tags["epoch/valid_mse"]] == pytest.approx(epoch_valid, rel=1e-6)


def test_a_finished_run_is_not_trained_or_evaluated_again(tmp_path):
    """Rerunning a finished workdir: one line 'already finished: <final line>' and the
    stored results; a longer run extends it; a run stopped by patience stays stopped."""
    import dataclasses

    calls = []

    def counted(task):
        def final_evaluate(params, track):
            calls.append(1)
            return task.final_evaluate(params, track)

        return dataclasses.replace(task, final_evaluate=final_evaluate)

    task, lines = counted(engine_toy.make_task()), []
    first = run(tmp_path / "w", task, log=lines.append, epochs=2)
    assert first.results["stopped"] == "end" and len(calls) == 1
    final = [l for l in lines if l.startswith("final (")]
    lines.clear()
    again = run(tmp_path / "w", task, log=lines.append, epochs=2)
    assert lines == [f"already finished: {final[0]}"] and len(calls) == 1
    assert again.results == json.loads((tmp_path / "w" / "results.json").read_text())
    assert [r["step"] for r in again.history] == [SPE, 2 * SPE]
    longer = run(tmp_path / "w", task, log=lines.append, epochs=3)
    assert longer.results["step"] == 3 * SPE and len(calls) == 2

    # Patience: the stop is final, whatever the run length.
    stalled = counted(engine_toy.make_task(lr=0.0))
    run(tmp_path / "p", stalled, patience=1, epochs=5)
    stored = json.loads((tmp_path / "p" / "results.json").read_text())
    assert stored["stopped"] == "patience" and stored["step"] < 5 * SPE
    lines.clear()
    run(tmp_path / "p", stalled, log=lines.append, patience=1, epochs=8)
    assert len(lines) == 1 and lines[0].startswith("already finished: final (")


def test_whole_run_estimate_and_eta(monkeypatch):
    """Once, after the first steps, the whole run's estimated time and the device; every
    training-log line ends with the whole run's ETA."""
    monkeypatch.setattr(engine, "ESTIMATE_MIN_S", 0.0)
    lines = []
    engine.run(engine_toy.make_task(), cfg(epochs=3), None, log=lines.append)
    estimates = [l for l in lines if l.startswith("estimated ")]
    assert len(estimates) == 1 and "steps left" in estimates[0] and "per step on CPU" in estimates[0]
    assert all("| run ETA " in l for l in lines if l.startswith("  step") and "step      35" not in l)
    assert engine._duration(40) == "40 s" and engine._duration(7 * 3600 + 300) == "7 h 5 min"
    assert engine._duration(3 * 86400 + 4 * 3600) == "3 d 4 h"
