r"""Fault trials of the run engine on the real PTB ``--preset=small`` run (run by hand).

  RHNZOO_DATA=../shared/data python tests/fault_trials.py --out=/tmp/faults [--quick]

Not collected by pytest (no ``test_`` prefix): it takes minutes and needs the real
PTB files; tests/test_engine.py holds the same cases on a toy task. It prints one JSON
object per trial and writes them all to ``<out>/trials.json``. Trials:

* kill -9 at 10 moments (8 at random times, one when the last periodic checkpoint
  of epoch 1 appears, one when epoch 1's best checkpoint appears, i.e. between the
  validation and the epoch's latest checkpoint), then a finishing run: every output
  (final state, best/, metrics.jsonl epoch records, results.json; timing fields
  aside) compared with an uninterrupted run;
* the three corruption modes of the newest checkpoint, then a rerun: one warning,
  fallback, same outputs;
* SIGTERM at start-up, in training and in the final (batch-1) evaluation: exit
  status, seconds from the signal to the exit, stdout/stderr line counts;
* a disk that fills up (a 20 MB tmpfs; needs root to mount): exit status, stderr lines;
* ``--lr=5`` and ``--lr=100``: exit status and the error line.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PTB = [sys.executable, str(ROOT / "experiments" / "ptb.py"), "--preset=small", "--noprogress"]
sys.path.insert(0, str(ROOT / "tests"))


def outputs(workdir):
    from test_engine import outputs as engine_outputs

    state, best, metrics, results = engine_outputs(workdir)
    return state, best, [m for m in metrics if m["kind"] == "epoch"], results


def same(a, b) -> bool:

    try:
        from test_engine import assert_same_outputs

        assert_same_outputs(a, b)
        return True
    except AssertionError as e:
        print("MISMATCH:", str(e)[:500], file=sys.stderr)
        return False


def checkpoint_steps(workdir) -> list[int]:
    """The steps of the checkpoints in ``workdir`` (not a save's temporary directory)."""
    found = (workdir / "checkpoints").glob("*")
    return sorted(int(p.name) for p in found if p.name.isdigit())


def start(args, **kw):
    return subprocess.Popen(
        PTB + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **kw
    )


def finish(args):
    return subprocess.run(PTB + args, capture_output=True, text=True, cwd=ROOT)


def wait_until(predicate, proc, timeout=3600):
    t0 = time.time()
    while not predicate():
        if proc.poll() is not None or time.time() - t0 > timeout:
            return False
        time.sleep(0.05)
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke test)")
    opts = parser.parse_args()
    out = pathlib.Path(opts.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    steps = 200 if opts.quick else 1387  # 1,327 steps per epoch: epoch 1 and 60 more
    run_args = ["--checkpoint_every_steps=20", f"--max_steps={steps}"]
    trials = []

    def record(**kw):
        print(json.dumps(kw), flush=True)
        trials.append(kw)

    t0 = time.time()
    ref = finish(run_args + [f"--workdir={out / 'ref'}"])
    record(trial="uninterrupted", rc=ref.returncode, seconds=round(time.time() - t0, 1))
    reference = outputs(out / "ref")

    # kill -9 at 10 moments, then finish. Eight kills land a random 0-1.5 s after the run
    # reports passing a random step (so they hit steps, checkpoint writes, validation,
    # the final evaluation alike); one when the last periodic checkpoint of epoch 1
    # appears; one when epoch 1's best checkpoint appears (after the validation,
    # before the epoch's metrics record and latest checkpoint).
    workdir = out / "kill"
    rng = random.Random(0)
    last_periodic = (min(steps, 1327) // 20) * 20
    last_periodic -= 20 if last_periodic == min(steps, 1327) else 0
    best_step = min(steps, 1327)
    targets = [("step", t) for t in rng.sample(range(1, steps + 1), 8)]
    targets += [("checkpoint", last_periodic), ("best", best_step)]
    targets.sort(key=lambda t: t[1])
    for kind, target in targets:
        proc = start(run_args + ["--log_every=10", f"--workdir={workdir}"])
        if kind == "step":
            for line in proc.stdout:
                if line.startswith("  step ") and int(line.split()[1]) >= target:
                    break
            time.sleep(rng.uniform(0, 1.5))
        else:
            sub = "checkpoints" if kind == "checkpoint" else "best"
            wait_until((workdir / sub / str(target)).exists, proc)
        alive = proc.poll() is None
        proc.kill()
        proc.communicate()
        step = max(checkpoint_steps(workdir) or [0])
        record(
            trial="kill -9",
            moment=f"{kind} {target}",
            killed_while_running=alive,
            newest_checkpoint=step,
        )
    done = finish(run_args + [f"--workdir={workdir}"])
    record(
        trial="kill -9: finishing run",
        rc=done.returncode,
        identical_to_uninterrupted=same(outputs(workdir), reference),
    )

    # Corruption of the newest checkpoint, three ways.
    for damage in ("truncate a data file", "delete _METADATA", "delete ocdbt.process_0"):
        workdir = out / f"corrupt_{damage.split()[0]}_{damage.split()[-1]}"
        shutil.copytree(out / "ref", workdir)
        (workdir / "results.json").unlink()  # else the rerun is "already finished", reads nothing
        newest = max(checkpoint_steps(workdir))
        bad = workdir / "checkpoints" / str(newest) / "default"
        if damage.startswith("truncate"):
            data = max((bad / "ocdbt.process_0" / "d").iterdir(), key=lambda p: p.stat().st_size)
            data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
        elif damage == "delete _METADATA":
            (bad / "_METADATA").unlink()
        else:
            shutil.rmtree(bad / "ocdbt.process_0")
        rerun = finish(run_args + [f"--workdir={workdir}"])
        warnings = [l for l in rerun.stdout.splitlines() if l.startswith("warning:")]
        record(
            trial=f"corrupt newest checkpoint: {damage}",
            rc=rerun.returncode,
            warnings=warnings,
            stderr_lines=len(rerun.stderr.strip().splitlines()),
            stderr_head=rerun.stderr.strip().splitlines()[:5],
            identical_to_uninterrupted=same(outputs(workdir), reference),
        )

    # SIGTERM at start-up, in training, in the final evaluation.
    for phase in ("start-up", "training", "final evaluation"):
        workdir = out / f"sigterm_{phase.split()[0]}"
        args = [f"--workdir={workdir}", "--log_every=10"]
        args += ["--max_steps=20", "--eval_batch_size=1"] if phase == "final evaluation" else []
        proc = start(args)
        if phase == "start-up":
            wait_until((workdir / "config.json").exists, proc)
        else:
            prefix = "  step " if phase == "training" else "epoch "
            for line in proc.stdout:
                if line.startswith(prefix):
                    break
        t = time.time()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate()
        record(
            trial=f"SIGTERM in {phase}",
            rc=proc.returncode,
            seconds_to_exit=round(time.time() - t, 2),
            last_line=stdout.strip().splitlines()[-1],
            stderr_lines=len(stderr.strip().splitlines()),
            saved=checkpoint_steps(workdir),
        )

    # A disk that fills up.
    tiny = out / "tiny_disk"
    tiny.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(tiny)], capture_output=True
        ).returncode
        == 0
    )
    if mounted:
        try:
            full = finish(
                ["--checkpoint_every_steps=5", "--max_steps=40", f"--workdir={tiny / 'w'}"]
            )
            record(
                trial="disk full (20 MB tmpfs)",
                rc=full.returncode,
                stderr=full.stderr.strip().splitlines(),
            )
        finally:
            subprocess.run(["umount", str(tiny)])
    else:
        record(trial="disk full", skipped="could not mount a tmpfs (needs root)")

    # Exploding learning rates.
    for lr in ("5", "100"):
        exploded = finish([f"--lr={lr}", "--max_steps=300", f"--workdir={out / f'lr{lr}'}"])
        record(
            trial=f"--lr={lr}", rc=exploded.returncode, stderr=exploded.stderr.strip().splitlines()
        )

    (out / "trials.json").write_text(json.dumps(trials, indent=1))


if __name__ == "__main__":
    main()
