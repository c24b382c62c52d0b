"""The fused gated-cell unroll (hand-written backward pass) against the reference
``cells.unroll`` (lax.scan + autodiff) and finite differences, and the classifier's
scan_impl / dtype options (the dispatcher itself: tests/test_scan_dispatch.py)."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import (
    as_jax,
    check_gradient_by_finite_differences,
    random_params,
    random_problem,
    shapes,
)

from rhnzoo import cells
from rhnzoo.cells import gated_fused
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.cells.scan_options import Options


def fused_unroll(cell, params, carry, xs, mask=None, *, lengths=None, resets=None, **options):
    """:func:`rhnzoo.cells.gated_fused.unroll` with its options record's fields as keywords."""
    opts = Options(**options)
    return gated_fused.unroll(cell, params, carry, xs, mask, opts, lengths=lengths, resets=resets)


B, N, T = 4, 5, 9
LENGTHS = np.array([9, 0, 4, 7])  # a full row, an empty one, two padded ones

CELLS = {
    "lstm": lambda: cells.LSTM(N),
    "gru": lambda: cells.GRU(N),
    "gru_ra": lambda: cells.GRU(N, reset_after=True),  # PyTorch's / cuDNN's variant
    "rrn1": lambda: cells.RRN(N, 1),
    "rrn3_tanh": lambda: cells.RRN(N, 3, activation="tanh", f_bias=-1.0),
    "sclstm_i": lambda: cells.SCLSTM(N, skip=2),
    "sclstm_p": lambda: cells.SCLSTM(N, skip=3, learn_alpha=True),
    "hrl": lambda: cells.Parallel((cells.LSTM(N), cells.RRN(N))),
    "lstm_gru": lambda: cells.Parallel((cells.LSTM(N), cells.GRU(N))),
}


def setup(cell, m, dtype, seed=0, batch=B):
    """Random (not initial) parameters and carry, inputs, a dropout mask and a target."""
    return random_problem(cell, T=T, B=batch, m=m, n=N, dtype=dtype, seed=seed)


def loss(unroll, params, carry, xs, target):
    """Depends on every output and every float leaf of the final carry."""
    carry, ys = unroll(params, carry, xs)
    floats = [c for c in jax.tree.leaves(carry) if jnp.issubdtype(c.dtype, jnp.floating)]
    return jnp.sum(jnp.sin(ys) * target) + sum(jnp.sum(c**2) for c in floats)


def compare(cell, m, dtype, *, lengths, use_mask, per_step, tol, chunk=None, batch=B):
    params, carry, xs, mask, target = setup(cell, m, dtype, batch=batch)
    mask = mask if use_mask else None
    ref = functools.partial(cells.unroll, cell, mask=mask, lengths=lengths)
    fast = functools.partial(
        fused_unroll,
        cell,
        mask=mask,
        lengths=lengths,
        unroll=2,
        project_per_step=per_step,
        weight_grad_chunk=chunk,
    )

    @jax.jit  # one program (not one per eager operation of the reference)
    def run(params, carry, xs, target):
        grad = lambda f: jax.grad(loss, argnums=(1, 2, 3), allow_int=True)(
            f, params, carry, xs, target
        )
        return ref(params, carry, xs), fast(params, carry, xs), grad(ref), grad(fast)

    out_ref, out_fast, g_ref, g_fast = run(params, carry, xs, target)
    for a, b in zip(jax.tree.leaves(out_fast), jax.tree.leaves(out_ref)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, **tol)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref)):
        if a.dtype != jax.dtypes.float0:  # the SC-LSTM step counter
            np.testing.assert_allclose(a, b, **tol)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("gru_ra", marks=pytest.mark.slow),
        pytest.param("rrn3_tanh", marks=pytest.mark.slow),
        pytest.param("hrl", marks=pytest.mark.slow),
    ],
)
def test_a_batch_with_inert_padding_columns_matches_the_reference(name, batch=62):
    """The GRU's and RRN's fused scans run B rows as a multiple of 8 columns where that
    adds at most B / 16 (B = 4 elsewhere in this file: no padding): 62 gets 2 inert
    columns (the HRL's RRN half does, its LSTM half does not); float64, with lengths and
    dropout and without. (The GRU: its reset-after variant, the same padding.)"""
    lengths = np.random.default_rng(batch).integers(0, T + 1, batch)
    tol = dict(rtol=1e-10, atol=1e-12)
    with jax.enable_x64(True):
        compare(
            CELLS[name](),
            3,
            jnp.float64,
            lengths=lengths,
            use_mask=True,
            per_step=True,
            tol=tol,
            batch=batch,
        )
        compare(
            CELLS[name](),
            1,
            jnp.float64,
            lengths=None,
            use_mask=False,
            per_step=True,
            tol=tol,
            batch=batch,
        )


# The registry's cells (LSTM, GRU, RRN, SC-LSTM-I/P, HRL, LSTM+GRU) under this unroll
# (projecting per step), padded and full, with dropout: tests/test_scan_dispatch.py's
# float64 grid (through scan.unroll; its "full" rows: without lengths every step is real);
# here float32 with the projection before the scan, and the variants the grid lacks
# (reset_after, tanh at depth 3; float32 at depth 3: the chunk test below).
@pytest.mark.parametrize("name", [pytest.param("lstm", marks=pytest.mark.slow), "gru_ra"])
def test_float32_values_and_gradients_match_the_reference_with_padding_and_dropout(name):
    compare(
        CELLS[name](),
        3,
        jnp.float32,
        lengths=LENGTHS,
        use_mask=True,
        per_step=False,
        tol=dict(rtol=2e-4, atol=2e-5),
    )


@pytest.mark.parametrize("name", ["gru_ra", pytest.param("rrn3_tanh", marks=pytest.mark.slow)])
def test_float64_values_and_gradients_match_the_reference_projecting_per_step(name):
    with jax.enable_x64(True):
        compare(
            CELLS[name](),
            1,
            jnp.float64,
            lengths=LENGTHS,
            use_mask=False,
            per_step=True,
            tol=dict(rtol=1e-10, atol=1e-12),
        )


# Each kernel once, per step (chunk 1) or in chunks of 3 (the default: one chunk of T = 9),
# each chunk with the projection in the scan and before it.
@pytest.mark.parametrize(
    "name,m,per_step,chunk",
    [
        pytest.param("lstm", 1, True, 3, marks=pytest.mark.slow),
        ("gru", 3, True, 1),
        ("gru_ra", 3, False, 3),  # its extra dz rows
        pytest.param("rrn3_tanh", 3, False, 1, marks=pytest.mark.slow),
        ("sclstm_p", 3, False, 1),
    ],
)
def test_weight_gradients_in_chunks_match_the_reference(name, m, per_step, chunk):
    compare(
        CELLS[name](),
        m,
        jnp.float32,
        lengths=LENGTHS,
        use_mask=True,
        per_step=per_step,
        chunk=chunk,
        tol=dict(rtol=2e-4, atol=2e-5),
    )


# The registry's cells: tests/test_scan_dispatch.py (outputs=False, through scan.output_of).
@pytest.mark.parametrize("name", ["gru_ra", "rrn3_tanh"])
def test_output_of_the_final_carry_is_each_rows_last_output(name):
    cell = CELLS[name]()
    params, carry, xs, mask, _ = setup(cell, 2, jnp.float32)

    @jax.jit
    def run(params, carry, xs):
        carry_T, ys = fused_unroll(cell, params, carry, xs, mask, lengths=LENGTHS)
        return ys, gated_fused.output_of(cell, carry_T)

    ys, out = (np.asarray(a) for a in run(params, carry, xs))
    last = ys[np.maximum(LENGTHS - 1, 0), np.arange(B)]
    real = LENGTHS > 0
    np.testing.assert_allclose(out[real], last[real], rtol=1e-6, atol=1e-7)
    assert np.abs(np.asarray(last[real])).min() > 0  # ... and not vacuously


# Padded, the registry's cells: tests/test_scan_dispatch.py; here every kernel without
# lengths, and padded the variant the registry lacks.
@pytest.mark.parametrize(
    "name,lengths",
    [
        pytest.param("lstm", None, marks=pytest.mark.slow),
        pytest.param("gru", None, marks=pytest.mark.slow),  # fast: the dispatcher's lstm row
        pytest.param("gru_ra", None, marks=pytest.mark.slow),
        ("gru_ra", LENGTHS),
        pytest.param("rrn3_tanh", None, marks=pytest.mark.slow),
        ("sclstm_p", None),
        pytest.param("hrl", None, marks=pytest.mark.slow),
    ],
    ids=[
        "lstm-full",
        "gru-full",
        "gru_ra-full",
        "gru_ra-padded",
        "rrn3_tanh-full",
        "sclstm_p-full",
        "hrl-full",
    ],
)
def test_without_outputs_the_final_carry_and_its_gradients_match_the_reference(name, lengths):
    cell = CELLS[name]()
    params, carry, xs, mask, _ = setup(cell, 2, jnp.float32)
    ref = functools.partial(cells.unroll, cell, mask=mask, lengths=lengths)
    fast = functools.partial(fused_unroll, cell, mask=mask, lengths=lengths, outputs=False)
    assert jax.eval_shape(fast, params, carry, xs)[1] is None

    def final(unroll, params, carry, xs):  # every float leaf of the final carry
        leaves = jax.tree.leaves(unroll(params, carry, xs)[0])
        return sum(jnp.sum(jnp.sin(c)) for c in leaves if jnp.issubdtype(c.dtype, jnp.floating))

    grad = jax.value_and_grad(final, argnums=(1, 2, 3), allow_int=True)
    (v_ref, g_ref), (v_fast, g_fast) = jax.jit(
        lambda *a: (grad(ref, *a), grad(fast, *a))  # one program
    )(params, carry, xs)
    np.testing.assert_allclose(v_fast, v_ref, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref)):
        if a.dtype != jax.dtypes.float0:
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("chunk", [0, 2, 10, 3.0])
def test_a_weight_gradient_chunk_must_divide_the_sequence(chunk):
    cell = cells.LSTM(N)
    params, carry, xs, _, _ = setup(cell, 2, jnp.float32)
    with pytest.raises(ValueError, match=f"divisor of the {T} time steps"):
        fused_unroll(cell, params, carry, xs, weight_grad_chunk=chunk)


# Two kernels: every fused gradient equals autodiff of the reference scan to float64
# rounding (above and tests/test_scan_dispatch.py's grid); here the derivative itself, and
# SC-LSTM-P's dL/dα, which no other test isolates.
@pytest.mark.parametrize("name", ["gru_ra", pytest.param("sclstm_p", marks=pytest.mark.slow)])
def test_gradient_matches_finite_differences(name):
    with jax.enable_x64(True):
        cell = CELLS[name]()
        params, carry, xs, mask, target = setup(cell, 2, jnp.float64, seed=1)
        f = jax.jit(
            lambda p: loss(
                functools.partial(fused_unroll, cell, mask=mask, lengths=LENGTHS),
                p,
                carry,
                xs,
                target,
            )
        )
        check_gradient_by_finite_differences(f, params)
        if "alpha" in params:  # dL/dα on its own: the skips must carry it
            g = jax.grad(f)(params)["alpha"]
            e = 1e-6
            fd = (
                f({**params, "alpha": params["alpha"] + e})
                - f({**params, "alpha": params["alpha"] - e})
            ) / (2 * e)
            assert abs(float(g)) > 1e-3
            np.testing.assert_allclose(float(g), float(fd), rtol=1e-6, atol=1e-8)


def test_unsupported_cells_raise():
    assert not gated_fused.supports(cells.RHN(N, 2))
    assert not gated_fused.supports(cells.Parallel((cells.LSTM(N), cells.RHN(N, 2))))
    with pytest.raises(ValueError, match="no fused unroll"):
        fused_unroll(cells.RHN(N, 2), {}, jnp.zeros((B, N)), jnp.zeros((T, B, 3)))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("lstm", marks=pytest.mark.slow),
        "gru",  # fast: a gated cell and a chained one
        pytest.param("gru_ra", marks=pytest.mark.slow),
        "rrn1",
        pytest.param("sclstm_p", marks=pytest.mark.slow),
    ],
)
def test_step_is_plain_and_unroll_opts_into_saving_matmuls(name):
    """No jax.checkpoint inside ``step``; ``unroll(save_matmuls=True)`` adds it and
    computes the same gradients."""
    cell = CELLS[name]()
    params, carry, xs, mask, target = setup(cell, 3, jnp.float32)
    x_proj = jax.eval_shape(cell.project_inputs, params, xs)  # a step's input: shapes only
    x_t = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), x_proj)
    step_jaxpr = str(jax.make_jaxpr(lambda p, c, x: cell.step(p, c, x, mask))(params, carry, x_t))
    assert "checkpoint" not in step_jaxpr and "remat" not in step_jaxpr
    plain = functools.partial(cells.unroll, cell, mask=mask, lengths=LENGTHS)
    saving = functools.partial(cells.unroll, cell, mask=mask, lengths=LENGTHS, save_matmuls=True)
    assert "remat" in str(jax.make_jaxpr(saving)(params, carry, xs))  # jax.checkpoint's primitive
    g = lambda f: jax.jit(jax.grad(loss, argnums=1), static_argnums=0)(f, params, carry, xs, target)
    for a, b in zip(jax.tree.leaves(g(saving)), jax.tree.leaves(g(plain))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------- the classifier


def classifier_batch(vocab=11, T_max=9, seed=0):
    rng = np.random.default_rng(seed)
    tokens = as_jax(rng.integers(0, vocab, (B, T_max)), jnp.int32)
    labels = as_jax(rng.integers(0, 3, B), jnp.int32)
    return tokens, as_jax(LENGTHS), labels


def classifier_loss(model, params, tokens, lengths, labels):
    logits = model.logits(params, tokens, lengths)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


# One cell (a Parallel of two kernels): what the classifier reads of each cell's scan,
# every registry cell, is tests/test_scan_dispatch.py's (outputs=False and output_of).
@pytest.mark.slow  # fast: tests/test_scan_dispatch.py's RHN classifier and hrl final output
@pytest.mark.parametrize("name", ["lstm_gru"])
def test_classifier_fused_equals_reference_on_padded_batches(name):
    """The fused classifier scans without the padding mask and reads each row's output
    at its last real step (0 for an empty row): same logits and gradients as the
    masked reference scan."""
    kw = dict(cell=CELLS[name](), num_classes=3, input_size=6, vocab_size=11)
    ref = SequenceClassifier(**kw, scan_impl="reference")
    fused = SequenceClassifier(**kw)
    assert (fused.resolved_scan(B), ref.resolved_scan(B)) == ("fused", "reference")
    params = random_params(shapes(ref.init), 1)
    batch = classifier_batch()

    @jax.jit  # one program
    def run(params, batch):
        grad = lambda model: jax.grad(classifier_loss, argnums=1)(model, params, *batch)
        logits = [model.logits(params, *batch[:2]) for model in (fused, ref)]
        return logits, grad(ref), grad(fused)

    (l_fused, l_ref), g_ref, g_fused = run(params, batch)
    np.testing.assert_allclose(l_fused, l_ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "name,m",
    [
        pytest.param("lstm", 8, marks=pytest.mark.slow),
        ("gru", 1),
        pytest.param("gru_ra", 8, marks=pytest.mark.slow),
        pytest.param("rrn1", 8, marks=pytest.mark.slow),
    ],
)
def test_classifier_bfloat16_stays_close_to_float32(name, m):
    """bf16 matmul inputs (float32 accumulation and state) at the initial parameters
    (the regime training starts in): logits within 2% of their scale, gradients within
    5% (relative norm of the difference), over 64 steps."""
    kw = dict(cell=CELLS[name](), num_classes=3, input_size=m)
    f32, bf16 = SequenceClassifier(**kw), SequenceClassifier(**kw, dtype="bfloat16")
    params = f32.init(jax.random.PRNGKey(0))
    params["cell"] = jax.tree.map(lambda a: 4 * a, params["cell"])  # 0.16: gates in use
    rng = np.random.default_rng(0)
    xs = as_jax(rng.standard_normal((B, 64, m)), jnp.float32)
    lengths, labels = as_jax([64, 0, 30, 50], jnp.int32), as_jax([0, 1, 2, 1], jnp.int32)

    @jax.jit  # one program
    def run(params, xs, lengths, labels):
        logits = [model.logits(params, xs, lengths) for model in (f32, bf16)]
        grads = [
            jax.grad(classifier_loss, argnums=1)(model, params, xs, lengths, labels)
            for model in (f32, bf16)
        ]
        return logits, grads

    (l32, lbf), (g32, gbf) = run(params, xs, lengths, labels)
    assert lbf.dtype == jnp.float32
    np.testing.assert_allclose(lbf, l32, atol=0.02 * float(np.abs(l32).max()))
    for a, b in zip(jax.tree.leaves(gbf), jax.tree.leaves(g32)):
        assert a.dtype == jnp.float32
        a, b = np.asarray(a), np.asarray(b)
        assert float(np.linalg.norm(a - b)) <= 0.05 * float(np.linalg.norm(b)) + 1e-7


def test_classifier_options_are_checked():
    with pytest.raises(ValueError, match="scan_impl"):
        SequenceClassifier(cells.LSTM(N), 2, 3, scan_impl="fast")
    with pytest.raises(ValueError, match="cannot run DTRNN"):
        SequenceClassifier(cells.DTRNN(N, 2), 2, 3, scan_impl="fused")
    with pytest.raises(ValueError, match="dtype"):
        SequenceClassifier(cells.LSTM(N), 2, 3, dtype="float16")
    with pytest.raises(ValueError, match="bfloat16"):
        SequenceClassifier(cells.LSTM(N), 2, 3, scan_impl="reference", dtype="bfloat16")
    with pytest.raises(ValueError, match="bfloat16"):
        SequenceClassifier(cells.DTRNN(N, 2), 2, 3, dtype="bfloat16")
    assert SequenceClassifier(cells.DTRNN(N, 2), 2, 3).resolved_scan() == "reference"  # auto
    assert SequenceClassifier(cells.RHN(N, 2), 2, 3).resolved_scan() == "fused"
    with pytest.raises(ValueError, match="scan_impl must be one of"):  # no other spelling
        SequenceClassifier(cells.RHN(N, 2), 2, 3, scan_impl=None)


def test_classifier_remat_is_honoured_not_dropped():
    """remat=True recomputes time steps (jax.checkpoint's ``remat`` primitive, saving
    nothing, in the jaxpr) with the same gradients; with scan_impl 'auto' it takes the
    reference scan, which has remat, and ``'fused'`` with remat is refused (one line)."""
    kw = dict(cell=cells.LSTM(N), num_classes=3, input_size=6, vocab_size=11)
    with pytest.raises(ValueError, match="remat needs the reference scan"):
        SequenceClassifier(**kw, scan_impl="fused", remat=True)
    with pytest.raises(ValueError, match="bfloat16"):
        SequenceClassifier(**kw, remat=True, dtype="bfloat16")
    plain, remat = SequenceClassifier(**kw), SequenceClassifier(**kw, remat=True)
    assert (plain.resolved_scan(B), remat.resolved_scan(B)) == ("fused", "reference")
    params = random_params(shapes(plain.init), 1)
    batch = classifier_batch()
    grad = lambda model: jax.jit(jax.grad(classifier_loss, argnums=1), static_argnums=0)(
        model, params, *batch
    )
    jaxpr = lambda model: str(jax.make_jaxpr(lambda p: classifier_loss(model, p, *batch))(params))
    assert "remat" not in jaxpr(plain)
    assert "policy=None" in jaxpr(remat)  # everything recomputed (save_matmuls keeps dots)
    for a, b in zip(jax.tree.leaves(grad(remat)), jax.tree.leaves(grad(plain))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("backend, lstm, rrn", [("cpu", 1, 2), ("gpu", 8, 8)])
def test_default_unroll_is_the_backends_measured_one(monkeypatch, backend, lstm, rrn):
    """``unroll=None`` takes ``default_unroll``: per backend (JAX's default one), as
    measured (1, RRN 2 on the CPU; 8 on a GPU), in the forward and the backward scan."""
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    for cell, want in [(cells.LSTM(N), lstm), (cells.RRN(N), rrn)]:
        params, carry, xs, _, target = setup(cell, 3, jnp.float32)
        assert gated_fused.default_unroll(cell) == want
        f = lambda p: loss(functools.partial(fused_unroll, cell), p, carry, xs, target)
        scans = re.findall(
            r"\blength=(\d+)[^\]]*?\breverse=(\w+)[^\]]*?\bunroll=(\d+)",
            str(jax.make_jaxpr(jax.grad(f))(params)),
            re.S,
        )
        time_scans = sorted((r, int(u)) for length, r, u in scans if int(length) == T)
        assert time_scans == [("False", want), ("True", want)], (cell, scans)
