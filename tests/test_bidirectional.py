"""``rhnzoo.cells.Bidirectional`` and ``reverse_within`` (issue 71), in float64, values
and every gradient (parameters of both directions, both initial carries, inputs):

* the LSTM and the reset-after GRU against a NumPy transcription of PyTorch's documented
  packed bidirectional semantics (``nn.LSTM(bidirectional=True)`` / ``nn.GRU`` on a
  ``PackedSequence``), weights through ``rhnzoo.cells.torch_interop``; the gradients by
  JAX through a ``jax.numpy`` run of the same transcription;
* every other registered cell against running each direction by hand on each row's own
  prefix (the backward one on the prefix reversed);

rows of length 0 and 1 included, under each scan that has the cell (pallas aside)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.cells import scan, torch_interop
from rhnzoo.cells.scan import ScanImpl

T, B, M, N = 6, 5, 3, 4
LENGTHS = np.array([6, 0, 1, 4, 2], np.int32)  # full, empty, one step, padded, padded
SETTINGS = {"depth": 2, "init_scale": 0.1, "init_bias": -1.0, "skip": 2}
FLOAT64 = {"rtol": 1e-10, "atol": 1e-12}


def build(name):
    return cells.make(name, N, **cells.applicable(name, SETTINGS))


def assert_trees_close(got, want, **tol):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if a.dtype == jax.dtypes.float0:  # the SC-LSTM step counter's "gradient"
            continue
        assert a.shape == b.shape, (a.shape, b.shape)
        np.testing.assert_allclose(a, b, **tol)


def random_like(tree, rng, scale=0.5):
    """float64 normal leaves (an integer leaf, the SC-LSTM's step counter: 0..4)."""

    def leaf(a):
        if jnp.issubdtype(a.dtype, jnp.integer):
            return jnp.asarray(rng.integers(0, 5, a.shape), a.dtype)
        return jnp.asarray(rng.normal(size=a.shape) * scale)

    return jax.tree.map(leaf, tree)


def loss(run, target, params, carry, xs):
    """Depends on every output and every float leaf of both final carries."""
    carry, ys = run(params, carry, xs)
    floats = [c for c in jax.tree.leaves(carry) if jnp.issubdtype(c.dtype, jnp.floating)]
    return jnp.sum(jnp.sin(ys) * target) + sum(jnp.sum(jnp.cos(c) * c) for c in floats)


def values_and_grads(run, target, params, carry, xs, *, jit=True):
    grad = jax.grad(loss, argnums=(2, 3, 4), allow_int=True)
    if jit:
        return jax.jit(run)(params, carry, xs), jax.jit(grad, static_argnums=0)(
            run, target, params, carry, xs
        )
    return run(params, carry, xs), grad(run, target, params, carry, xs)


# ------------------------------------------------------------------ reverse_within


def test_reverse_within_reverses_each_row_inside_its_length():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(T, B, 2)).astype(np.float32)
    got = np.asarray(cells.reverse_within(jnp.asarray(xs), LENGTHS))
    for b, length in enumerate(LENGTHS):
        np.testing.assert_array_equal(got[:length, b], xs[:length, b][::-1])
        np.testing.assert_array_equal(got[length:, b], xs[length:, b])  # padding in place
    again = cells.reverse_within(jnp.asarray(got), LENGTHS)
    np.testing.assert_array_equal(again, xs)  # its own inverse
    np.testing.assert_array_equal(cells.reverse_within(jnp.asarray(xs)), xs[::-1])
    ints = np.arange(T * B).reshape(T, B)  # [T, B] of any dtype
    np.testing.assert_array_equal(
        cells.reverse_within(jnp.asarray(ints), LENGTHS)[:, 3],
        [3 * B + 3 - 5 * t for t in range(4)] + [23, 28],
    )


def test_reverse_within_gradient_is_the_reversal():
    w = np.random.default_rng(1).normal(size=(T, B))
    with jax.enable_x64(True):
        g = jax.grad(lambda x: jnp.sum(cells.reverse_within(x, LENGTHS) * w))(jnp.zeros((T, B)))
        np.testing.assert_array_equal(g, cells.reverse_within(jnp.asarray(w), LENGTHS))


@pytest.mark.parametrize(
    "lengths,match",
    [
        (np.array([1, 2, 3, 4, 7]), r"lengths must lie in \[0, T\] = \[0, 6\], got min 1 max 7"),
        (np.array([1, -1, 3, 4, 5]), r"lengths must lie in \[0, T\] = \[0, 6\], got min -1"),
        (np.array([1, 2, 3]), r"lengths must be a \[B\] = \[5\] int array"),
        (np.full(B, 2.0), r"lengths must be a \[B\] = \[5\] int array .* dtype float"),
    ],
    ids=["above-T", "negative", "short", "float"],
)
def test_bad_lengths_are_one_line(lengths, match):
    xs = jnp.zeros((T, B, M))
    bi = cells.Bidirectional(cells.GRU(N))
    params = bi.init(jax.random.PRNGKey(0), M)
    for call in (
        lambda: cells.reverse_within(xs, lengths),
        lambda: bi.unroll(params, bi.initial_carry(B), xs, lengths=lengths),
    ):
        with pytest.raises(ValueError, match=match) as e:
            call()
        assert "\n" not in str(e.value)


def test_bad_settings_are_one_line():
    with pytest.raises(ValueError, match="merge must be one of concat, sum, got 'mean'"):
        cells.Bidirectional(cells.LSTM(N), merge="mean")
    with pytest.raises(
        ValueError, match="merge='sum' needs equal hidden sizes, got forward 4 and backward 3"
    ):
        cells.Bidirectional(cells.LSTM(N), cells.GRU(3), merge="sum")
    bi = cells.Bidirectional(cells.LSTM(N), cells.GRU(3))
    assert (
        bi.hidden_size == N + 3 and cells.Bidirectional(cells.RHN(N), merge="sum").hidden_size == N
    )
    params, xs = bi.init(jax.random.PRNGKey(0), M), jnp.zeros((T, B, M))
    with pytest.raises(ValueError, match="mask must be None or"):
        bi.unroll(params, bi.initial_carry(B), xs, jnp.ones((B, N)))
    with pytest.raises(ValueError, match="no resets"):
        bi.unroll(params, bi.initial_carry(B), xs, resets=np.zeros((T, B), bool))


# ------------------------------------------------- PyTorch's packed semantics, in NumPy


def _sigmoid(xp, a):
    return 1 / (1 + xp.exp(-a))


def _torch_lstm_step(xp, sd, sfx, x, state):
    """``torch.nn.LSTM``'s documented step (gates i | f | g | o, two biases)."""
    h, c = state
    gates = x @ sd["weight_ih_l0" + sfx].T + sd["bias_ih_l0" + sfx]
    gates = gates + h @ sd["weight_hh_l0" + sfx].T + sd["bias_hh_l0" + sfx]
    i, f, g, o = (gates[k * N : (k + 1) * N] for k in range(4))
    c = _sigmoid(xp, f) * c + _sigmoid(xp, i) * xp.tanh(g)
    return _sigmoid(xp, o) * xp.tanh(c), c


def _torch_gru_step(xp, sd, sfx, x, state):
    """``torch.nn.GRU``'s documented step (gates r | z | n; n = tanh(W_in x + b_in +
    r (W_hn h + b_hn)), h' = (1 - z) n + z h)."""
    (h,) = state
    gi = x @ sd["weight_ih_l0" + sfx].T + sd["bias_ih_l0" + sfx]
    gh = h @ sd["weight_hh_l0" + sfx].T + sd["bias_hh_l0" + sfx]
    r = _sigmoid(xp, gi[:N] + gh[:N])
    z = _sigmoid(xp, gi[N : 2 * N] + gh[N : 2 * N])
    n = xp.tanh(gi[2 * N :] + r * gh[2 * N :])
    return ((1 - z) * n + z * h,)


def packed_bidirectional(kind, sd, xs, lengths, h0, c0=None, xp=np):
    """``nn.LSTM`` / ``nn.GRU`` (``bidirectional=True``, one layer) on
    ``pack_padded_sequence(xs, lengths, enforce_sorted=False)`` with initial state
    ``h0 [2, B, n]`` (``c0`` for the LSTM), unpacked with ``pad_packed_sequence(...,
    total_length=T)``, as PyTorch documents it: each row's forward direction reads its
    real steps 0..L-1 from ``h0[0]``, the reverse direction starts at the row's last real
    element from ``h0[1]`` and reads L-1..0; ``output [T, B, 2n]`` is
    (forward h_t | reverse h_t), zero at padded positions; ``h_n [2, B, n]`` holds the
    forward state after step L-1 and the reverse state after step 0 (``c_n`` likewise).
    Row by row, step by step, with ``xp`` = NumPy or ``jax.numpy``. (PyTorch refuses
    L = 0; here such a row outputs zeros and keeps its initial state.)"""
    step = _torch_lstm_step if kind == "lstm" else _torch_gru_step
    outputs, finals = [], []
    for b, L in enumerate(lengths):
        row = []
        for d, (sfx, order) in enumerate((("", range(L)), ("_reverse", range(L - 1, -1, -1)))):
            state = (h0[d, b],) if c0 is None else (h0[d, b], c0[d, b])
            hs = {}
            for t in order:
                state = step(xp, sd, sfx, xs[t, b], state)
                hs[t] = state[0]
            row.append([hs.get(t, xp.zeros(N)) for t in range(T)])
            finals.append(state)
        outputs.append(xp.stack([xp.concatenate([f, r]) for f, r in zip(*row)]))
    output = xp.stack(outputs, axis=1)  # [T, B, 2n]
    h_n = xp.stack([xp.stack([finals[2 * b + d][0] for b in range(B)]) for d in range(2)])
    if c0 is None:
        return output, h_n
    c_n = xp.stack([xp.stack([finals[2 * b + d][1] for b in range(B)]) for d in range(2)])
    return output, h_n, c_n


def _torch_keys(sd, sfx):
    return {k + sfx: v for k, v in sd.items()}


def to_torch(kind, params):
    """A ``bidirectional=True`` state dict from ``Bidirectional``'s parameters with
    ``jax.numpy`` (differentiable): ``torch_interop``'s conventions, checked equal to it
    in :func:`test_the_jnp_conversion_is_torch_interops`."""

    def one(p):
        if kind == "lstm":  # rhnzoo's i | f | o | c̃ -> PyTorch's i | f | g | o
            blocks = (
                lambda a: jnp.concatenate(  # noqa: E731
                    [a[..., k * N : (k + 1) * N] for k in (0, 1, 3, 2)], axis=-1
                )
            )
            return {
                "weight_ih_l0": blocks(p["W"]).T,
                "weight_hh_l0": blocks(p["U"]).T,
                "bias_ih_l0": blocks(p["b"]),
                "bias_hh_l0": jnp.zeros_like(p["b"]),
            }
        zeros = jnp.zeros(2 * N, p["b_hn"].dtype)
        return {
            "weight_ih_l0": p["W"].T,
            "weight_hh_l0": p["U"].T,
            "bias_ih_l0": p["b"],
            "bias_hh_l0": jnp.concatenate([zeros, p["b_hn"]]),
        }

    return {
        **_torch_keys(one(params["forward"]), ""),
        **_torch_keys(one(params["backward"]), "_reverse"),
    }


TORCH_CELLS = {"lstm": cells.LSTM(N), "gru": cells.GRU(N, reset_after=True)}


def test_the_jnp_conversion_is_torch_interops():
    rng = np.random.default_rng(2)
    with jax.enable_x64(True):
        for kind, cell in TORCH_CELLS.items():
            bi = cells.Bidirectional(cell)
            params = random_like(bi.init(jax.random.PRNGKey(0), M), rng)
            convert = torch_interop.lstm_to_torch if kind == "lstm" else torch_interop.gru_to_torch
            want = {
                **_torch_keys(convert(params["forward"]), ""),
                **_torch_keys(convert(params["backward"]), "_reverse"),
            }
            got = to_torch(kind, params)
            assert sorted(got) == sorted(want)
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])


def _torch_case(kind, rng):
    """A random PyTorch-layout state dict (both biases nonzero), the Bidirectional
    parameters ``torch_interop`` reads from it, initial states, inputs, a target."""
    gates = 4 if kind == "lstm" else 3
    sd = {}
    for sfx in ("", "_reverse"):
        sd["weight_ih_l0" + sfx] = rng.normal(size=(gates * N, M)) * 0.5
        sd["weight_hh_l0" + sfx] = rng.normal(size=(gates * N, N)) * 0.5
        sd["bias_ih_l0" + sfx] = rng.normal(size=gates * N) * 0.5
        sd["bias_hh_l0" + sfx] = rng.normal(size=gates * N) * 0.5
    read = torch_interop.lstm_from_torch if kind == "lstm" else torch_interop.gru_from_torch
    forward = {k: v for k, v in sd.items() if not k.endswith("_reverse")}
    backward = {k.removesuffix("_reverse"): v for k, v in sd.items() if k.endswith("_reverse")}
    params = {"forward": read(forward), "backward": read(backward)}
    h0 = rng.normal(size=(2, B, N)) * 0.5
    c0 = rng.normal(size=(2, B, N)) * 0.5 if kind == "lstm" else None
    xs = rng.normal(size=(T, B, M))
    target = rng.normal(size=(T, B, 2 * N))
    return sd, jax.tree.map(jnp.asarray, params), h0, c0, xs, target


def _carry(kind, h0, c0, d):
    if kind == "lstm":
        return cells.LSTMState(jnp.asarray(h0[d]), jnp.asarray(c0[d]))
    return jnp.asarray(h0[d])


@pytest.mark.parametrize(
    "kind,impl",
    [
        pytest.param(k, i, marks=() if i == "fused" else pytest.mark.slow, id=f"{k}-{i}")
        for k in TORCH_CELLS
        for i in ("reference", "fused")
    ],
)
def test_lstm_and_gru_are_pytorchs_packed_bidirectional(kind, impl):
    """float64: outputs (zero at padding) and h_n (c_n) equal the transcription of
    PyTorch's packed bidirectional layer on a state dict with both biases; every
    gradient (both directions' parameters, h_0 / c_0, inputs) equals JAX's through the
    transcription run in ``jax.numpy``."""
    bi = cells.Bidirectional(TORCH_CELLS[kind])
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        sd, params, h0, c0, xs, target = _torch_case(kind, rng)
        run = functools.partial(bi.unroll, impl=impl, lengths=LENGTHS)
        carry = (_carry(kind, h0, c0, 0), _carry(kind, h0, c0, 1))
        (carry_f, carry_b), ys = jax.jit(run)(params, carry, jnp.asarray(xs))
        want = packed_bidirectional(kind, sd, xs, LENGTHS, h0, c0)
        np.testing.assert_allclose(ys, want[0], **FLOAT64)
        got_h = np.stack([jax.tree.leaves(carry_f)[0], jax.tree.leaves(carry_b)[0]])
        np.testing.assert_allclose(got_h, want[1], **FLOAT64)
        if kind == "lstm":
            np.testing.assert_allclose(np.stack([carry_f.c, carry_b.c]), want[2], **FLOAT64)

        def torch_run(params, carry, xs):  # the same transcription, in jax.numpy
            hs = jnp.stack([jax.tree.leaves(c)[0] for c in carry])
            cs = jnp.stack([c.c for c in carry]) if kind == "lstm" else None
            out = packed_bidirectional(kind, to_torch(kind, params), xs, LENGTHS, hs, cs, jnp)
            finals = tuple(
                cells.LSTMState(out[1][d], out[2][d]) if kind == "lstm" else out[1][d]
                for d in range(2)
            )
            return finals, out[0]

        target, xs = jnp.asarray(target), jnp.asarray(xs)
        _, g_got = values_and_grads(run, target, params, carry, xs)
        _, g_want = values_and_grads(torch_run, target, params, carry, xs, jit=False)
        assert_trees_close(g_got, g_want, **FLOAT64)
        assert float(jnp.abs(g_got[0]["backward"]["U"]).max()) > 0


# --------------------------------------------------- every cell, by hand, row by row


def by_hand(bi, mask, params, carry, xs):
    """Each row's forward cell over its prefix xs[:L] and backward cell over the prefix
    reversed, each from the row's initial carry, by the reference scan one row at a
    time; outputs zero past L, a row with L = 0 keeps its initial carries."""
    rows, finals = [], ([], [])
    for b, L in enumerate(LENGTHS):
        row = lambda tree: jax.tree.map(lambda a: a[b : b + 1], tree)  # noqa: E731
        outs = []
        for d, (cell, p, sign) in enumerate(
            ((bi.forward, params["forward"], 1), (bi.backward, params["backward"], -1))
        ):
            c = row(carry[d])
            y = jnp.zeros((0, 1, cell.hidden_size))
            if L:
                c, y = cells.unroll(cell, p, c, xs[:L, b : b + 1][::sign], row(mask[d]))
                y = y[::sign]
            outs.append(jnp.concatenate([y, jnp.zeros((T - L, 1, cell.hidden_size))]))
            finals[d].append(c)
        rows.append(jnp.concatenate(outs, axis=-1) if bi.merge == "concat" else sum(outs))
    cat = lambda cs: jax.tree.map(lambda *a: jnp.concatenate(a), *cs)  # noqa: E731
    return (cat(finals[0]), cat(finals[1])), jnp.concatenate(rows, axis=1)


# Each kind of scan once in the fast tier (the reference scan: a DT-RNN in HSG, an
# SC-LSTM's step counter; the gated fused scan: a Parallel; the RHN's); 'sum' once.
FAST = {("hsg_dtrnn", "reference"), ("sc_lstm_p", "reference"), ("hrl", "fused"), ("rhn", "fused")}


@pytest.mark.parametrize(
    "name,impl",
    [
        pytest.param(
            n, str(i), marks=() if (n, str(i)) in FAST else pytest.mark.slow, id=f"{n}-{i}"
        )
        for n in cells.ALL_NAMES
        for i in scan.implementations(build(n))
        if i is not ScanImpl.PALLAS
    ],
)
def test_every_cell_matches_each_row_run_by_hand(name, impl):
    """float64, with both recurrent dropout masks: outputs, both final carries and every
    gradient equal :func:`by_hand`'s (rows of length 6, 0, 1, 4, 2)."""
    cell = build(name)
    merge = "sum" if name == "rhn" else "concat"
    bi = cells.Bidirectional(cell, merge=merge)
    rng = np.random.default_rng(4)
    with jax.enable_x64(True):
        params = random_like(bi.init(jax.random.PRNGKey(0), M), rng)
        carry = random_like(bi.initial_carry(B, jnp.float64), rng)
        xs = jnp.asarray(rng.normal(size=(T, B, M)))
        mask = tuple(jnp.asarray((rng.random((B, N)) < 0.8) / 0.8) for _ in range(2))
        target = jnp.asarray(rng.normal(size=(T, B, bi.hidden_size)))
        run = functools.partial(bi.unroll, mask=mask, impl=impl, lengths=LENGTHS)
        got = values_and_grads(run, target, params, carry, xs)
        want = values_and_grads(functools.partial(by_hand, bi, mask), target, params, carry, xs)
        assert_trees_close(got, want, **FLOAT64)
        ys = got[0][1]
        assert (
            float(jnp.abs(ys[LENGTHS[3] :, 3]).max()) == 0.0
            and float(jnp.abs(ys[:, 1]).max()) == 0.0
        )


def test_without_lengths_and_without_outputs():
    """No ``lengths``: the backward cell reads the whole batch reversed;
    ``outputs=False``: the same final carries, no outputs."""
    bi = cells.Bidirectional(cells.GRU(N), cells.LSTM(N))
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        params = random_like(bi.init(jax.random.PRNGKey(0), M), rng)
        carry = random_like(bi.initial_carry(B, jnp.float64), rng)
        xs = jnp.asarray(rng.normal(size=(T, B, M)))
        (cf, cb), ys = bi.unroll(params, carry, xs, impl="fused")
        want_f = cells.unroll(bi.forward, params["forward"], carry[0], xs)
        want_b = cells.unroll(bi.backward, params["backward"], carry[1], xs[::-1])
        assert_trees_close((cf, cb), (want_f[0], want_b[0]), **FLOAT64)
        np.testing.assert_allclose(ys, jnp.concatenate([want_f[1], want_b[1][::-1]], -1), **FLOAT64)
        carries, none = bi.unroll(params, carry, xs, impl="fused", lengths=LENGTHS, outputs=False)
        assert none is None
        full = bi.unroll(params, carry, xs, impl="fused", lengths=LENGTHS)[0]
        assert_trees_close(carries, full, **FLOAT64)


def test_traced_lengths_under_jit():
    """``lengths`` an argument of a jitted function (checked by shape only): the same as
    concrete lengths."""
    bi = cells.Bidirectional(cells.GRU(N), merge="sum")
    params = bi.init(jax.random.PRNGKey(0), M)
    xs = jnp.asarray(np.random.default_rng(6).normal(size=(T, B, M)), jnp.float32)
    run = jax.jit(lambda p, x, lengths: bi.unroll(p, bi.initial_carry(B), x, lengths=lengths))
    got = run(params, xs, jnp.asarray(LENGTHS))
    want = bi.unroll(params, bi.initial_carry(B), xs, lengths=LENGTHS)
    assert_trees_close(got, want, rtol=1e-6, atol=1e-6)
