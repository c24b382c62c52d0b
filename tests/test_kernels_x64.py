"""Every persistent Pallas kernel (rhnzoo.cells.kernels.gated: LSTM, SC-LSTM I and P, the
reset-after GRU; rhnzoo.cells.kernels.chained: the RRN, Cho et al.'s GRU) with
``jax_enable_x64`` on: values and gradients as the reference scan's, float32 outputs
(issue 62: SC-LSTM's skip grid mixed its int32 step count with a Python int, int64
under x64, and ``lax.rem`` refused the pair).

One small case per kernel, in GPU interpret mode on the CPU, under a timeout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_chained_pallas
import test_gated_pallas
from helpers import as_jax
from pallas_checks import assert_matches_reference, kernel_reference_fused

from rhnzoo.cells.kernels import chained as chained_pallas
from rhnzoo.cells.kernels import gated as gated_pallas

pytestmark = pytest.mark.pallas

B, M, N, T = 4, 3, 5, 4  # batch, input size, hidden size, steps: one CTA, one warpgroup
KERNELS = {  # name: (module, setup, its kind)
    "lstm": (gated_pallas, test_gated_pallas.setup, "lstm"),
    "sc_lstm_i": (gated_pallas, test_gated_pallas.setup, "sc_lstm_i"),
    "sc_lstm_p": (gated_pallas, test_gated_pallas.setup, "sc_lstm_p"),
    "gru_reset_after": (gated_pallas, test_gated_pallas.setup, "gru"),
    "rrn": (chained_pallas, test_chained_pallas.setup, "rrn"),
    "gru_cho": (chained_pallas, test_chained_pallas.setup, "gru"),
}


# The fast tier: SC-LSTM (P), issue 62's case (the LSTM kernel with its skip grid); the
# other kernels under x64 run in CI.
@pytest.mark.parametrize(
    "name", [pytest.param(k, marks=() if k == "sc_lstm_p" else pytest.mark.slow) for k in KERNELS]
)
def test_kernel_under_x64_matches_the_reference(name):
    module, setup, kind = KERNELS[name]
    with jax.enable_x64(True):
        assert jnp.arange(1).dtype == jnp.int64  # x64 really on
        cell, params, carry, xs, target = setup(N, B, M, T, kind=kind)
        lengths = as_jax(np.asarray([T, 0, 2, 3]))  # int64 under x64
        assert lengths.dtype == jnp.int64
        kernel = lambda p, c, x: module.unroll(cell, p, c, x, lengths=lengths)
        final, ys = kernel(params, carry, xs)
        assert ys.dtype == jnp.float32
        for a, b in zip(jax.tree.leaves(final), jax.tree.leaves(carry), strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape  # SC-LSTM's count stays int32
        got, ref, _ = kernel_reference_fused(
            kernel, cell, params, carry, xs, target, lengths=lengths, fused=False
        )
    assert_matches_reference(got, ref, rtol=2e-2, loss_atol=1e-3)
