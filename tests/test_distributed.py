"""Two processes (jax.distributed on CPU, gloo collectives) train like one process.

``experiments/ptb.py --distributed --coordinator_address=localhost:PORT --num_processes=2
--process_id=i`` started twice, one CPU device each: a 2-device global mesh, batch rows
sharded over the processes, parameters replicated, evaluation on arrays spread over both
processes. The losses, validation and test perplexities must equal those of one process
with the same global batch (up to float reduction order). The same for the sequence
classifier (``experiments/rrl.py``, P-MNIST in generated idx files). The language model
reads the generated PTB of ``tests/corpus.py``: the contract is the sharding, not the data.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest
from corpus import flags as on
from helpers import write_random_mnist

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "ptb.py"
RUN = [
    "--hidden_size=16",
    "--depth=2",
    "--batch_size=4",
    "--num_steps=10",
    "--max_steps=12",
    "--log_every=2",
    "--eval_batch_size=2",
    "--eval_num_steps=200",
    "--noprogress",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def records(workdir):
    return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def one_and_two_processes(script, args, workdir):
    """Runs ``script args`` as one process in ``workdir/one`` and as two (``--distributed``
    on localhost) in ``workdir/two``; returns the two processes' stdout lines (gloo's
    banner and each process's line saying what it joins left out, after checking it)
    after checking that every run exits 0."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    one = subprocess.run(
        [sys.executable, str(script), *args, f"--workdir={workdir / 'one'}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                *args,
                f"--workdir={workdir / 'two'}",
                "--distributed",
                f"--coordinator_address=localhost:{port}",
                "--num_processes=2",
                f"--process_id={i}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    for i, (out, _) in enumerate(outs):
        assert out.startswith(f"--distributed: process {i} joining 2 processes at localhost:")
    return [
        [l for l in out.splitlines() if not l.startswith(("[Gloo]", "--distributed: "))]
        for out, _ in outs
    ]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path, generated_ptb):
    first, second = one_and_two_processes(SCRIPT, [*RUN, *on(generated_ptb)], tmp_path)
    assert any(l.startswith("final") for l in first) and second == []

    a, b = records(tmp_path / "one"), records(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) == 7  # 6 step lines + epoch
    for ra, rb in zip(a, b):
        for key in ("train_ppl", "valid_ppl"):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], rel=1e-5), (key, ra, rb)
    ra = json.loads((tmp_path / "one" / "results.json").read_text())
    rb = json.loads((tmp_path / "two" / "results.json").read_text())
    for key in ("valid_ppl", "test_ppl"):
        assert rb[key] == pytest.approx(ra[key], rel=1e-5)


@pytest.mark.slow
def test_two_processes_train_a_classifier_like_one(tmp_path):
    write_random_mnist(tmp_path / "mnist", train=120, test=20)
    # 102 train / 18 dev / 20 test sequences: batches of 20 split 10 + 10 over the
    # processes; the dev set's last batch is partly padding rows (weight 0).
    args = [
        "--dataset=pmnist",
        "--model=lstm",
        "--hidden_size=8",
        "--max_len=16",
        "--batch_size=20",
        "--max_steps=4",
        "--log_every=1",
        "--noprogress",
        f"--data_dir={tmp_path / 'mnist'}",
        "--noverify_data",
        "--nodownload",
    ]
    first, second = one_and_two_processes(ROOT / "experiments" / "rrl.py", args, tmp_path)
    assert any(l.startswith("final") for l in first) and second == [], first
    one, two = tmp_path / "one" / "lstm", tmp_path / "two" / "lstm"  # <root>/<model>
    a, b = records(one), records(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) >= 4
    for ra, rb in zip(a, b):
        for key in ("train_xent", "train_acc", "dev_acc", "dev_xent"):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], rel=1e-5), (key, ra, rb)
    ra = json.loads((one / "results.json").read_text())
    rb = json.loads((two / "results.json").read_text())
    for key in ("dev_acc", "dev_xent", "test_acc", "test_xent"):
        assert rb[key] == pytest.approx(ra[key], rel=1e-5)


def test_an_unreachable_coordinator_is_one_line_after_the_timeout(tmp_path):
    """Issue 48: a process other than 0 says what it waits for, then gives up after
    --distributed_timeout with one error line (JAX alone would wait, then abort)."""
    args = [
        sys.executable,
        str(SCRIPT),
        "--distributed",
        f"--workdir={tmp_path / 'w'}",
        f"--coordinator_address=localhost:{free_port()}",
        "--num_processes=2",
        "--process_id=1",
        "--distributed_timeout=2",
    ]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    assert result.stdout.startswith("--distributed: process 1 joining 2 processes at localhost:")
    assert result.stderr.strip().splitlines() == [
        f"error: --distributed: no coordinator answered at {args[4].split('=')[1]} within 2 s; "
        "start process 0 first or check --coordinator_address"
    ]
    assert not (tmp_path / "w").exists()
