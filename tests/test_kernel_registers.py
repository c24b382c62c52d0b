"""Registers per thread and spills of the persistent Mosaic GPU kernels, compiled for an
H100 (sm_90a) by the CUDA plugin's own pipeline and ptxas on this host, no GPU needed
(tests/kernel_registers.py says how). Every kernel of every shipped configuration
(kernel_registers.CONFIGS: the gated and chained kernels' forward and backward, the RHN
micro-layer kernels at each batch tile): zero spill bytes, at most 255 registers a
thread; the registers are recorded (``-s`` prints them; docs/runs/kernels/registers.md,
docs/runs/kernels/rhn_micro_layer.md).

A kernel that spills today is an expected failure with its measured spill bytes in the
reason, strict: when a change removes its spills the test reports XPASS and fails, and
the entry in :data:`SPILLS` goes."""

import functools

import kernel_registers as kr
import pytest

pytestmark = pytest.mark.pallas

# (config, kernel): (spill stores, spill loads) in bytes, as ptxas 13.0 (V13.0.88) reported
# them with JAX 0.11.2 (`python tests/kernel_registers.py table`; docs/runs/kernels/registers.md).
SPILLS = {
    ("lstm_n100_outputs_masked", "forward"): (76, 76),
    ("sc_lstm_p_n100", "forward"): (152, 152),
    ("sc_lstm_p_n100", "backward"): (36, 36),
}

# The configuration `auto` picks and the RHN kernels' smallest batch tile; the rest are slow.
FAST = {"lstm_n64", "rhn_hsg_bt16"}


@functools.cache
def _counts(name):  # one lowering and one ptxas child for all of a configuration's kernels
    return kr.ptxas_counts(kr.kernel_modules(name))


def _params():
    for name, config in kr.CONFIGS.items():
        for which in config.kernels:
            marks = [] if name in FAST else [pytest.mark.slow]
            if (name, which) in SPILLS:
                stores, loads = SPILLS[name, which]
                marks.append(
                    pytest.mark.xfail(
                        strict=True,
                        raises=AssertionError,
                        reason=(f"ptxas: {stores} B spill stores, {loads} B spill loads"),
                    )
                )
            yield pytest.param(name, which, marks=marks, id=f"{name}-{which}")


@pytest.mark.parametrize("name, which", list(_params()))
def test_no_spills(name, which, record_property):
    why = kr.missing_tools()
    if why:
        pytest.skip(why)
    counts, log = _counts(name)[which]
    record_property("registers", counts.registers)
    print(f"{name} {which} ({kr.ARCH}, {kr.ptxas_version()}): {counts}")
    assert counts.registers <= 255
    assert (counts.spill_stores, counts.spill_loads) == (0, 0), log


def test_parse_ptxas_log_reads_registers_and_spills():
    """The parser reads the counts of ptxas's ``-v`` log (its format in CUDA 13.0), so a
    spilling kernel fails :func:`test_no_spills`; a log without exactly one entry is an
    error, not zero spills."""
    log = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'body_mosaic_gpu_kernel' for 'sm_90a'\n"
        "ptxas info    : Function properties for body_mosaic_gpu_kernel\n"
        "    56 bytes stack frame, 56 bytes spill stores, 52 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 16 barriers, 1 bytes smem\n"
    )
    assert kr.parse_ptxas_log(log) == kr.Counts(255, 56, 52, 56)
    with pytest.raises(ValueError, match="one entry function"):
        kr.parse_ptxas_log("ptxas info    : 0 bytes gmem\n")
    with pytest.raises(ValueError, match="one entry function"):
        kr.parse_ptxas_log(log + log.replace("body", "other"))
