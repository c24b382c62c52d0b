"""experiments/jsb.py as a user runs it: a tiny study end to end, and bad flags."""

import functools
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from helpers import DATA, ROOT, run_script

SCRIPT = ROOT / "experiments" / "jsb.py"
JSB_DIR = DATA / "jsb_chorales"
jsb = functools.partial(run_script, "jsb.py", cwd=None)


def data_flags(tmp_path):
    """The real pickle when RHNZOO_DATA has it, else a generated one in the same layout."""
    if (JSB_DIR / "jsb_chorales.pickle").exists():
        return [f"--data_dir={JSB_DIR}"]
    rng = np.random.default_rng(0)
    splits = {
        split: [
            [tuple(int(n) for n in rng.choice(np.arange(43, 97), 4)) for _ in range(length)]
            for length in rng.integers(5, 20, k)
        ]
        for split, k in (("train", 12), ("valid", 4), ("test", 4))
    }
    (tmp_path / "jsb").mkdir()
    (tmp_path / "jsb" / "jsb_chorales.pickle").write_bytes(pickle.dumps(splits, protocol=2))
    return [f"--data_dir={tmp_path / 'jsb'}", "--noverify", "--nodownload"]


@pytest.mark.slow
def test_tiny_study_writes_results_table_and_plot(tmp_path):
    workdir = tmp_path / "w"
    args = [
        *data_flags(tmp_path),
        "--depths=1,2",
        "--trials=2",
        "--epochs=1",
        "--width=6",
        f"--workdir={workdir}",
    ]
    result = jsb(*args)
    assert result.returncode == 0, result.stderr[-3000:]

    rows = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 * 2
    assert {(r["arch"], r["depth"], r["trial"]) for r in rows} == {
        (a, d, t) for a in ("rhn", "dtrnn", "dtsrnn") for d in (1, 2) for t in (0, 1)
    }
    # Same hyperparameter draw for every (arch, depth) of a trial; two trials differ.
    for t in (0, 1):
        assert len({r["lr"] for r in rows if r["trial"] == t}) == 1
    assert rows[0]["lr"] != rows[-1]["lr"]
    # Parameter counts matched across architectures at each depth: within 10 % at this tiny
    # width, where one unit more or less is a 5 % step (e.g. DT(S)-RNN depth 2: 1,933 vs 1,840).
    for d in (1, 2):
        counts = [r["params"] for r in rows if r["depth"] == d]
        assert max(counts) / min(counts) < 1.10
    # Depth 1: DT(S)-RNN has no shortcut, so it is the DT-RNN (same width and init) exactly.
    for t in (0, 1):
        same = [
            r["test_nll"]
            for r in rows
            if r["depth"] == 1 and r["trial"] == t and r["arch"] != "rhn"
        ]
        assert same[0] == same[1]

    png = (workdir / "jsb_swarm.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    table = (workdir / "results.md").read_text()
    body = [
        line for line in table.splitlines() if line.startswith("| ") and "architecture" not in line
    ]
    labels = [tuple(c.strip() for c in line.split("|")[1:3]) for line in body]
    assert labels == [
        (arch, depth) for depth in ("1", "2") for arch in ("RHN", "DT-RNN", "DT(S)-RNN")
    ]
    for line in body:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[5] == "2"  # trials
        assert float(cells[7]) > 0 and float(cells[8]) > 0  # best and median test NLL

    # Rerunning with the same workdir skips the finished trials.
    again = jsb(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "12 of 12 trials already finished" in again.stdout
    assert len((workdir / "results.jsonl").read_text().splitlines()) == 12


@pytest.mark.slow
def test_ctrl_c_prints_one_line_and_keeps_the_finished_trials(tmp_path):
    """SIGINT during a trial: one line saying where it stopped, exit 130 (it printed nothing)."""
    import signal

    workdir = tmp_path / "w"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            *data_flags(tmp_path),
            "--archs=rhn",
            "--depths=1",
            "--trials=50",
            "--epochs=20",  # a trial of a few seconds: the signal lands in a later one
            "--width=6",
            f"--workdir={workdir}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:  # wait until a trial has finished: training is under way
        if line.startswith("[   1/"):
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    stopped = [l for l in (out + err).splitlines() if l.startswith("stopped by signal 2")]
    assert len(stopped) == 1 and "rerun with the same --workdir" in stopped[0], out + err
    assert "finished trials are in" in stopped[0]
    assert "Traceback" not in err
    assert len(list((workdir / "trials").glob("*/results.json"))) >= 1


@pytest.mark.slow
def test_two_jobs_give_the_trials_of_one_after_another(tmp_path):
    """--jobs=2: every trial in a child process (this command with --sweep_run)."""
    args = [
        *data_flags(tmp_path),
        "--archs=rhn",
        "--depths=1",
        "--trials=2",
        "--epochs=1",
        "--width=6",
    ]
    seq = jsb(*args, f"--workdir={tmp_path / 'seq'}")
    par = jsb(*args, f"--workdir={tmp_path / 'par'}", "--jobs=2")
    assert seq.returncode == 0 and par.returncode == 0, par.stderr[-3000:]
    assert "2 runs, 2 at a time in child processes" in par.stdout
    done = [
        line.split()[1]
        for line in par.stdout.splitlines()
        if line.startswith("[") and " done in " in line
    ]
    assert sorted(done) == ["rhn_d1_t0", "rhn_d1_t1"]
    lines = lambda root: (tmp_path / root / "results.jsonl").read_text().splitlines()
    nll = ("valid_nll", "test_nll")
    untimed = lambda root: [
        {k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines(root)
    ]
    par, seq = untimed("par"), untimed("seq")
    assert len(par) == 2 and [{k: v for k, v in r.items() if k not in nll} for r in par] == [
        {k: v for k, v in r.items() if k not in nll} for r in seq
    ]
    # The NLLs to float32 rounding: with the fused RHN scan (auto since issue 45) the second
    # trial's validation NLL in one process differed from the same trial's in a fresh
    # child by 1.3e-7 relative (13.2031940 vs 13.2031923; its test NLL equal), where the
    # reference scan agreed to the bit. Cause not found (BUILD_NOTES, known gaps).
    for a, b in zip(par, seq):
        np.testing.assert_allclose([a[k] for k in nll], [b[k] for k in nll], rtol=1e-6)


@pytest.mark.parametrize(
    "flag,expected",
    [
        # Old: the error line came after the study root's config.json was written.
        ("--sweep_run=bogus", "--sweep_run=bogus is not a run of this sweep (rhn_d1_t0)"),
        # Old: accepted; every batch padded to 100,000 rows, killed for memory.
        ("--batch_size=100000", "--batch_size must be at most "),
    ],
)
def test_a_bad_run_flag_is_one_line_and_writes_nothing(tmp_path, flag, expected):
    workdir = tmp_path / "w"
    args = ["--archs=rhn", "--depths=1", "--width=4", "--epochs=1", "--trials=1"]
    result = jsb(*data_flags(tmp_path), *args, f"--workdir={workdir}", flag)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(f"error: {expected}"), lines
    if "batch_size" in flag:
        assert lines[0].endswith(", the training set's sequences, got 100000")
    assert not workdir.exists()
