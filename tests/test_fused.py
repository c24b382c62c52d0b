"""The fused unroll (hand-written backward pass) against the reference cells."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import dropout_mask, normal, random_params, shapes

from rhnzoo import cells
from rhnzoo.cells import rhn_fused as fused
from rhnzoo.models import lm
from rhnzoo.cells.scan_options import Options


def fused_unroll(cell, params, carry, xs, mask=None, *, lengths=None, resets=None, **options):
    """:func:`rhnzoo.cells.rhn_fused.unroll` with its options record's fields as keywords."""
    opts = Options(**options)
    return fused.unroll(cell, params, carry, xs, mask, opts, lengths=lengths, resets=resets)


def setup(depth, hsg, seed=0, B=3, m=5, n=6, T=7):
    cell = cells.RHN(n, depth)
    if hsg:
        cell = cells.HSG(cell)
    rng = np.random.default_rng(seed)  # NumPy draws: nothing compiled
    # Random (not initial) parameters, so every gate is away from its init value.
    params = random_params(shapes(cell.init, m), rng, 0.5)
    xs = normal(rng, (T, B, m))
    s0 = normal(rng, (B, n))
    mask = dropout_mask(rng, (B, n), 0.7)
    return cell, params, xs, s0, mask


def loss(unroll_fn, cell, params, s0, xs, mask, target):
    carry, ys = unroll_fn(cell, params, s0, xs, mask)
    return jnp.sum(jnp.sin(ys) * target) + jnp.sum(carry**2)


@pytest.mark.parametrize(
    "depth,hsg,use_mask,remat,layer_loop",
    [
        pytest.param(1, False, False, False, "scan", marks=pytest.mark.slow),
        (1, True, True, True, "python"),
        pytest.param(3, False, True, False, "python", marks=pytest.mark.slow),
        (3, True, False, True, "scan"),
        pytest.param(5, True, True, False, "scan", marks=pytest.mark.slow),
        pytest.param(5, False, True, True, "python", marks=pytest.mark.slow),
    ],  # layer_loop None: 'python' up to depth 10 (the dispatcher grid's RHN and HSG rows)
)
def test_fused_matches_reference_values_and_gradients(depth, hsg, use_mask, remat, layer_loop):
    cell, params, xs, s0, mask = setup(depth, hsg, seed=depth)
    mask = mask if use_mask else None
    target = normal(9, (xs.shape[0], xs.shape[1], cell.hidden_size))
    ref = lambda *a: cells.unroll(*a)
    fast = lambda *a: fused_unroll(*a, remat=remat, unroll=2, layer_loop=layer_loop)

    @jax.jit  # one program (not one per eager operation of the reference)
    def run(params, s0, xs, mask, target):
        grad = lambda f: jax.grad(loss, argnums=(2, 3, 4))(f, cell, params, s0, xs, mask, target)
        ys = [f(cell, params, s0, xs, mask)[1] for f in (fast, ref)]
        return ys, grad(ref), grad(fast)

    (y_fast, y_ref), g_ref, g_fast = run(params, s0, xs, mask, target)
    np.testing.assert_allclose(y_fast, y_ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_language_model_gradients_agree_between_scan_impls():
    kw = dict(vocab_size=13, hidden_size=8, depth=3, hsg=True)
    ref, fast = lm.rhn_language_model(**kw), lm.rhn_language_model(**kw, scan_impl="fused")
    params = ref.init(jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 9), 0, 13)
    from rhnzoo import dropout

    masks = dropout.lm_masks(
        jax.random.PRNGKey(2), tokens, 13, 8, 8, dropout.Rates(0.2, 0.3, 0.2, 0.3)
    )
    f = lambda model: jax.grad(
        lambda p: model.nll(p, model.initial_carry(4), tokens, jnp.roll(tokens, 1, 1), masks)[0]
    )(params)
    for a, b in zip(jax.tree.leaves(f(fast)), jax.tree.leaves(f(ref))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_bfloat16_matmuls_stay_close_to_float32():
    """At the initial parameters (the regime training starts in) bf16 matmul inputs
    perturb the outputs by about bf16's relative precision (2^-8), not more."""
    cell = cells.HSG(cells.RHN(32, 3))
    params = cell.init(jax.random.PRNGKey(0), 16)
    xs = normal(1, (20, 4, 16))
    s0 = jnp.zeros((4, 32))
    _, y32 = fused_unroll(cell, params, s0, xs)
    _, y16 = fused_unroll(cell, params, s0, xs, dtype=jnp.bfloat16)
    assert y16.dtype == jnp.float32
    rel = float(jnp.abs(y16 - y32).max() / jnp.abs(y32).max())
    assert 0 < rel < 2**-6, rel


def _dot_dtypes(jaxpr, where=""):
    """``(where, operand dtypes)`` of every dot_general in ``jaxpr``, inside scans and
    other sub-jaxprs too (``where``: the enclosing primitives, e.g. ``/scan``)."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append((where, tuple(str(v.aval.dtype) for v in eqn.invars)))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    found += _dot_dtypes(sub, f"{where}/{eqn.primitive.name}")
    return found


@pytest.mark.parametrize(
    "hsg,layer_loop,remat", [(True, "python", False), (True, "scan", True), (False, "scan", False)]
)
def test_bfloat16_backward_multiplies_bfloat16_inputs_like_the_forward(hsg, layer_loop, remat):
    """With ``dtype=bfloat16`` every product of the gradient program, the backward's
    (the per-step ds and HSG products, the weight gradients, the input projection's
    transposes) included, takes bfloat16 operands and accumulates in float32: none runs
    in float32 where the forward's runs in bfloat16 (autodiff's transpose of the input
    projection multiplied its float32 cotangent by the bfloat16 inputs)."""
    cell, params, xs, s0, mask = setup(3, hsg, n=8)
    f = lambda p, xs: jnp.sum(
        fused_unroll(cell, p, s0, xs, mask, dtype=jnp.bfloat16, layer_loop=layer_loop, remat=remat)[
            1
        ]
        ** 2
    )
    dots = _dot_dtypes(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(params, xs).jaxpr)
    assert sum("scan" in where for where, _ in dots) >= 2, dots  # the per-step products seen
    assert len(dots) >= 6 and all(d == ("bfloat16", "bfloat16") for _, d in dots), dots
    grads = jax.jit(jax.grad(f, argnums=(0, 1)))(params, xs)  # XLA:CPU runs these products
    assert all(g.dtype == jnp.float32 and jnp.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_fused_rejects_unsupported_cells():
    with pytest.raises(ValueError, match="coupled"):
        cell = cells.RHN(4, 2, coupled=False)
        fused_unroll(
            cell, cell.init(jax.random.PRNGKey(0), 3), jnp.zeros((2, 4)), jnp.zeros((5, 2, 3))
        )
    with pytest.raises(ValueError, match="bfloat16 needs"):
        lm.rhn_language_model(10, 8, 2, dtype="bfloat16")
    cell = cells.RHN(4, 2)
    with pytest.raises(ValueError, match="layer_loop must be"):
        fused_unroll(
            cell,
            cell.init(jax.random.PRNGKey(0), 3),
            jnp.zeros((2, 4)),
            jnp.zeros((5, 2, 3)),
            layer_loop="unrolled",
        )


def test_runtime_one_is_exactly_one_and_stays_in_the_compiled_program():
    """The backward pass's guard against XLA:CPU recomputing the ds chain per micro-layer
    (``rhn_fused._runtime_one``, docs/runs/cpu/levers.md, round 7): exactly 1.0 for any
    dropout mask, so dividing by it changes no value, and not folded by the compiler (a
    constant 1.0 is, which is why it is computed from the mask)."""
    for mask in (jnp.ones((3, 4)), jnp.zeros((3, 4)), jnp.full((3, 4), 1 / 0.3)):
        assert float(fused._runtime_one(mask)) == 1.0
    x = jnp.ones((8, 8))
    compiled = lambda f: jax.jit(f).lower(x, x).compile().as_text()
    assert "divide" in compiled(lambda x, m: x / fused._runtime_one(m))
    assert "divide" not in compiled(lambda x, m: x / 1.0)  # the control: folded away


@pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="counts XLA:CPU's copies in its "
    "optimized HLO; other compilers lay out and fuse the weights otherwise",
)
@pytest.mark.slow
def test_layer_loop_copies_each_weight_matrix_once_per_direction():
    """With the Python layer loop, XLA:CPU's compiled gradient copies each micro-layer's
    weights once for the forward pass (R_l^T, a transposing copy) and once for the
    backward pass (R_l, a slice): 2 L copies of a ``[n, 2n]`` matrix. Writing R_l^T as
    ``R[l].T`` compiled to 3 L (the slice, then its transpose; docs/runs/cpu/levers.md,
    round 8). Counted in the optimized HLO's entry computation, outside the time loops."""
    L, n = 3, 24
    cell, params, xs, s0, mask = setup(L, False, n=n, T=5)
    ys = lambda p: fused_unroll(cell, p, s0, xs, mask, layer_loop="python")[1]
    hlo = jax.jit(jax.grad(lambda p: jnp.sum(ys(p) ** 2))).lower(params).compile().as_text()
    entry = hlo[hlo.index("ENTRY") :]
    shape = rf"f32\[(?:{n},{2 * n}|{2 * n},{n})\]"  # one layer's R_l or R_l^T
    copies = [
        op
        for op in entry.splitlines()
        if re.search(rf"= {shape}\S* (copy|transpose|slice)\(", op)
        or (re.search(rf"= {shape}\S* fusion\(", op) and "kind=kLoop" in op)
    ]
    assert len(copies) == 2 * L, copies


def _while_body_ops(hlo, shape):
    """The instructions of the optimized HLO's while-loop bodies (the time scans and any
    layer scan inside them) that materialise an array of ``shape`` (a regex): copies,
    slices, transposes, gathers and loop fusions (a fused slice is a loop fusion)."""
    comps, name = {}, None
    for line in hlo.splitlines():
        if m := re.match(r"^(?:ENTRY )?%(\S+) \(.*\{$", line):
            name = m.group(1)
            comps[name] = []
        elif name:
            comps[name].append(line)
    bodies = {b for ops in comps.values() for op in ops for b in re.findall(r"body=%([\w.-]+)", op)}
    assert bodies, "no while loop in the program"
    return [
        op.strip()
        for b in sorted(bodies)
        for op in comps[b]
        if re.search(rf"= {shape}\S* (copy|dynamic-slice|slice|transpose|gather)\(", op)
        or (re.search(rf"= {shape}\S* fusion\(", op) and "kind=kLoop" in op)
    ]


@pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="reads XLA:CPU's optimized HLO; other "
    "compilers fuse or alias the weights' slices otherwise",
)
@pytest.mark.slow
def test_hoisted_layer_weights_are_not_copied_per_micro_layer_step():
    """Above depth 10 (here 12, with HSG), the per-layer weights sliced once outside the
    time scan (``layer_loop='python'``) leave no ``[n, 2n]`` (or ``[2n, n]``) weight copy
    inside any while body of the compiled value-and-gradient; the layer scan over the
    stacked weights (``'scan'``, the control) materialises R_l^T out of the stack in the
    forward body and R_l in the backward body, per micro-layer and time step."""
    L, n = 12, 24
    cell, params, xs, s0, mask = setup(L, True, n=n, T=4)
    shape = rf"f32\[(?:{n},{2 * n}|{2 * n},{n})\]"  # one layer's R_l or R_l^T

    def body_copies(layer_loop):
        f = lambda p: jnp.sum(fused_unroll(cell, p, s0, xs, mask, layer_loop=layer_loop)[1] ** 2)
        return _while_body_ops(
            jax.jit(jax.value_and_grad(f)).lower(params).compile().as_text(), shape
        )

    assert body_copies("python") == []
    assert len(body_copies("scan")) >= 2  # the counter sees XLA:CPU's per-step copies


@pytest.mark.parametrize(
    "hsg,layer_loop,remat",
    [
        pytest.param(True, "python", False, marks=pytest.mark.slow),
        pytest.param(False, "python", True, marks=pytest.mark.slow),
        (True, "scan", False),
    ],
)
def test_float64_values_and_gradients_match_the_reference_to_rounding(hsg, layer_loop, remat):
    """In float64 (``dtype=None``: no float32 cast, exact tanh / sigmoid) the hand-written
    backward pass equals autodiff of the reference cell to rounding, with dropout."""
    with jax.enable_x64(True):
        cell, params, xs, s0, mask = setup(4, hsg, seed=11)
        params, xs, s0, mask = jax.tree.map(lambda a: a.astype(jnp.float64), (params, xs, s0, mask))
        shape = (*xs.shape[:2], cell.hidden_size)
        target = normal(9, shape, jnp.float64)
        fast = lambda *a: fused_unroll(*a, dtype=None, layer_loop=layer_loop, remat=remat)
        ys = fast(cell, params, s0, xs, mask)[1]
        assert ys.dtype == jnp.float64
        np.testing.assert_allclose(ys, cells.unroll(cell, params, s0, xs, mask)[1], rtol=1e-12)
        grad = lambda f: jax.grad(loss, argnums=(2, 3, 4))(f, cell, params, s0, xs, mask, target)
        for a, b in zip(jax.tree.leaves(grad(fast)), jax.tree.leaves(grad(cells.unroll))):
            assert a.dtype == jnp.float64
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
