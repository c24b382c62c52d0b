"""``auto`` trusts only what a GPU has checked (issue 68, rhnzoo.cells.kernels.verified):
on this CPU with a stand-in device (``verified.stand_in``: an H100's device kind and
compute capability 9.0) and ``scan.for_platform('gpu')``, the empty shipped record makes
``auto`` pick the fused scan for every cell and size; a record listing a kernel's current
source digest on that device kind, its errors checked and its train step faster than the
fused scan's, makes it pick the kernel; a one-character edit of a kernel source, another
device kind, a slower or unchecked entry, another size make it pick fused again.
``scan_impl='pallas'`` asked for on a (stand-in) GPU logs one line naming an unlisted
kernel and runs it. A window's files into record entries: tests/test_kernel_record.py."""

import dataclasses
import hashlib
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.cells import kernels, scan
from rhnzoo.cells.kernels import verified
from rhnzoo.cells.scan import ScanImpl

bf16 = jnp.bfloat16
H100, H200 = verified.H100, "NVIDIA H200"


@pytest.fixture
def on_h100():
    """A stand-in H100: platform 'gpu', device kind H100, compute capability 9.0; and
    the warning's once-a-process memory fresh."""
    saved = set(verified._WARNED)
    verified._WARNED.clear()
    with scan.for_platform("gpu"), verified.stand_in(H100, "9.0"):
        yield
    verified._WARNED.clear()
    verified._WARNED.update(saved)


def entry(cell, batch=100, *, backend=None, input_size=1, **kw):
    """A record entry that verifies ``cell``'s kernels at ``batch`` on the stand-in H100
    with the current source (fields overridable)."""
    backend = backend or verified.backend_name(kernels.backend_of(cell))
    fields = dict(
        backend=backend,
        cell=verified.cell_name(cell),
        hidden_size=cell.hidden_size,
        depth=verified.cell_depth(cell),
        input_size=input_size,
        batch=batch,
        length=784,
        digest=verified.digest(backend),
        device_kind=H100,
        date="2027-01-01",
        commit="0" * 40,
        value_error=1e-3,
        grad_error=2e-2,
        kernel_ms=7.1,
        fused_ms=9.5,
    )
    return verified.Entry(**{**fields, **kw})


def auto(cell, batch=100, input_size=None):
    return scan.resolve("auto", cell, batch=batch, dtype=bf16, input_size=input_size)


# The cells each backend runs and whose other conditions hold at n = 64 (the gated
# backend: an LSTM with n <= 64 only).
KERNEL_CELLS = {
    "lstm": cells.LSTM(64),
    "rrn": cells.RRN(64, depth=2),
    "gru_cho": cells.GRU(64),
    "rhn": cells.RHN(64, 3),
    "hsg_rhn": cells.HSG(cells.RHN(64, 3)),
}


# ------------------------------------------------------------------ the shipped record


def test_the_shipped_record_is_empty_package_data():
    assert verified.load() == []
    assert verified.source(verified.RECORD).decode().strip() == "[]"


def test_the_digest_is_sha256_of_the_backends_sources_in_order():
    for name, files in verified.SOURCES.items():
        h = hashlib.sha256()
        for f in files:
            data = verified.source(f)
            h.update(f.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
        assert verified.digest(name) == h.hexdigest()
        assert verified.digest(getattr(kernels, name)) == h.hexdigest()  # a module
    assert len({verified.digest(n) for n in verified.SOURCES}) == 3
    assert verified.SOURCES["gated"] == ("gated.py", "persistent.py", "swap_ab.py", "common.py")
    with pytest.raises(ValueError, match="no kernel backend 'cudnn'"):
        verified.digest("cudnn")


@pytest.mark.parametrize("n", [8, 32, 64, 100, 128])
def test_with_the_empty_record_auto_is_fused_for_every_cell_and_size(on_h100, n, monkeypatch):
    """Every registry cell, sizes and batches: never pallas. With a record that listed
    everything (``verified.fits`` true), the same grid picks pallas where the backends'
    other conditions hold (an LSTM at n <= 64 formerly among them): only the record
    keeps auto off the kernels."""
    formerly = set()
    for name in cells.ALL_NAMES:
        cell = cells.make(name, n, **cells.applicable(name, {"depth": 2, "skip": 2}))
        if scan.implementations(cell) == (ScanImpl.REFERENCE,):
            continue  # no bfloat16 scan at all (DT-RNN, HSG around a gated cell, ...)
        for batch in (1, 16, 64, 100, 128):
            for m in (None, 1, 300):
                assert auto(cell, batch, m) is not ScanImpl.PALLAS, (name, n, batch, m)
                with monkeypatch.context() as mp:
                    mp.setattr(verified, "fits", lambda *a, **k: True)
                    if auto(cell, batch, m) is ScanImpl.PALLAS:
                        formerly.add(name)
    want = {"lstm", "gru", "rrn", "rhn", "hsg_rhn"} if n <= 64 else {"gru", "rrn", "rhn", "hsg_rhn"}
    assert formerly == want


# ------------------------------------------------------------------ a record lists it


@pytest.mark.parametrize("name", list(KERNEL_CELLS))
def test_a_listed_current_digest_makes_auto_pick_the_kernel(on_h100, name):
    cell = KERNEL_CELLS[name]
    with verified.using([entry(cell)]):
        assert auto(cell) is ScanImpl.PALLAS
        assert auto(cell, input_size=1) is ScanImpl.PALLAS
        # exact sizes: another batch, input width, or (fused scan only) remat
        assert auto(cell, batch=128) is ScanImpl.FUSED
        assert auto(cell, input_size=300) is ScanImpl.FUSED
        assert scan.resolve("auto", cell, batch=100, dtype=None) is ScanImpl.FUSED  # float32
        with scan.for_platform("cpu"):
            assert auto(cell) is ScanImpl.FUSED  # the CPU: interpret mode only
        with scan.for_platform("tpu"):
            assert auto(cell) is ScanImpl.FUSED


def test_the_gated_backends_own_conditions_still_hold(on_h100):
    """A record cannot widen ``gated.fits``: n > 64, the GRU and SC-LSTM, compute
    capability other than 9.0 stay with the fused scan."""
    for cell in (cells.LSTM(100), cells.GRU(64, reset_after=True), cells.SCLSTM(64, skip=2)):
        with verified.using([entry(cell)]):
            assert auto(cell) is ScanImpl.FUSED, cell
    lstm = cells.LSTM(64)
    with verified.using([entry(lstm)]), verified.stand_in(H100, "8.0"):
        assert auto(lstm) is ScanImpl.FUSED


@pytest.mark.parametrize("name", list(KERNEL_CELLS))
def test_a_one_character_edit_of_a_kernel_source_flips_auto_back_to_fused(
    on_h100, name, monkeypatch
):
    cell = KERNEL_CELLS[name]
    backend = verified.backend_name(kernels.backend_of(cell))
    record = [entry(cell)]
    source = verified.source
    for edited in (verified.SOURCES[backend][0], "common.py"):

        def read(f, edited=edited):
            data = source(f)
            return data.replace(b"def ", b"def  ", 1) if f == edited else data

        with verified.using(record):
            assert auto(cell) is ScanImpl.PALLAS
            monkeypatch.setattr(verified, "source", read)
            assert verified.digest(backend) != record[0].digest
            assert auto(cell) is ScanImpl.FUSED, edited
            monkeypatch.setattr(verified, "source", source)
    # another backend's module is not this backend's source
    other = next(f for b, fs in verified.SOURCES.items() if b != backend for f in fs[:1])
    monkeypatch.setattr(verified, "source", lambda f: source(f) + b" " if f == other else source(f))
    with verified.using(record):
        assert auto(cell) is ScanImpl.PALLAS


def test_another_device_kind_a_slower_or_unchecked_entry_picks_fused(on_h100):
    lstm = cells.LSTM(64)
    cases = {
        "another device kind": entry(lstm, device_kind=H200),
        "slower than fused": entry(lstm, kernel_ms=9.6),
        "as fast as fused": entry(lstm, kernel_ms=9.5),
        "errors not measured": entry(lstm, value_error=None, grad_error=None),
        "gradient error over the limit": entry(lstm, grad_error=0.5),
        "a NaN error": entry(lstm, value_error=float("nan")),
        "a dry run's stand-in": entry(lstm, stand_in=True),
        "a kernel option auto does not run": entry(lstm, options={"batch_tile": 16}),
        "another digest": entry(lstm, digest="0" * 64),
        "another cell": dataclasses.replace(entry(lstm), cell="SCLSTM"),
        "float32": entry(lstm, dtype="float32"),
    }
    for why, e in cases.items():
        with verified.using([e]):
            assert auto(lstm) is ScanImpl.FUSED, why
    with verified.using([entry(lstm, device_kind=H200)]), verified.stand_in(H200, "9.0"):
        assert auto(lstm) is ScanImpl.PALLAS  # on that kind, it is listed
    # a bad entry beside a good one: the good one counts
    with verified.using([cases["slower than fused"], entry(lstm)]):
        assert auto(lstm) is ScanImpl.PALLAS


def test_verified_returns_the_entry_and_reads_the_device_kind():
    lstm = cells.LSTM(64)
    e = entry(lstm)
    args = ("gated", lstm, 100, bf16)
    assert verified.verified(*args, H100, entries=[e]) is e
    assert verified.verified(*args, H200, entries=[e]) is None
    assert verified.verified(*args, entries=[e]) is None  # this CPU: device kind 'cpu'
    with verified.stand_in(H100):
        assert verified.device() == verified.Device(H100, "9.0")
        assert verified.verified(*args, entries=[e]) is e
    assert verified.device().kind == jax.devices()[0].device_kind


# ------------------------------------------------------------------ pallas asked for


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_pallas_asked_for_logs_one_line_for_an_unlisted_kernel_and_runs_it(on_h100, caplog):
    lstm = cells.LSTM(8)
    params, carry = lstm.init(jax.random.PRNGKey(0), 3), lstm.initial_carry(4)
    xs = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 3))
    caplog.set_level(logging.WARNING)
    (h, _), ys = scan.unroll(lstm, params, carry, xs, impl="pallas", dtype=bf16, interpret=True)
    assert scan.resolve("pallas", lstm, batch=4, dtype=bf16) is ScanImpl.PALLAS  # again
    lines = _warnings(caplog)
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert "gated kernel of LSTM" in lines[0] and f"not yet checked on {H100}" in lines[0]
    assert verified.digest("gated")[:12] in lines[0]
    want, _ = scan.unroll(lstm, params, carry, xs, impl="fused", dtype=bf16)
    np.testing.assert_allclose(np.asarray(h), np.asarray(want[0]), atol=2e-2)
    assert ys.shape == (2, 4, 8)
    # a Parallel: each part's kernel its own line; the LSTM's already said
    caplog.clear()
    scan.resolve("pallas", cells.make("hrl", 8), batch=4, dtype=bf16)
    lines = _warnings(caplog)
    assert len(lines) == 1 and "chained kernel of RRN" in lines[0], lines


def test_pallas_asked_for_logs_nothing_when_listed_on_the_cpu_or_without_a_batch(on_h100, caplog):
    caplog.set_level(logging.WARNING)
    lstm = cells.LSTM(64)
    with verified.using([entry(lstm)]):
        assert scan.resolve("pallas", lstm, batch=100, dtype=bf16) is ScanImpl.PALLAS
    assert scan.resolve("pallas", lstm, dtype=bf16) is ScanImpl.PALLAS  # a config's check
    with scan.for_platform("cpu"):  # interpret mode: the tests' path, no line
        assert scan.resolve("pallas", lstm, batch=100, dtype=bf16) is ScanImpl.PALLAS
    assert _warnings(caplog) == []
    assert scan.resolve("pallas", lstm, batch=100, dtype=bf16) is ScanImpl.PALLAS
    assert len(_warnings(caplog)) == 1


def test_a_records_unknown_field_is_refused():
    e = entry(cells.LSTM(64)).to_json()
    with pytest.raises(ValueError, match="unknown entry fields"):
        verified.parse(json.dumps([{**e, "speedup": 2}]))
    with pytest.raises(ValueError, match="JSON list"):
        verified.parse("{}")
