"""The one scan dispatcher (``rhnzoo.cells.scan``): every registered cell under every
implementation it has against the reference scan (values and every gradient, with and
without ``lengths``), the ``auto`` rule and its one-line refusals, one ``--scan_impl``
in every task, and each task's model under 'fused' against 'reference'. (The pallas
kernel's own tests are in ``tests/test_gated_pallas.py``.)"""

import dataclasses
import inspect
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import normal, random_params, random_problem

from rhnzoo import cells, dropout
from rhnzoo.cells import scan
from rhnzoo.cells.kernels import gated as gated_pallas
from rhnzoo.cells.scan import ScanImpl
from rhnzoo.models import lm
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.tasks import lm as lm_training
from rhnzoo.configs import lm as lm_configs
from rhnzoo.tasks import polyphonic
from rhnzoo.configs import rrl as rrl_configs
from rhnzoo.configs import jsb as jsb_configs

B, N, M, T = 4, 5, 3, 7
LENGTHS = np.array([7, 0, 3, 5], np.int32)  # a full row, an empty one, two padded ones
SETTINGS = dict(depth=2, init_scale=0.1, init_bias=-1.0, skip=2)
FLOAT64 = dict(rtol=1e-10, atol=1e-12)


def build(name, n=N):
    return cells.make(name, n, **cells.applicable(name, SETTINGS))


def impls(name):
    """(name, impl) for every implementation the cell has but the reference scan (which
    ``test_the_reference_scan_is_exactly_rhnzoo_cells_unroll`` holds equal to
    ``cells.unroll`` bit for bit) and the pallas kernel (``tests/test_*_pallas.py``)."""
    return [
        (name, str(i))
        for i in scan.implementations(build(name))
        if i not in (ScanImpl.REFERENCE, ScanImpl.PALLAS)
    ]


# The fast selection: each kind of fused scan once (gated, Parallel of gated, the RHN and
# HSG(RHN)), padded; one cell without lengths; the rest are variants of these (CI).
FAST = {"lstm", "hrl", "rhn", "hsg_rhn"}
FAST_FULL = {"rhn"}
FUSED = [n for n in cells.ALL_NAMES if ScanImpl.FUSED in scan.implementations(build(n))]


def setup(cell, seed=0, dtype=jnp.float64):
    """Random (not initial) parameters and carry, inputs, a dropout mask, a target."""
    return random_problem(cell, T=T, B=B, m=M, n=N, dtype=dtype, seed=seed)


def loss(run, params, carry, xs, target):
    """Depends on every output and every float leaf of the final carry."""
    carry, ys = run(params, carry, xs)
    floats = [c for c in jax.tree.leaves(carry) if jnp.issubdtype(c.dtype, jnp.floating)]
    return jnp.sum(jnp.sin(ys) * target) + sum(jnp.sum(jnp.cos(c) * c) for c in floats)


def assert_trees_close(got, want, **tol):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if a.dtype == jax.dtypes.float0:  # the SC-LSTM step counter's "gradient"
            continue
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, **tol)


@pytest.mark.x64_grid  # CI: in the second session (.ci/run), beside the Pallas tests
@pytest.mark.parametrize(
    "name,impl,lengths",
    [
        pytest.param(
            n,
            i,
            lengths,
            marks=() if n in (FAST if padded else FAST_FULL) else pytest.mark.slow,
            id=f"{n}-{i}-{'padded' if padded else 'full'}",
        )
        for padded, lengths in ((True, LENGTHS), (False, None))
        for name in cells.ALL_NAMES
        for n, i in impls(name)
    ],
)
def test_every_cell_under_every_scan_matches_the_reference(name, impl, lengths):
    """float64: the dispatched scan's outputs, final carry and the gradients of a loss
    on both (params, initial carry, inputs) equal the reference scan's
    (``rhnzoo.cells.unroll``, autodiff), with the dropout mask, padded or not."""
    cell = build(name)
    with jax.enable_x64(True):
        params, carry, xs, mask, target = setup(cell)
        ref = functools.partial(cells.unroll, cell, mask=mask, lengths=lengths)
        run = functools.partial(scan.unroll, cell, mask=mask, impl=impl, lengths=lengths, unroll=2)
        assert_trees_close(jax.jit(run)(params, carry, xs), ref(params, carry, xs), **FLOAT64)
        grad = jax.grad(loss, argnums=(1, 2, 3), allow_int=True)
        g_ref = grad(ref, params, carry, xs, target)
        g_run = jax.jit(grad, static_argnums=0)(run, params, carry, xs, target)
        assert_trees_close(g_run, g_ref, **FLOAT64)
        for g in jax.tree.leaves(g_run[0]):  # ... and not vacuously
            assert float(jnp.abs(g).max()) > 0


@pytest.mark.parametrize(  # HSG(RHN)'s final output is read as the RHN's: its row in CI
    "name",
    [pytest.param(n, marks=() if n in FAST - {"hsg_rhn"} else pytest.mark.slow) for n in FUSED],
)
def test_fused_final_output_without_the_output_stack_matches_the_reference(name):
    """What the classifier reads: ``outputs="last"`` gives each row's output at its last
    real step (zeros for an empty row) with the reference scan's gradients, from the fused
    scan (no output stack: ``output_of`` of the final carry) and from the reference one
    (gathered from its outputs) alike (float64; the RHN's fused scan has no lengths of its
    own: the dispatcher reads its carry from the output at the last real step)."""
    cell = build(name)
    idx = (np.maximum(LENGTHS - 1, 0), np.arange(B))
    real = LENGTHS > 0

    def ref(params, carry, xs):
        ys = cells.unroll(cell, params, carry, xs, lengths=LENGTHS)[1]
        return jnp.where(real[:, None], ys[idx], 0.0)

    def run(impl, params, carry, xs):
        carry, last = scan.unroll(
            cell, params, carry, xs, impl=impl, lengths=LENGTHS, outputs="last"
        )
        assert last.shape == (B, N)
        return last

    with jax.enable_x64(True):
        params, carry, xs, _, _ = setup(cell, seed=1)
        w = normal(jax.random.PRNGKey(7), (B, N), jnp.float64)
        grad = lambda f: jax.grad(
            lambda *a: jnp.sum(jnp.sin(f(*a)) * w), argnums=(0, 1, 2), allow_int=True
        )(params, carry, xs)
        for impl in ("fused", "reference"):
            last = functools.partial(run, impl)
            assert_trees_close(last(params, carry, xs), ref(params, carry, xs), **FLOAT64)
            assert_trees_close(grad(last), grad(ref), **FLOAT64)
    with pytest.raises(ValueError, match="outputs must be 'all', 'last' or 'none'"):
        scan.unroll(cell, params, carry, xs, impl="fused", outputs="every")


# The reference branch passes every cell on alike: one cell with a fused scan, one
# without, a carry with a step counter, a Parallel.
@pytest.mark.parametrize("name", ["rhn", "dtrnn", "sc_lstm_p", "hrl"])
def test_the_reference_scan_is_exactly_rhnzoo_cells_unroll(name):
    cell = build(name)
    params, carry, xs, mask, _ = setup(cell, dtype=jnp.float32)
    for kw in (dict(lengths=LENGTHS), dict(lengths=None, project_per_step=True)):
        got = scan.unroll(cell, params, carry, xs, mask, impl="reference", **kw)
        want = cells.unroll(cell, params, carry, xs, mask, **kw)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------ resolve


def test_auto_is_fused_where_the_cell_has_it_else_reference():
    want = {
        "rhn": "fused",
        "dtrnn": "reference",
        "dtsrnn": "reference",
        "lstm": "fused",
        "gru": "fused",
        "rrn": "fused",
        "sc_lstm_i": "fused",
        "sc_lstm_p": "fused",
        "hrl": "fused",
        "lstm_gru": "fused",
        "hsg_rhn": "fused",
        "hsg_dtrnn": "reference",
        "hsg_dtsrnn": "reference",
        "hsg_gru": "reference",
        "hsg_rrn": "reference",
    }
    assert {n: str(scan.resolve("auto", build(n))) for n in cells.ALL_NAMES} == want
    assert scan.resolve("auto", cells.RHN(N, 2, coupled=False)) is ScanImpl.REFERENCE
    # remat: the RHN's fused scan has it, the gated ones do not
    assert scan.resolve("auto", build("hsg_rhn"), remat=True) is ScanImpl.FUSED
    assert scan.resolve("auto", build("lstm"), remat=True) is ScanImpl.REFERENCE
    # bfloat16: the reference scan has none
    assert scan.resolve("auto", build("gru"), dtype=jnp.bfloat16) is ScanImpl.FUSED
    assert scan.resolve(ScanImpl.REFERENCE, build("gru")) is ScanImpl.REFERENCE


@pytest.mark.parametrize("dtype", [None, jnp.float32, jnp.bfloat16])
def test_auto_never_picks_pallas_on_the_cpu(dtype):
    """With the real ``gated_pallas`` (whatever it supports by now): the CPU, named or
    JAX's default in this suite, never gets the kernel."""
    for name in cells.ALL_NAMES:
        for batch in (None, 1, 64, 100, 128):
            for backend in ("cpu", None):
                try:
                    got = scan.resolve(
                        "auto", build(name, 64), batch=batch, dtype=dtype, backend=backend
                    )
                except ValueError:  # bfloat16 and no fused scan
                    assert dtype is jnp.bfloat16
                    continue
                assert got is not ScanImpl.PALLAS, (name, batch, dtype, backend)


def test_auto_picks_pallas_exactly_where_the_kernel_says_it_fits(monkeypatch):
    """The rule's first step, with a stand-in kernel that supports the LSTM and fits on
    'gpu' at batch 64 in bfloat16 for inputs narrower than 100: it receives the cell,
    batch, dtype, backend and input width, and auto takes it only there, never with
    remat or an unknown batch."""
    seen = []

    def fits(cell, batch, dtype, backend=None, input_size=1):
        seen.append((cell, batch, dtype, backend, input_size))
        return backend == "gpu" and batch == 64 and dtype == jnp.bfloat16 and input_size < 100

    monkeypatch.setattr(gated_pallas, "supports", lambda cell: isinstance(cell, cells.LSTM))
    monkeypatch.setattr(gated_pallas, "fits", fits)
    lstm, bf16 = build("lstm"), jnp.bfloat16
    assert scan.resolve("auto", lstm, batch=64, dtype=bf16, backend="gpu") is ScanImpl.PALLAS
    assert seen == [(lstm, 64, bf16, "gpu", 1)]
    assert (
        scan.resolve("auto", lstm, batch=64, dtype=bf16, backend="gpu", input_size=300)
        is ScanImpl.FUSED
    )
    assert seen[-1] == (lstm, 64, bf16, "gpu", 300)
    assert scan.resolve("auto", lstm, batch=64, dtype=bf16, backend="cpu") is ScanImpl.FUSED
    assert scan.resolve("auto", lstm, batch=32, dtype=bf16, backend="gpu") is ScanImpl.FUSED
    assert scan.resolve("auto", lstm, batch=64, dtype=None, backend="gpu") is ScanImpl.FUSED
    assert scan.resolve("auto", lstm, dtype=bf16, backend="gpu") is ScanImpl.FUSED  # batch None
    with pytest.raises(ValueError, match="LSTM does not have with remat"):  # not pallas
        scan.resolve("auto", lstm, batch=64, dtype=bf16, backend="gpu", remat=True)
    assert scan.resolve("auto", build("gru"), batch=64, dtype=bf16, backend="gpu") is ScanImpl.FUSED
    assert scan.resolve("pallas", lstm) is ScanImpl.PALLAS  # explicit: no fits() needed
    with pytest.raises(ValueError, match="the pallas scan of LSTM has no remat"):
        scan.resolve("pallas", lstm, remat=True)


@pytest.mark.parametrize(
    "impl, cell, kw, message",
    [
        (
            "fast",
            cells.LSTM(N),
            {},
            "scan_impl must be one of auto, reference, fused, pallas, got 'fast'",
        ),
        (
            "fused",
            cells.DTRNN(N, 2),
            {},
            "scan_impl='fused' cannot run DTRNN; its scans: reference",
        ),
        ("fused", cells.HSG(cells.GRU(N)), {}, "cannot run HSG(GRU); its scans: reference"),
        (
            "fused",
            cells.RHN(N, 2, coupled=False),
            {},
            "cannot run RHN(coupled=False); its scans: reference",
        ),
        (
            "pallas",
            cells.HSG(cells.RHN(N, 2, coupled=False)),
            {},
            "scan_impl='pallas' cannot run HSG(RHN(coupled=False)); its scans: reference",
        ),
        (
            "pallas",
            cells.RRN(128, depth=4),
            {},  # four 128 x 128 matrices and the forward's step buffers: too many
            "cannot run RRN; its scans: reference, fused (the persistent kernels: LSTM, SC-LSTM",
        ),
        (
            "fused",
            cells.Parallel((cells.LSTM(N), cells.RRN(N))),
            {"remat": True},
            (
                "remat needs the reference scan (scan_impl='reference'): the fused scan of "
                "Parallel(LSTM, RRN) has no remat"
            ),
        ),
        (
            "reference",
            cells.GRU(N),
            {"dtype": "bfloat16"},
            "dtype=bfloat16 needs the fused or pallas scan",
        ),
        (
            "auto",
            cells.DTSRNN(N, 2),
            {"dtype": jnp.bfloat16},
            "DTSRNN does not have (its scans: reference)",
        ),
        (
            "auto",
            cells.LSTM(N),
            {"dtype": jnp.bfloat16, "remat": True},
            "LSTM does not have with remat",
        ),
    ],
)
def test_a_scan_the_cell_does_not_have_is_one_line(impl, cell, kw, message):
    with pytest.raises(ValueError) as e:
        scan.resolve(impl, cell, **kw)
    assert message in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="scan"):  # the dispatcher refuses the same
        scan.unroll(
            cell,
            cell.init(jax.random.PRNGKey(0), M),
            cell.initial_carry(B),
            jnp.zeros((T, B, M)),
            impl=impl,
            **kw,
        )


def _every_unroll(cell):
    """``cells.unroll`` and ``scan.unroll`` under each implementation but pallas."""
    runs = [("cells.unroll", cells.unroll)]
    for impl in scan.implementations(cell):
        if impl is not ScanImpl.PALLAS:
            runs.append((str(impl), functools.partial(scan.unroll, impl=impl)))
    return runs


BAD_INPUTS = [
    ("xs [T, m]", lambda xs, lens: (xs[:, 0], {}), r"xs must be \[T, B, m\] .*got shape \[7, 3\]"),
    ("carry of another batch", None, r"batch B = 4 .*got a leaf of shape \[5, 5\]"),
    ("lengths < 0", lambda xs, lens: (xs, {"lengths": lens - 1}), r"lie in \[0, T\] = \[0, 7\]"),
    ("lengths > T", lambda xs, lens: (xs, {"lengths": lens + 1}), r"lie in \[0, T\] = \[0, 7\]"),
    ("float lengths", lambda xs, lens: (xs, {"lengths": lens * 1.0}), r"\[B\] = \[4\] int array"),
    ("lengths [1]", lambda xs, lens: (xs, {"lengths": lens[:1]}), r"\[B\] = \[4\] int array"),
]


@pytest.mark.parametrize("name", ["rhn", "lstm", "rrn", "dtrnn"])
@pytest.mark.parametrize("what,bad,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_to_every_unroll_are_one_line_before_any_scan(name, what, bad, message):
    # Before: a rank-2 xs broadcast over the carry's batch (every row the same), negative
    # lengths ran as 0 and lengths past T as T, and a carry of another batch failed inside
    # lax.scan; each scan said it differently or not at all.
    cell = build(name)
    params = cell.init(jax.random.PRNGKey(0), M)
    xs, lens = jnp.ones((T, B, M)), jnp.asarray(LENGTHS)
    carry = cell.initial_carry(B + 1 if bad is None else B)
    xs, kw = (xs, {}) if bad is None else bad(xs, lens)
    for label, run in _every_unroll(cell):
        with pytest.raises(ValueError, match=message) as e:
            run(cell, params, carry, xs, **kw)
        assert "\n" not in str(e.value), label


@pytest.mark.parametrize("name", ["rhn", "hsg_rhn", "dtrnn", "dtsrnn", "rrn", "lstm"])
def test_parameters_of_another_depth_or_input_size_are_refused_by_name(name):
    # Before: RHN(4, 3) ran RHN(4, 2)'s parameters at depth 2 with no word (its micro-layers
    # loop over params['R']), as did the DT-RNNs; a wrong input width was a dot_general error.
    cell = build(name)
    deeper = cells.make(name, N, **cells.applicable(name, dict(SETTINGS, depth=3)))
    carry, xs = cell.initial_carry(B), jnp.ones((T, B, M))
    for params, text in (
        (deeper.init(jax.random.PRNGKey(0), M), "depth 2"),
        (cell.init(jax.random.PRNGKey(0), M + 1), f"[{M + 1}, "),
    ):
        if name == "lstm" and text == "depth 2":
            continue  # no depth
        for label, run in _every_unroll(cell):
            with pytest.raises(ValueError) as e:
                run(cell, params, carry, xs)
            got = str(e.value)
            assert "parameter '" in got and text in got and "\n" not in got, (label, got)


@pytest.mark.parametrize("name", ["rhn", "lstm", "gru", "rrn", "dtrnn"])
def test_integer_inputs_are_the_numbers_of_their_float_values_under_every_scan(name):
    # Before: the reference scan's projection cast W to the inputs' dtype, so uint8 pixels
    # met a W truncated to 0 (every output as for zero inputs), while the fused scan cast
    # the inputs to float.
    cell = build(name)
    params = cell.init(jax.random.PRNGKey(1), M)
    pixels = jax.random.randint(jax.random.PRNGKey(2), (T, B, M), 0, 3).astype(jnp.uint8)
    for label, run in _every_unroll(cell):
        _, got = run(cell, params, cell.initial_carry(B), pixels)
        _, want = run(cell, params, cell.initial_carry(B), pixels.astype(jnp.float32))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=label)
        assert np.abs(np.asarray(want)).max() > 0


@pytest.mark.parametrize("name", ["lstm", "rhn", "dtrnn"])
def test_a_sequence_of_no_steps_is_the_initial_carry_under_every_scan(name):
    # Before: the gated fused scan gave ys [1, B, n] for T = 0, and outputs="last" from the
    # reference scan raised IndexError.
    cell = build(name)
    params, carry = cell.init(jax.random.PRNGKey(0), M), cell.initial_carry(B)
    carry = jax.tree.map(lambda c: c + 1 if jnp.issubdtype(c.dtype, jnp.floating) else c, carry)
    for label, run in _every_unroll(cell):
        for outputs, shape in (("all", (0, B, N)), ("last", (B, N))):
            kw = {} if label == "cells.unroll" else {"outputs": outputs}
            if label == "cells.unroll" and outputs == "last":
                continue
            got_carry, ys = run(cell, params, carry, jnp.ones((0, B, M)), **kw)
            assert ys.shape == shape and not np.any(ys), (label, outputs)
            assert_trees_close(got_carry, carry, rtol=0, atol=0)


def test_hsg_rhn_spelled_either_way_is_one_model_with_one_scan():
    """``cell='hsg_rhn'`` and ``cell='rhn', hsg=True`` build the same cell, so every
    model resolves them to the same scan, under every choice and with remat."""
    a = cells.make("hsg_rhn", N, depth=2)
    b = cells.make("rhn", N, depth=2, hsg=True)
    assert a == b
    for impl in ("auto", "reference", "fused"):
        for remat in (False, True):
            assert scan.resolve(impl, a, remat=remat) is scan.resolve(impl, b, remat=remat)
    models = [
        lm.language_model("hsg_rhn", 11, N, depth=2, scan_impl="auto"),
        lm.language_model("rhn", 11, N, depth=2, hsg=True, scan_impl="auto"),
    ]
    assert models[0] == models[1] and models[0].resolved_scan(20) is ScanImpl.FUSED
    clf = [SequenceClassifier(c, 2, M) for c in (a, b)]
    assert clf[0] == clf[1] and clf[0].resolved_scan(20) is ScanImpl.FUSED


def test_scan_impl_is_one_setting_in_every_task():
    """``--scan_impl``: the same default, choices, help and resume rule in every config."""
    fields = [
        {f.name: f for f in dataclasses.fields(c)}["scan_impl"]
        for c in (
            lm_configs.LMConfig,
            rrl_configs.RRLConfig,
            jsb_configs.JSBConfig,
            jsb_configs.TrialConfig,
        )
    ]
    metas = [(f.default, dict(f.metadata)) for f in fields]
    assert all(m == metas[0] for m in metas)
    default, meta = metas[0]
    assert default == "auto" and meta["resumable"]
    assert meta["choices"] == ("auto", "reference", "fused", "pallas") == scan.CHOICES
    assert set(meta["choices"]) == {str(i) for i in ScanImpl}


def test_a_workdir_recorded_with_the_old_values_resumes():
    for value in ("auto", "fused", "reference"):
        old = lm_configs.LMConfig(scan_impl=value).to_dict()
        assert lm_configs.LMConfig(scan_impl="reference").conflicts(old) == []
        assert rrl_configs.RRLConfig.from_dict({"scan_impl": value}).scan_impl == value


# ------------------------------------------------------------------------- the tasks


def has_fused_scan(f, *args):
    """Whether the jaxpr of ``f(*args)`` holds a custom VJP (the fused scans' backward)."""
    return "custom_vjp_call" in str(jax.make_jaxpr(f)(*args))


def assert_same_loss_and_gradients(loss_of, models, params):
    """The two models (fused, reference) give the same loss and gradient, and only the
    first runs a fused scan."""
    fused, ref = models
    assert has_fused_scan(functools.partial(loss_of, fused), params)
    assert not has_fused_scan(functools.partial(loss_of, ref), params)
    (v_f, g_f), (v_r, g_r) = (
        jax.value_and_grad(functools.partial(loss_of, m))(params) for m in models
    )
    np.testing.assert_allclose(v_f, v_r, rtol=1e-5)
    assert_trees_close(g_f, g_r, rtol=1e-4, atol=1e-6)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(g_r))


# A gated cell and a Parallel of two; every cell's fused scan: the grid above.
@pytest.mark.parametrize("cell", ["lstm", pytest.param("hrl", marks=pytest.mark.slow)])
def test_a_gated_language_model_runs_the_fused_scan_with_the_references_numbers(cell):
    """The LM task (``LMConfig.model``, ``window_loss`` with all four dropout sites and
    weight decay) with --cell=lstm under 'fused' (not possible before the dispatcher)
    and 'reference': the same loss and gradients."""
    rng = np.random.default_rng(0)
    rows = jnp.asarray(rng.integers(0, 13, (3, 40)), jnp.int32)
    cfg = lm_configs.LMConfig(
        cell=cell,
        hidden_size=8,
        batch_size=3,
        num_steps=9,
        drop_x=0.1,
        drop_i=0.2,
        drop_h=0.2,
        drop_o=0.2,
    )
    models = [cfg.replace(scan_impl=impl).model(13) for impl in ("fused", "reference")]
    assert [m.resolved_scan(3) for m in models] == [ScanImpl.FUSED, ScanImpl.REFERENCE]
    assert cfg.model(13).resolved_scan(3) is ScanImpl.FUSED  # auto
    params = random_params(models[1].init(jax.random.PRNGKey(0)), jax.random.PRNGKey(1), 0.3)
    carry = jax.tree.map(lambda a: a + 0.1, models[1].initial_carry(3))

    def loss_of(model, params):
        loss, (_, carry_out) = lm_training.window_loss(
            model, cfg, params, (rows, jnp.int32(1)), jax.random.PRNGKey(2), carry
        )
        return loss + sum(jnp.sum(c) for c in jax.tree.leaves(carry_out))

    assert_same_loss_and_gradients(loss_of, models, params)


@pytest.mark.slow
def test_an_rhn_language_model_runs_the_same_scan_as_before():
    """--cell=rhn: auto is the fused RHN scan, as it was, with and without --hsg."""
    for hsg in (False, True):
        model = lm_configs.LMConfig(hidden_size=8, depth=2, hsg=hsg).model(13)
        assert model.resolved_scan(20) is ScanImpl.FUSED
        tokens = jnp.zeros((2, 5), jnp.int32)

        def nll(params, model=model, tokens=tokens):
            return model.nll(params, model.initial_carry(2), tokens, tokens)[0]

        assert has_fused_scan(nll, model.init(jax.random.PRNGKey(0)))


# The RHN's fused scan (its final carry read from the outputs) and a gated one (outputs=False);
# HSG(RHN) reads as the RHN (its scan: the grid and the final-output test above).
@pytest.mark.parametrize("name", ["rhn", pytest.param("sc_lstm_p", marks=pytest.mark.slow)])
def test_an_rhn_classifier_runs_the_fused_scan_with_the_references_numbers(name):
    """The RRL task's model (``RRLConfig.classifier``: embedding, input and output
    dropout, padded rows with an empty one) with --model=rhn under 'fused' (not possible
    before the dispatcher) and 'reference': the same loss and gradients."""
    cfg = rrl_configs.RRLConfig(
        model=name, hidden_size=6, embed_size=4, drop=0.3, input_drop=0.2, rrn_depth=2, skip=2
    )
    models = [
        cfg.replace(scan_impl=impl).classifier(3, vocab_size=11) for impl in ("fused", "reference")
    ]
    assert cfg.classifier(3, vocab_size=11).resolved_scan(B) is ScanImpl.FUSED  # auto
    params = random_params(models[1].init(jax.random.PRNGKey(0)), jax.random.PRNGKey(1), 0.3)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 11, (B, T)), jnp.int32)
    lengths, labels = jnp.asarray(LENGTHS), jnp.asarray([0, 1, 2, 1])

    def loss_of(model, params):
        logits = model.logits(params, tokens, lengths, jax.random.PRNGKey(3))
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    assert_same_loss_and_gradients(loss_of, models, params)


@pytest.mark.parametrize("arch", ["rhn"])  # the gated cells' scans in a model: the LM above
def test_the_jsb_model_runs_the_fused_scan_with_the_references_numbers(arch):
    """The JSB study's model (``study_model``) on a padded batch of piano rolls: the same
    NLL and gradients under 'fused' and 'reference'."""
    models = [jsb_configs.study_model(arch, 6, 2, scan_impl=i) for i in ("fused", "reference")]
    params = random_params(models[1].init(jax.random.PRNGKey(0)), jax.random.PRNGKey(1), 0.3)
    rng = np.random.default_rng(0)
    x = jnp.asarray((rng.uniform(size=(T, B, 88)) < 0.2).astype(np.float32))
    mask = jnp.asarray(np.arange(T)[:, None] < LENGTHS[None, :], jnp.float32)

    def loss_of(model, params):
        total, count = polyphonic.nll_sums(model, params, x, mask)
        return total / count

    assert_same_loss_and_gradients(loss_of, models, params)


def test_a_jsb_trial_trains_the_model_of_its_scan_impl(monkeypatch):
    from rhnzoo.studies import jsb as jsb_study

    monkeypatch.setattr(polyphonic, "train_and_evaluate", lambda *args, model, **kwargs: model)
    for impl in ("fused", "reference", "auto"):
        trial = jsb_configs.TrialConfig(arch="gru", hidden=4, scan_impl=impl)
        model = jsb_study.run_trial(trial, {})
        assert model.scan_impl == impl and model.cell == jsb_configs.study_model("gru", 4, 1).cell


def test_a_jsb_study_refuses_a_scan_an_architecture_lacks_in_one_line():
    with pytest.raises(ValueError) as e:
        jsb_configs.JSBConfig(archs=("rhn", "dtrnn"), scan_impl="fused")
    assert "cannot run DTRNN" in str(e.value) and "\n" not in str(e.value)
    assert jsb_configs.JSBConfig(archs=("rhn", "lstm"), scan_impl="fused").scan_impl == "fused"


def test_the_nnx_module_takes_the_scan_too():
    from flax import nnx

    from rhnzoo.nnx import Recurrent

    rnn = Recurrent(cells.make("hsg_rhn", N, depth=2), M, rngs=nnx.Rngs(0))
    xs = normal(jax.random.PRNGKey(1), (T, B, M))

    def loss_of(impl, module):
        carry, ys = module(xs, scan_impl=impl)
        return jnp.sum(jnp.sin(ys)) + jnp.sum(carry**2)

    (v_f, g_f), (v_r, g_r) = (
        nnx.value_and_grad(functools.partial(loss_of, i))(rnn) for i in ("fused", "reference")
    )
    np.testing.assert_allclose(v_f, v_r, rtol=1e-5)
    assert_trees_close(nnx.to_pure_dict(g_f), nnx.to_pure_dict(g_r), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="cannot run DTRNN"):
        Recurrent(cells.DTRNN(N, 2), M, rngs=nnx.Rngs(0))(xs, scan_impl="fused")


@pytest.mark.slow  # the fast tier: the gated LM above (drop_h 0.2, fused == reference)
def test_the_lm_dropout_mask_reaches_the_fused_gated_scan():
    """An LSTM LM's recurrent dropout (``masks['h']``) changes the fused scan's output as
    it changes the reference scan's (the mask is passed, not dropped)."""
    model = lm.language_model("lstm", 11, N, scan_impl="fused")
    params = random_params(model.init(jax.random.PRNGKey(0)), jax.random.PRNGKey(3))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 11, (B, T)), jnp.int32)
    masks = dropout.lm_masks(
        jax.random.PRNGKey(1), tokens, 11, N, N, dropout.Rates(0.0, 0.0, 0.5, 0.0)
    )
    ref = dataclasses.replace(model, scan_impl="reference")
    for m in (None, masks):
        got = model.hidden(params, model.initial_carry(B), tokens, m)[1]
        want = ref.hidden(params, model.initial_carry(B), tokens, m)[1]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    plain = model.hidden(params, model.initial_carry(B), tokens, None)[1]
    assert float(jnp.abs(plain - got).max()) > 0.1 * float(jnp.abs(plain).max())


# ------------------------------------------------------- one scan contract (issue 70, item 2)


def test_every_backend_has_one_unroll_signature():
    """The six backends (the reference scan, the two fused scans, the three kernel
    families), in ``auto``'s order of preference, share one ``unroll`` signature and one
    options record (whose default is the same record everywhere)."""
    from rhnzoo.cells import gated_fused, kernels, rhn_fused, scan_options

    assert scan.BACKENDS == (*kernels.BACKENDS, gated_fused, rhn_fused, scan.REFERENCE)
    # names, kinds and defaults (the annotations say each backend's carry)
    shape = lambda f: [
        (p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()
    ]
    want = shape(scan.REFERENCE.unroll)
    assert [p[0] for p in want] == "cell params carry xs mask opts lengths resets".split()
    assert (
        want[5][2] == scan_options.DEFAULT_OPTIONS and want[6][1] is inspect.Parameter.KEYWORD_ONLY
    )
    for backend in scan.BACKENDS:
        assert shape(backend.unroll) == want, backend
        assert backend.IMPL in scan.CHOICES and isinstance(backend.REMAT, bool)


@pytest.mark.parametrize("name", ["lstm", "hrl", "rhn", "dtrnn"])
def test_outputs_all_last_and_none_agree_across_backends(name):
    """``outputs`` "all", "last" and "none" from every backend that runs the cell (bar the
    kernels: tests/test_*_pallas.py), padded, in float64: the same final carry, "last" the
    rows' outputs at their last real steps (zeros for the empty row) gathered from "all",
    "none" None."""
    cell = build(name)
    with jax.enable_x64(True):
        params, carry, xs, mask, _ = setup(cell, seed=3)
        run = lambda impl, outputs: scan.unroll(
            cell, params, carry, xs, mask, impl=impl, lengths=LENGTHS, outputs=outputs
        )
        ref_carry, ys = run("reference", "all")
        idx = (np.maximum(LENGTHS - 1, 0), np.arange(B))
        last = np.where((LENGTHS > 0)[:, None], np.asarray(ys)[idx], 0.0)
        for impl in [i for i in scan.implementations(cell) if i is not ScanImpl.PALLAS]:
            for outputs in ("all", "last", "none"):
                got_carry, got = run(impl, outputs)
                assert_trees_close(got_carry, ref_carry, **FLOAT64)
                if outputs == "all":
                    assert_trees_close(got, ys, **FLOAT64)
                elif outputs == "last":
                    assert got.shape == (B, N)
                    np.testing.assert_allclose(got, last, **FLOAT64)
                else:
                    assert got is None


def test_the_classifier_makes_one_scan_call():
    """``SequenceClassifier.features`` runs its layer by one ``scan.unroll`` call with
    ``outputs="last"``, whichever scan runs (no branch on it), a Bidirectional layer too."""
    import ast
    import textwrap

    source = textwrap.dedent(inspect.getsource(SequenceClassifier.features))
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("unroll")
    ]
    assert [ast.unparse(c.func) for c in calls] == ["scan.unroll"]
    assert "ScanImpl" not in source and "resolved_scan" not in source
    keywords = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert keywords["outputs"] == "'last'"
