"""rhnzoo.polyphonic: next-step NLL, the clipped-SGD step, training on piano rolls."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.training import polyphonic


def random_rolls(rng, lengths, density=0.08):
    return [(rng.uniform(size=(t, 88)) < density).astype(np.float32) for t in lengths]


def small_model(arch="dtrnn"):
    cell = {"dtrnn": cells.DTRNN(6, 2), "rhn": cells.RHN(5, 2), "dtsrnn": cells.DTSRNN(5, 3)}
    return polyphonic.PianoRollModel(cell[arch])


def test_zero_output_layer_gives_88_log_2_per_step():
    """Logits 0 -> p = 1/2 for every note -> NLL per step = 88 log 2 (hand value 60.9970)."""
    model = small_model()
    params = model.init(jax.random.PRNGKey(0))
    params["W_out"] = jnp.zeros_like(params["W_out"])
    seqs = random_rolls(np.random.default_rng(0), [4, 7, 2])
    assert polyphonic.evaluate(model, params, seqs) == pytest.approx(88 * math.log(2), rel=1e-6)


def numpy_rhn_logits(p, frames):
    """Coupled RHN (Zilly et al., eqs. 6-9) + output layer in NumPy: frames [T, 88] -> [T, 88]."""
    W, R, b = (np.asarray(p["cell"][k], np.float64) for k in ("W", "R", "b"))
    n = R.shape[1]
    s, out = np.zeros(n), []
    for x in frames:
        for l in range(R.shape[0]):
            pre = s @ R[l] + b[l] + (x @ W if l == 0 else 0.0)
            t = 1.0 / (1.0 + np.exp(-pre[n:]))
            s = np.tanh(pre[:n]) * t + s * (1.0 - t)
        out.append(s @ np.asarray(p["W_out"], np.float64) + np.asarray(p["b_out"], np.float64))
    return np.array(out).reshape(len(frames), 88)


def test_evaluate_matches_per_sequence_numpy_bce():
    """Padded, batched evaluation == Σ over sequences (unpadded, NumPy RHN) of
    -Σ_notes [y log σ(z) + (1 - y) log(1 - σ(z))] for predictions t -> t+1, / Σ (T_i - 1)."""
    model = small_model("rhn")
    params = jax.tree.map(
        lambda a: a + 0.3 * jax.random.normal(jax.random.PRNGKey(1), a.shape),
        model.init(jax.random.PRNGKey(0)),
    )
    lengths = [5, 1, 9, 3]
    seqs = random_rolls(np.random.default_rng(1), lengths, density=0.3)
    total, count = 0.0, 0
    for s in seqs:
        p = 1.0 / (1.0 + np.exp(-numpy_rhn_logits(params, s[:-1].astype(np.float64))))
        y = s[1:].astype(np.float64)
        total += -np.sum(y * np.log(p) + (1 - y) * np.log(1 - p))
        count += len(s) - 1
    assert count == sum(lengths) - len(lengths)
    expected = total / count
    for kwargs in ({}, {"batch_size": 3, "length": 12}):
        got = polyphonic.evaluate(model, params, seqs, **kwargs)
        assert got == pytest.approx(expected, rel=2e-5)


def test_num_params_counts_cell_and_output_layer():
    m = polyphonic.PianoRollModel(cells.RHN(10, 3))
    # RHN: W [88, 20], R [3, 10, 20], b [3, 20]; output: W_out [10, 88], b_out [88].
    assert polyphonic.num_params(m) == 88 * 20 + 3 * 200 + 60 + 880 + 88
    m = polyphonic.PianoRollModel(cells.DTSRNN(7, 4))
    assert polyphonic.num_params(m) == 88 * 7 + 7 * 49 + 4 * 7 + 7 * 88 + 88


def test_train_step_is_clipped_heavy_ball_sgd():
    """Two steps against hand-written clip-then-momentum SGD: v <- μ v + clip(g), θ <- θ - η v."""
    model = small_model()
    seqs = random_rolls(np.random.default_rng(2), [6, 4, 8], density=0.3)
    x, mask = (jnp.asarray(a) for a in polyphonic.pad_batch(seqs))
    lr, mu, clip = 0.3, 0.9, 0.5
    params = model.init(jax.random.PRNGKey(3))
    theta = jax.tree.map(np.asarray, params)

    def loss(p):
        t, c = polyphonic.nll_sums(model, p, x, mask)
        return t / c

    velocity = jax.tree.map(np.zeros_like, theta)
    expected_losses = []
    for _ in range(2):
        value, g = jax.value_and_grad(loss)(theta)
        expected_losses.append(float(value))
        norm = math.sqrt(sum(float(np.sum(np.square(a))) for a in jax.tree.leaves(g)))
        assert norm > clip  # so the clipping is exercised
        g = jax.tree.map(lambda a, s=clip / norm: np.asarray(a) * s, g)
        velocity = jax.tree.map(lambda v, a: mu * v + a, velocity, g)
        theta = jax.tree.map(lambda p, v: p - lr * v, theta, velocity)

    opt_state = polyphonic.sgd(lr, mu, clip).init(params)
    for i in range(2):
        params, opt_state, got = polyphonic.train_step(model, params, opt_state, x, mask)
        assert float(got) == pytest.approx(expected_losses[i], rel=1e-5)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(theta)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def fixture_data(seed=0):
    rng = np.random.default_rng(seed)

    # A learnable rule: frame t+1 repeats frame t with notes shifted up by one semitone.
    def song(t):
        roll = np.zeros((t, 88), np.float32)
        roll[0, rng.choice(np.arange(30, 50), 3, replace=False)] = 1
        for i in range(1, t):
            roll[i, 1:] = roll[i - 1, :-1]
        return roll

    return {split: [song(int(rng.integers(6, 14))) for _ in range(k)]
            for split, k in (("train", 24), ("valid", 6), ("test", 6))}  # fmt: skip


def test_training_lowers_the_nll_and_reports_test_at_best_valid():
    data = fixture_data()
    model = small_model("dtsrnn")
    logs = []
    before = polyphonic.evaluate(model, model.init(jax.random.PRNGKey(5)), data["valid"])
    result = polyphonic.train(
        model, data, lr=1.0, momentum=0.9, max_grad_norm=5.0, batch_size=8, epochs=4,
        key=jax.random.PRNGKey(5), log=logs.append,
    )  # fmt: skip
    assert len(logs) == 4 and result.epochs_run == 4 and not result.diverged
    assert result.best_valid < before - 5.0
    best = result.history[result.best_epoch - 1]
    assert best["valid"] == result.best_valid == min(h["valid"] for h in result.history)
    assert math.isfinite(result.test_at_best)


def test_nan_parameters_are_reported_as_diverged():
    model = small_model()
    params = model.init(jax.random.PRNGKey(0))
    params["b_out"] = params["b_out"].at[0].set(jnp.nan)
    result = polyphonic.train(model, fixture_data(), lr=0.1, epochs=3, params=params)
    assert result.diverged and result.epochs_run == 1 and result.best_epoch == 0
    assert result.best_valid == math.inf and result.test_at_best == math.inf


def test_invalid_hyperparameters():
    model, data = small_model(), fixture_data()
    for bad in ({"lr": 0.0}, {"lr": 0.1, "momentum": 1.0}, {"lr": 0.1, "max_grad_norm": 0}):
        with pytest.raises(ValueError):
            polyphonic.train(model, data, **bad)
