"""Two processes (jax.distributed on CPU, gloo collectives) train like one process.

``experiments/ptb.py --distributed --coordinator_address=localhost:PORT --num_processes=2
--process_id=i`` started twice, one CPU device each: a 2-device global mesh, batch rows
sharded over the processes, parameters replicated, evaluation on arrays spread over both
processes. The losses, validation and test perplexities must equal those of one process
with the same global batch (up to float reduction order).
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "ptb.py"
PTB_DIR = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "ptb"
RUN = ["--hidden_size=16", "--depth=2", "--batch_size=4", "--num_steps=10", "--max_steps=12",
       "--log_every=2", "--eval_batch_size=2", "--eval_num_steps=200", "--noprogress"]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def records(workdir):
    return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.skipif(not (PTB_DIR / "ptb.train.txt").exists(),
                    reason=f"real PTB files not found in {PTB_DIR} (set RHNZOO_DATA)")  # fmt: skip
@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    one = subprocess.run([sys.executable, str(SCRIPT), *RUN, f"--workdir={tmp_path / 'one'}"],
                         capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert one.returncode == 0, one.stderr[-2000:]

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), *RUN, f"--workdir={tmp_path / 'two'}", "--distributed",
             f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    ours = lambda out: [l for l in out.splitlines() if not l.startswith("[Gloo]")]  # gloo's banner
    assert any(l.startswith("final") for l in ours(outs[0][0])) and ours(outs[1][0]) == []

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
