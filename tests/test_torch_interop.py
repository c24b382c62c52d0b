"""rhnzoo's LSTM and reset-after GRU against a transcription of PyTorch's documented
``nn.LSTM`` / ``nn.GRU`` equations, with weights converted by
:mod:`rhnzoo.cells.torch_interop`; the converters' round trips and errors; Flax's
``GRUCell`` (the same reset-after variant); the ``reset_after`` option through the
registry and the RRL config."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.cells import gated_fused, torch_interop
from rhnzoo.configs import rrl as rrl_configs
from rhnzoo.cells.scan_options import Options


def fused_unroll(cell, params, carry, xs, mask=None, *, lengths=None, resets=None, **options):
    """:func:`rhnzoo.cells.gated_fused.unroll` with its options record's fields as keywords."""
    opts = Options(**options)
    return gated_fused.unroll(cell, params, carry, xs, mask, opts, lengths=lengths, resets=resets)


B, M, N, T = 4, 3, 5, 7  # batch, input size, hidden size, steps
TOL = {"rtol": 1e-10, "atol": 1e-12}


def torch_state_dict(gates, seed, *, m=M, n=N, zero_hh=False):
    """A random ``nn.LSTM`` (gates=4) / ``nn.GRU`` (gates=3) state dict, float64, weights
    N(0, 0.5²) so that every gate is used (not PyTorch's init)."""
    rng = np.random.default_rng(seed)
    sd = {
        "weight_ih_l0": rng.normal(0, 0.5, (gates * n, m)),
        "weight_hh_l0": rng.normal(0, 0.5, (gates * n, n)),
        "bias_ih_l0": rng.normal(0, 0.5, gates * n),
        "bias_hh_l0": rng.normal(0, 0.5, gates * n),
    }
    if zero_hh:  # zero where PyTorch's two biases enter only as a sum (rhnzoo keeps the sum)
        sd["bias_hh_l0"][: (4 if gates == 4 else 2) * n] = 0.0
    return sd


# ---------------------------------------------------------------------------------------
# PyTorch's equations as its documentation writes them (torch.nn.LSTM, torch.nn.GRU),
# column convention W x written x Wᵀ for a batch; ``xp`` is numpy (float64 values) or
# jax.numpy (the same equations differentiated by jax.grad).


def _sigmoid(xp, a):
    return 1.0 / (1.0 + xp.exp(-a))


def torch_lstm(xp, sd, xs, h, c):
    """``(ys [T, B, n], (h_T, c_T))``: gates i | f | g | o, two biases."""
    W_ii, W_if, W_ig, W_io = xp.split(sd["weight_ih_l0"], 4, axis=0)
    W_hi, W_hf, W_hg, W_ho = xp.split(sd["weight_hh_l0"], 4, axis=0)
    b_ii, b_if, b_ig, b_io = xp.split(sd["bias_ih_l0"], 4)
    b_hi, b_hf, b_hg, b_ho = xp.split(sd["bias_hh_l0"], 4)
    ys = []
    for x in xs:
        i = _sigmoid(xp, x @ W_ii.T + b_ii + h @ W_hi.T + b_hi)
        f = _sigmoid(xp, x @ W_if.T + b_if + h @ W_hf.T + b_hf)
        g = xp.tanh(x @ W_ig.T + b_ig + h @ W_hg.T + b_hg)
        o = _sigmoid(xp, x @ W_io.T + b_io + h @ W_ho.T + b_ho)
        c = f * c + i * g
        h = o * xp.tanh(c)
        ys.append(h)
    return xp.stack(ys), (h, c)


def torch_gru(xp, sd, xs, h):
    """``(ys [T, B, n], h_T)``: gates r | z | n, the reset gate applied after W_hn h + b_hn."""
    W_ir, W_iz, W_in = xp.split(sd["weight_ih_l0"], 3, axis=0)
    W_hr, W_hz, W_hn = xp.split(sd["weight_hh_l0"], 3, axis=0)
    b_ir, b_iz, b_in = xp.split(sd["bias_ih_l0"], 3)
    b_hr, b_hz, b_hn = xp.split(sd["bias_hh_l0"], 3)
    ys = []
    for x in xs:
        r = _sigmoid(xp, x @ W_ir.T + b_ir + h @ W_hr.T + b_hr)
        z = _sigmoid(xp, x @ W_iz.T + b_iz + h @ W_hz.T + b_hz)
        n = xp.tanh(x @ W_in.T + b_in + r * (h @ W_hn.T + b_hn))
        h = (1 - z) * n + z * h
        ys.append(h)
    return xp.stack(ys), h


# ---------------------------------------------------------------------------------------
# rhnzoo's implementations of one cell: the reference scan (cells.unroll of ``step``),
# with saved matmuls, and the fused scan (hand-written backward pass), projecting the
# inputs per step and before the scan.

UNROLLS = {
    "reference": lambda cell: functools.partial(cells.unroll, cell),
    "reference_save_matmuls": lambda cell: functools.partial(cells.unroll, cell, save_matmuls=True),
    "fused": lambda cell: functools.partial(fused_unroll, cell, unroll=2),
    "fused_projected": lambda cell: functools.partial(fused_unroll, cell, project_per_step=False),
}


def inputs(seed):
    rng = np.random.default_rng(100 + seed)
    xs, h0, c0 = rng.normal(size=(T, B, M)), 0.5 * rng.normal(size=(B, N)), rng.normal(size=(B, N))
    target = rng.normal(size=(T, B, N))
    return xs, h0, c0, target


def as_rhnzoo(kind, sd):
    """``(cell, params)``: the state dict converted, float64 JAX arrays."""
    if kind == "lstm":
        return cells.LSTM(N), jax.tree.map(jnp.asarray, torch_interop.lstm_from_torch(sd))
    params = torch_interop.gru_from_torch(sd)
    return cells.GRU(N, reset_after=True), jax.tree.map(jnp.asarray, params)


def loss_of(ys, carry, target):
    """Depends on every output and every leaf of the final carry."""
    return jnp.sum(jnp.sin(ys) * target) + sum(jnp.sum(c**2) for c in jax.tree.leaves(carry))


def torch_gradient_from_rhnzoo(kind, g):
    """The gradient with respect to PyTorch's parameters from rhnzoo's, by the chain rule
    through the converter (linear: weights permuted and transposed, b = b_ih + b_hh where
    they are summed): the weights' and b_ih's gradients are ``*_to_torch`` of rhnzoo's,
    b_hh's equals b_ih's where the two are summed (every LSTM gate; GRU r, z)."""
    to_torch = torch_interop.lstm_to_torch if kind == "lstm" else torch_interop.gru_to_torch
    sd = to_torch(g)
    summed = 4 * N if kind == "lstm" else 2 * N
    sd["bias_hh_l0"][:summed] = sd["bias_ih_l0"][:summed]
    return sd


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_one_step_matches_torch_equations(kind):
    """``cell.step`` from a random state, float64."""
    with jax.enable_x64(True):
        sd = torch_state_dict(4 if kind == "lstm" else 3, seed=1)
        cell, params = as_rhnzoo(kind, sd)
        xs, h0, c0, _ = inputs(1)
        x_proj = cell.project_inputs(params, jnp.asarray(xs[0]))
        if kind == "lstm":
            (h, c), y = cell.step(params, cells.LSTMState(jnp.asarray(h0), jnp.asarray(c0)), x_proj)
            ys, (h_ref, c_ref) = torch_lstm(np, sd, xs[:1], h0, c0)
            np.testing.assert_allclose(c, c_ref, **TOL)
        else:
            h, y = cell.step(params, jnp.asarray(h0), x_proj)
            ys, h_ref = torch_gru(np, sd, xs[:1], h0)
        assert y.dtype == jnp.float64
        np.testing.assert_allclose(h, h_ref, **TOL)
        np.testing.assert_allclose(y, ys[0], **TOL)


@pytest.mark.parametrize(  # the fast tier: the fused scan (the others equal it: the dispatcher)
    "impl", [pytest.param(u, marks=() if u == "fused" else pytest.mark.slow) for u in UNROLLS]
)
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_unroll_values_and_gradients_match_torch_equations(kind, impl):
    """Every scan over T steps from a random state, float64: outputs, final carry, and the
    gradients of a loss of both with respect to the parameters (mapped to PyTorch's by
    the chain rule), the initial state and the inputs, against jax.grad of the
    transcription of PyTorch's equations."""
    with jax.enable_x64(True):
        sd = torch_state_dict(4 if kind == "lstm" else 3, seed=2)
        cell, params = as_rhnzoo(kind, sd)
        xs, h0, c0, target = (jnp.asarray(a) for a in inputs(2))
        carry0 = cells.LSTMState(h0, c0) if kind == "lstm" else h0
        run = UNROLLS[impl](cell)

        carry, ys = jax.jit(run)(params, carry0, xs)
        if kind == "lstm":
            ys_ref, carry_ref = torch_lstm(np, sd, np.asarray(xs), np.asarray(h0), np.asarray(c0))
        else:
            ys_ref, carry_ref = torch_gru(np, sd, np.asarray(xs), np.asarray(h0))
        np.testing.assert_allclose(ys, ys_ref, **TOL)
        for a, b in zip(jax.tree.leaves(carry), jax.tree.leaves(carry_ref)):
            np.testing.assert_allclose(a, b, **TOL)

        def ours(params, carry0, xs):
            return loss_of(*run(params, carry0, xs)[::-1], target)

        def theirs(sd, carry0, xs):
            if kind == "lstm":
                ys, carry = torch_lstm(jnp, sd, xs, carry0.h, carry0.c)
            else:
                ys, carry = torch_gru(jnp, sd, xs, carry0)
            return loss_of(ys, carry, target)

        g, g_carry, g_xs = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(params, carry0, xs)
        sd_jax = jax.tree.map(jnp.asarray, sd)
        g_ref, g_carry_ref, g_xs_ref = jax.grad(theirs, argnums=(0, 1, 2))(sd_jax, carry0, xs)
        g_sd = torch_gradient_from_rhnzoo(kind, jax.tree.map(np.asarray, g))
        assert set(g_sd) == set(g_ref)
        for k in g_ref:
            np.testing.assert_allclose(g_sd[k], g_ref[k], **TOL, err_msg=k)
        for a, b in zip(jax.tree.leaves((g_carry, g_xs)), jax.tree.leaves((g_carry_ref, g_xs_ref))):
            np.testing.assert_allclose(a, b, **TOL)
        assert float(jnp.abs(g["b_hn" if kind == "gru" else "b"]).min()) > 0  # not vacuous


@pytest.mark.parametrize("b_hn", ["random", "zero"])
def test_cho_gru_does_not_compute_torchs_gru(b_hn):
    """The default GRU (Cho et al. eq. 8, reset gate before U_h) is another function of
    the same weights: with PyTorch's weights (b_hn folded into b_h, or zero) it does not
    reproduce nn.GRU's outputs; the reset-after GRU with the same weights does."""
    with jax.enable_x64(True):
        sd = torch_state_dict(3, seed=3)
        if b_hn == "zero":
            sd["bias_hh_l0"][2 * N :] = 0.0
        xs, h0, _, _ = inputs(3)
        ys_ref, _ = torch_gru(np, sd, xs, h0)
        params = jax.tree.map(jnp.asarray, torch_interop.gru_from_torch(sd))
        h0, xs = jnp.asarray(h0), jnp.asarray(xs)
        after = cells.unroll(cells.GRU(N, reset_after=True), params, h0, xs)[1]
        np.testing.assert_allclose(after, ys_ref, **TOL)
        cho = {"W": params["W"], "U": params["U"], "b": params["b"].at[2 * N :].add(params["b_hn"])}
        for run in (cells.unroll, gated_fused.unroll):
            ys = run(cells.GRU(N), cho, h0, xs)[1]
            assert float(jnp.abs(ys - ys_ref).max()) > 0.05


def test_flax_gru_cell_computes_the_reset_after_gru():
    """Flax's ``nn.GRUCell`` (input kernels ir, iz, in with biases; recurrent hr, hz
    without, hn with b_hn) with rhnzoo's reset-after parameters: the same outputs."""
    import flax.linen as nn

    cell = cells.GRU(N, reset_after=True)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = jax.tree.map(
        lambda a: a + 0.3 * jax.random.normal(keys[0], a.shape), cell.init(keys[0], M)
    )
    W, U, b = (np.split(np.asarray(params[k]), 3, axis=-1) for k in ("W", "U", "b"))
    flax_params = {
        "params": {
            **{f"i{g}": {"kernel": W[k], "bias": b[k]} for k, g in enumerate("rzn")},
            "hr": {"kernel": U[0]},
            "hz": {"kernel": U[1]},
            "hn": {"kernel": U[2], "bias": np.asarray(params["b_hn"])},
        }
    }
    xs = jax.random.normal(keys[1], (T, B, M))
    h = h0 = 0.5 * jax.random.normal(keys[2], (B, N))
    flax_cell = nn.GRUCell(N)
    ys_flax = []
    for x in xs:
        h, y = flax_cell.apply(flax_params, h, x)
        ys_flax.append(y)
    _, ys = cells.unroll(cell, params, h0, xs)
    np.testing.assert_allclose(ys, np.stack(ys_flax), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------
# The converters.


def test_lstm_conversion_orders_the_gates_and_sums_the_biases():
    """PyTorch's i | f | g | o rows become rhnzoo's i | f | o | c̃ columns."""
    sd = torch_state_dict(4, seed=4)
    p = torch_interop.lstm_from_torch(sd)
    rows = lambda a, k: a[k * N : (k + 1) * N]
    for ours, theirs in enumerate((0, 1, 3, 2)):
        cols = slice(ours * N, (ours + 1) * N)
        np.testing.assert_array_equal(p["W"][:, cols], rows(sd["weight_ih_l0"], theirs).T)
        np.testing.assert_array_equal(p["U"][:, cols], rows(sd["weight_hh_l0"], theirs).T)
        b = sd["bias_ih_l0"] + sd["bias_hh_l0"]
        np.testing.assert_array_equal(p["b"][cols], rows(b, theirs))
    assert p["W"].shape == (M, 4 * N) and p["U"].shape == (N, 4 * N) and p["b"].shape == (4 * N,)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_round_trips(kind):
    """from_torch(to_torch(params)) == params exactly; to_torch(from_torch(sd)) == sd
    exactly where sd's recurrent bias is zero in the summed blocks, and otherwise keeps
    the weights, b_in, b_hn and every bias_ih + bias_hh exactly (the same function)."""
    gates = 4 if kind == "lstm" else 3
    frm, to = (
        (torch_interop.lstm_from_torch, torch_interop.lstm_to_torch)
        if kind == "lstm"
        else (torch_interop.gru_from_torch, torch_interop.gru_to_torch)
    )
    cell = cells.LSTM(N) if kind == "lstm" else cells.GRU(N, reset_after=True)
    params = jax.tree.map(np.asarray, cell.init(jax.random.PRNGKey(5), M))
    params = {
        k: v + np.float32(0.1) * np.arange(v.size, dtype=np.float32).reshape(v.shape)
        for k, v in params.items()
    }
    back = frm(to(params))
    assert set(back) == set(params)
    for k in params:
        assert back[k].dtype == np.float32
        np.testing.assert_array_equal(back[k], params[k])

    exact = torch_state_dict(gates, seed=6, zero_hh=True)
    again = to(frm(exact))
    assert set(again) == set(exact)
    for k in exact:
        np.testing.assert_array_equal(again[k], exact[k], err_msg=k)

    sd = torch_state_dict(gates, seed=7)
    again = to(frm(sd))
    for k in ("weight_ih_l0", "weight_hh_l0"):
        np.testing.assert_array_equal(again[k], sd[k])
    np.testing.assert_array_equal(
        again["bias_ih_l0"] + again["bias_hh_l0"], sd["bias_ih_l0"] + sd["bias_hh_l0"]
    )
    if kind == "gru":
        np.testing.assert_array_equal(again["bias_ih_l0"][2 * N :], sd["bias_ih_l0"][2 * N :])
        np.testing.assert_array_equal(again["bias_hh_l0"][2 * N :], sd["bias_hh_l0"][2 * N :])
    assert not np.array_equal(again["bias_hh_l0"], sd["bias_hh_l0"])  # the split is not kept
    xs, h0, c0, _ = inputs(7)
    if kind == "lstm":
        np.testing.assert_allclose(
            torch_lstm(np, again, xs, h0, c0)[0], torch_lstm(np, sd, xs, h0, c0)[0], **TOL
        )
    else:
        np.testing.assert_allclose(
            torch_gru(np, again, xs, h0)[0], torch_gru(np, sd, xs, h0)[0], **TOL
        )


def test_prefixed_keys_and_missing_biases():
    """Keys under a prefix (a submodule's ``rnn.``; other keys ignored); ``bias=False``
    (no bias keys) converts with zero biases."""
    sd = torch_state_dict(3, seed=8)
    full = {"rnn." + k: v for k, v in sd.items()} | {"head.weight": np.zeros((2, N))}
    p = torch_interop.gru_from_torch(full, prefix="rnn.")
    for k, v in torch_interop.gru_from_torch(sd).items():
        np.testing.assert_array_equal(p[k], v)
    assert set(torch_interop.gru_to_torch(p, prefix="rnn.")) == {"rnn." + k for k in sd}
    weights_only = lambda sd: {k: v for k, v in sd.items() if k.startswith("weight")}
    p = torch_interop.lstm_from_torch(weights_only(torch_state_dict(4, seed=9)))
    np.testing.assert_array_equal(p["b"], 0.0)
    p = torch_interop.gru_from_torch(weights_only(sd))
    np.testing.assert_array_equal(p["b"], 0.0)
    np.testing.assert_array_equal(p["b_hn"], 0.0)


def _init(cell):
    return cell.init(jax.random.PRNGKey(0), M)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: torch_interop.gru_to_torch(_init(cells.GRU(N))), "reset_after=True"),
        (
            lambda: torch_interop.gru_from_torch(
                torch_state_dict(3, 0) | {"weight_ih_l1": np.zeros((15, 5))}
            ),
            "only one unidirectional layer",
        ),
        (
            lambda: torch_interop.lstm_from_torch(
                torch_state_dict(4, 0) | {"weight_hr_l0": np.zeros((3, 5))}
            ),
            "unexpected keys ['weight_hr_l0']",
        ),
        (
            lambda: torch_interop.lstm_from_torch({"weight_ih_l0": np.zeros((20, 3))}),
            "no weight_hh_l0",
        ),
        (
            lambda: torch_interop.lstm_from_torch(torch_state_dict(3, 0)),
            "weight_hh_l0 must be [4 n, n]",
        ),
        (
            lambda: torch_interop.gru_from_torch(
                torch_state_dict(3, 0) | {"bias_hh_l0": np.zeros(4)}
            ),
            "bias_hh_l0 must be [15]",
        ),
        (
            lambda: torch_interop.lstm_to_torch(_init(cells.SCLSTM(N, learn_alpha=True))),
            "unexpected parameters ['alpha']",
        ),
        (lambda: torch_interop.lstm_to_torch(_init(cells.GRU(N))), "expected W [m, 4 n]"),
    ],
)
def test_conversion_errors_are_one_line(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------
# The option through the registry and the RRL config.


def test_reset_after_reaches_the_cell_by_name_and_config():
    assert not cells.GRU(8).reset_after  # the default: Cho et al.
    assert "reset_after" in cells.options("gru") and "reset_after" not in cells.options("lstm")
    assert cells.make("gru", 8, reset_after=True) == cells.GRU(8, reset_after=True)
    assert cells.make("hsg_gru", 8, reset_after=True) == cells.HSG(cells.GRU(8, reset_after=True))
    assert cells.make(
        "lstm_gru", 8, **cells.applicable("lstm_gru", {"reset_after": True})
    ) == cells.Parallel((cells.LSTM(8), cells.GRU(8, reset_after=True)))
    assert cells.applicable("lstm", {"reset_after": True}) == {}
    p = cells.GRU(8, reset_after=True).init(jax.random.PRNGKey(0), 3)
    assert {k: v.shape for k, v in p.items()} == {
        "W": (3, 24),
        "U": (8, 24),
        "b": (24,),
        "b_hn": (8,),
    }
    assert set(cells.GRU(8).init(jax.random.PRNGKey(0), 3)) == {"W", "U", "b"}
    config = rrl_configs.RRLConfig(model="gru", hidden_size=8, gru_reset_after=True)
    assert config.cell() == cells.GRU(8, init_scale=config.init_scale, reset_after=True)
    assert rrl_configs.RRLConfig(model="gru", hidden_size=8).cell().reset_after is False
    hybrid = rrl_configs.RRLConfig(
        model="lstm_gru", hybrid_hidden_size=6, gru_reset_after=True
    ).cell()
    assert hybrid.cells[1].reset_after and isinstance(hybrid.cells[0], cells.LSTM)
    lstm = rrl_configs.RRLConfig(model="lstm", hidden_size=8, gru_reset_after=True).cell()
    assert lstm == cells.LSTM(8, init_scale=config.init_scale)  # the option is the GRU's
    assert gated_fused.supports(cells.GRU(8, reset_after=True))


# ---------------------------------------------------------------------------------------
# Issue 62: bias=False modules, the GRU's convention carried by its parameters, and
# parameters of another size refused by name.

CONVERTERS = {
    "lstm": (4, torch_interop.lstm_from_torch, torch_interop.lstm_to_torch),
    "gru": (3, torch_interop.gru_from_torch, torch_interop.gru_to_torch),
}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_bias_false_gets_no_bias_keys_back(kind):
    """A ``bias=False`` module's state dict (weights only) comes back with exactly its
    keys and arrays; ``bias=False`` with a nonzero bias is refused in one line."""
    gates, frm, to = CONVERTERS[kind]
    sd = {k: v for k, v in torch_state_dict(gates, seed=10).items() if k.startswith("weight")}
    back = to(frm(sd), bias=False)
    assert set(back) == set(sd) == {"weight_ih_l0", "weight_hh_l0"}
    for k in sd:
        np.testing.assert_array_equal(back[k], sd[k])
    assert set(to(frm(sd), prefix="rnn.", bias=False)) == {"rnn.weight_ih_l0", "rnn.weight_hh_l0"}
    assert set(to(frm(sd))) == set(torch_state_dict(gates, seed=10))  # bias=True: all four
    biased = frm(torch_state_dict(gates, seed=10))
    with pytest.raises(ValueError, match="bias=False, but 'b' is not zero") as e:
        to(biased, bias=False)
    assert "\n" not in str(e.value)
    if kind == "gru":
        only_b_hn = frm(sd) | {"b_hn": np.ones(N)}
        with pytest.raises(ValueError, match="'b_hn' is not zero"):
            to(only_b_hn, bias=False)


def _gru_runs(cell, params, h0, xs):
    """Every way a GRU's parameters reach its computation (the Pallas entries refuse
    before any kernel is built)."""
    from rhnzoo.cells import scan
    from rhnzoo.cells.kernels import chained as chained_pallas
    from rhnzoo.cells.kernels import gated as gated_pallas

    yield "step", lambda: cell.step(params, h0, xs[0] @ jnp.asarray(params["W"]))
    yield "project_inputs", lambda: cell.project_inputs(params, xs)
    yield "cells.unroll", lambda: cells.unroll(cell, params, h0, xs)
    yield "gated_fused.unroll", lambda: gated_fused.unroll(cell, params, h0, xs)
    for impl in ("reference", "fused"):
        yield f"scan {impl}", lambda impl=impl: scan.unroll(cell, params, h0, xs, impl=impl)
    pallas = chained_pallas if not cell.reset_after else gated_pallas
    yield "pallas", lambda: pallas.unroll(cell, params, h0, xs)


@pytest.mark.parametrize("reset_after", [False, True])
def test_a_gru_refuses_the_other_grus_parameters(reset_after):
    """``gru_from_torch``'s parameters (with b_hn) through Cho et al.'s ``GRU(n)``, and
    Cho's (without) through ``GRU(n, reset_after=True)``: one ValueError line naming the
    cell to use, on every path, not another function computed silently (the outputs were
    off by up to 0.5)."""
    torch_params = torch_interop.gru_from_torch(torch_state_dict(3, seed=12))
    cho_params = {k: v for k, v in torch_params.items() if k != "b_hn"}
    params = cho_params if reset_after else torch_params
    xs, h0, _, _ = (jnp.asarray(a, jnp.float32) for a in inputs(12))
    want = "no 'b_hn'" if reset_after else "GRU(5, reset_after=True)"
    for name, run in _gru_runs(cells.GRU(N, reset_after=reset_after), params, h0, xs):
        with pytest.raises(ValueError, match=re.escape(want)) as e:
            run()
        assert "GRU(hidden_size=5" in str(e.value) and "\n" not in str(e.value), name
    # and each cell still takes its own
    for cell, own in ((cells.GRU(N), cho_params), (cells.GRU(N, reset_after=True), torch_params)):
        assert cells.unroll(cell, own, h0, xs)[1].shape == (T, B, N)


@pytest.mark.parametrize("kind", ["lstm", "gru", "sc_lstm"])
def test_parameters_of_another_size_are_refused_by_name(kind):
    """A cell of the wrong hidden size (the converted module had n = 5) or inputs of the
    wrong width: one ValueError line naming the cell and the parameter, before any
    matmul (it failed inside dot_general)."""
    gates = 3 if kind == "gru" else 4
    frm = torch_interop.gru_from_torch if kind == "gru" else torch_interop.lstm_from_torch
    params = frm(torch_state_dict(gates, seed=13))
    make = {
        "lstm": cells.LSTM,
        "gru": lambda n: cells.GRU(n, reset_after=True),
        "sc_lstm": lambda n: cells.SCLSTM(n, skip=2),
    }[kind]
    xs = jnp.ones((T, B, M))
    for impl in (cells.unroll, gated_fused.unroll):
        cell = make(8)
        with pytest.raises(ValueError) as e:
            impl(cell, params, cell.initial_carry(B), xs)
        text = str(e.value)
        assert text.startswith(repr(cell)) and "parameter 'U' has shape [5, " in text, text
        assert "hidden size 8" in text and "\n" not in text
        cell = make(N)
        with pytest.raises(ValueError, match=r"parameter 'W' has shape \[3, \d+\].*input size 4"):
            impl(cell, params, cell.initial_carry(B), jnp.ones((T, B, 4)))
    with pytest.raises(ValueError, match=r"unknown \['alpha'\]"):  # SC-LSTM-P's in an LSTM
        cells.unroll(make(N), params | {"alpha": np.float32(1.0)}, make(N).initial_carry(B), xs)
