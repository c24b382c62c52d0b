"""A kernel window's files into the verified record (issues 68, 70: ``tools/kernel_record.py``,
``python -m tools.kernel_record OUT_DIR [--dry]``): a hand-written sample of
kernel_probe.py's lines and ``env.txt`` become record entries (per shape and kernel
candidate, the kernel's and the fused scan's times, the errors, the digest, device kind,
date and commit), and those entries make ``auto`` pick the kernel they verify; lines
without a digest are refused unless this checkout is the window's commit; the command
prints (``--dry``) or merges into the checkout's ``verified.json``, never a dry run's."""

import dataclasses
import json
import subprocess
import sys

import jax.numpy as jnp
import pytest

from rhnzoo import cells
from rhnzoo.cells import scan
from rhnzoo.cells.kernels import verified
from rhnzoo.cells.scan import ScanImpl
from tools import kernel_record

ROOT = kernel_record.ROOT
H100 = verified.H100


def auto(cell, batch=100):
    return scan.resolve("auto", cell, batch=batch, dtype=jnp.bfloat16)


COMMIT = "0123456789abcdef0123456789abcdef01234567"
ENV = """Sat Jan  2 03:17:57 AM UTC 2027
part: kernel
0123456789abcdef0123456789abcdef01234567
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)
jax 0.11.2 [CudaDevice(id=0)]
"""

# Written by hand in kernel_probe.py's format: (figure, n, B, ms / errors).
WINDOW = [
    '{"figure": "pallas_forward", "n": 64, "B": 100, "ms": 4.1, "T": 784, "device": "D"}',
    '{"figure": "pallas_value_and_grad", "n": 64, "B": 100, "ms": 7.1, "T": 784, "device": "D"}',
    '{"figure": "pallas_bt16_value_and_grad", "n": 64, "B": 100, "ms": 6.0, "T": 784, '
    '"device": "D"}',
    '{"figure": "pallas_bt32_value_and_grad", "n": 64, "B": 100, "T": 784, "device": "D", '
    '"error": "XlaRuntimeError: misaligned"}',
    '{"figure": "fused_bf16_value_and_grad", "n": 64, "B": 100, "ms": 9.5, "T": 784, '
    '"device": "D"}',
    '{"figure": "pallas_value_and_grad", "n": 100, "B": 100, "ms": 13.7, "T": 784, "device": "D"}',
    '{"figure": "fused_bf16_value_and_grad", "n": 100, "B": 100, "ms": 11.1, "T": 784, '
    '"device": "D"}',
    '{"figure": "pallas_value_and_grad", "n": 64, "B": 32, "ms": 5.0, "T": 784, "device": "D"}',
    "not a JSON line: a traceback's tail",
    '{"figure": "error_pallas", "n": 64, "B": 100, "ms": 7.2, "T": 784, "device": "D", '
    '"loss_rel_err": 0.0004, "grad_rel_err": {"W": 0.01, "U": 0.03, "b": 0.002}}',
    '{"figure": "error_pallas_approx_math", "n": 64, "B": 100, "ms": 5.0, "T": 784, '
    '"device": "D", "loss_rel_err": 0.001, "grad_rel_err": {"W": 0.02, "U": 0.04, "b": 0.01}}',
    '{"figure": "error_fused_bf16", "n": 64, "B": 100, "ms": 9.4, "T": 784, "device": "D", '
    '"loss_rel_err": 0.0003, "grad_rel_err": {"W": 0.01, "U": 0.02, "b": 0.002}}',
]


def window(tmp_path, lines=WINDOW, device=H100, digest=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "env.txt").write_text(ENV)
    text = "\n".join(lines).replace('"device": "D"', json.dumps({"device": device})[1:-1])
    if digest:
        text = text.replace('"T": 784', f'"T": 784, "digest": "{digest}"')
    (tmp_path / "kernel.jsonl").write_text(text + "\n")
    (tmp_path / "kernel-ptxas.txt").write_text("ptxas info: 168 registers\n")
    return tmp_path


def test_a_windows_files_become_record_entries(tmp_path):
    got = kernel_record.entries_from_window(window(tmp_path), digests={"gated": "d" * 64})
    by = {(e.hidden_size, e.batch, tuple(e.options.items())): e for e in got}
    assert set(by) == {
        (64, 100, ()),
        (64, 100, (("batch_tile", 16),)),
        (64, 100, (("approx_math", True),)),
        (100, 100, ()),
    }  # n 64 B 32: no fused figure; bt32: failed
    e = by[64, 100, ()]
    assert (e.backend, e.cell, e.depth, e.input_size, e.length, e.dtype) == (
        "gated", "LSTM", None, 1, 784, "bfloat16"
    )  # fmt: skip
    assert (e.device_kind, e.date, e.commit) == (H100, "2027-01-02", COMMIT)
    assert (e.kernel_ms, e.fused_ms, e.value_error, e.grad_error) == (7.1, 9.5, 0.0004, 0.03)
    assert e.digest == "d" * 64 and not e.stand_in and verified.checked(e)
    bt16 = by[64, 100, (("batch_tile", 16),)]
    assert (bt16.kernel_ms, bt16.value_error) == (6.0, None) and not verified.checked(bt16)
    approx = by[64, 100, (("approx_math", True),)]
    assert (approx.kernel_ms, approx.fused_ms, approx.grad_error) == (5.0, 9.4, 0.04)
    slow = by[100, 100, ()]
    assert (slow.kernel_ms, slow.fused_ms) == (13.7, 11.1) and not verified.checked(slow)
    # the record's text round-trips; a re-recorded configuration replaces its entry
    assert verified.parse(kernel_record.dumps(got)) == got
    again = dataclasses.replace(e, kernel_ms=6.5, date="2027-02-01")
    merged = kernel_record.merge(got, [again])
    assert len(merged) == len(got) and merged[-1] is again and e not in merged


def test_a_recorded_window_makes_auto_pick_what_it_verified(tmp_path):
    """The round trip: the window ran this source on an H100; its entries as the record;
    auto picks the LSTM kernel at n 64, B 100 only (n 100 measured slower)."""
    got = kernel_record.entries_from_window(window(tmp_path, digest=verified.digest("gated")))
    with scan.for_platform("gpu"), verified.stand_in(H100, "9.0"), verified.using(got):
        assert auto(cells.LSTM(64), 100) is ScanImpl.PALLAS
        assert auto(cells.LSTM(64), 32) is ScanImpl.FUSED
        assert auto(cells.LSTM(100), 100) is ScanImpl.FUSED


def test_a_window_without_digests_is_refused_and_a_dry_run_verifies_nothing(tmp_path):
    with pytest.raises(ValueError, match="carry no kernel digest"):
        kernel_record.entries_from_window(window(tmp_path))
    dry = [line.replace('"T": 784', '"T": 784, "stand_in": true') for line in WINDOW]
    got = kernel_record.entries_from_window(
        window(tmp_path, dry, "cpu"), digests={"gated": "d" * 64}
    )
    assert got and all(e.stand_in and not verified.checked(e) for e in got)


def test_the_record_command_prints_a_windows_entries(tmp_path, capsys):
    out = window(tmp_path, digest="e" * 64)
    assert kernel_record.main([str(out), "--dry"]) == 0
    printed = verified.parse(capsys.readouterr().out)
    assert printed == kernel_record.entries_from_window(out)
    assert verified.load() == []  # --dry wrote nothing


def test_the_record_command_refuses_lines_without_a_digest_from_another_commit(tmp_path, capsys):
    assert kernel_record.main([str(window(tmp_path)), "--dry"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("error: ") and text.count("\n") == 1 and COMMIT in text


def test_window_date_and_commit():
    assert kernel_record.window_date_and_commit(ENV) == ("2027-01-02", COMMIT)
    env = "Fri Nov 27 03:17:57 AM UTC 2026\ne58e690546a1c717465f7100d6b6f2a201e00bae\n"
    assert kernel_record.window_date_and_commit(env) == (
        "2026-11-27", "e58e690546a1c717465f7100d6b6f2a201e00bae"
    )  # fmt: skip
    assert kernel_record.window_date_and_commit("2027-03-04T00:00:00Z\n") == ("2027-03-04", "")
    assert kernel_record.window_date_and_commit("") == ("", "")


def test_the_record_command_merges_a_windows_entries_into_the_checkouts_record(
    tmp_path, monkeypatch, capsys
):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / verified.RECORD).write_text("[]\n")
    monkeypatch.setattr(kernel_record, "KERNELS", kernels)
    out = window(tmp_path / "w1", digest="e" * 64)
    assert kernel_record.main([str(out)]) == 0
    assert "4 entries (2 verify their kernel) into" in capsys.readouterr().out
    first = verified.parse((kernels / verified.RECORD).read_text())
    assert first == kernel_record.entries_from_window(out)
    # again, n 64 only and one time changed: its entries replaced, n 100's kept
    faster = [x.replace('"ms": 7.1', '"ms": 6.9') for x in WINDOW if '"n": 100' not in x]
    again = window(tmp_path / "w2", faster, digest="e" * 64)
    assert kernel_record.main([str(again)]) == 0
    second = verified.parse((kernels / verified.RECORD).read_text())
    assert second == [e for e in first if e.hidden_size == 100] + (
        kernel_record.entries_from_window(again)
    )
    assert len(second) == len(first) and 6.9 in {e.kernel_ms for e in second}
    # a dry run's window (stand_in lines): printed as not recorded, nothing written
    dry = [x.replace('"T": 784', '"T": 784, "stand_in": true') for x in WINDOW]
    before = (kernels / verified.RECORD).read_text()
    assert kernel_record.main([str(window(tmp_path / "w3", dry, "cpu", "e" * 64))]) == 0
    assert "not recorded" in capsys.readouterr().out
    assert (kernels / verified.RECORD).read_text() == before


def test_lines_without_a_digest_take_the_checkouts_when_it_is_the_windows_commit(
    tmp_path, monkeypatch
):
    answers = {"rev-parse": COMMIT, "status": ""}
    monkeypatch.setattr(kernel_record, "_git", lambda *args: answers[args[0]])
    got = kernel_record.entries(window(tmp_path))
    assert got and all(e.digest == verified.digest("gated") for e in got)  # the checkout's
    answers["status"] = " M rhnzoo/cells/kernels/gated.py"
    with pytest.raises(ValueError, match="kernel sources modified"):
        kernel_record.entries(window(tmp_path))


def test_the_record_command_runs_from_the_repository_root(tmp_path):
    out = window(tmp_path, digest="e" * 64)
    done = subprocess.run(
        [sys.executable, "-m", "tools.kernel_record", str(out), "--dry"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert verified.parse(done.stdout) == kernel_record.entries_from_window(out)
