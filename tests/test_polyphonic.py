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


# ------------------------------------------------------------------ configs and the study


def test_polyphonic_config_round_trip_and_one_line_errors():
    config = polyphonic.PolyphonicConfig(lr=0.3, momentum=0.9, max_steps=7)
    values = config.to_dict()
    assert values == {"lr": 0.3, "momentum": 0.9, "max_grad_norm": 10.0, "batch_size": 16,
                      "epochs": 10, "max_steps": 7, "matmul_precision": None}  # fmt: skip
    assert polyphonic.PolyphonicConfig.from_dict(values) == config
    with pytest.raises(ValueError, match="unknown PolyphonicConfig setting.*: dropout$"):
        polyphonic.PolyphonicConfig.from_dict({**values, "dropout": 0.1})
    for bad, message in [({"epochs": 0}, "epochs must be >= 1, got 0"),
                         ({"momentum": 1.0}, "need lr > 0, 0 <= momentum < 1"),
                         ({"batch_size": 0}, "batch_size must be >= 1, got 0")]:  # fmt: skip
        with pytest.raises(ValueError, match=message) as e:
            config.replace(**bad)
        assert "\n" not in str(e.value)


def test_jsb_config_checks_in_the_scripts_order_and_drops_repeats():
    JSB = polyphonic.JSBConfig
    config = JSB(archs=["rhn", "lstm", "rhn"], depths=[4, 1, 4])
    assert config.archs == ("rhn", "lstm") and config.depths == (4, 1)
    assert JSB.from_dict(config.to_dict()) == config
    cases = [
        ({"archs": ["x", "x"], "depths": ["y"]},
         r"--archs must be a non-empty subset of .*got \['x', 'x'\]"),
        ({"archs": []}, r"--archs .*got \[\]"),
        ({"depths": ("1", "x")}, r"--depths must be integers, got \['1', 'x'\]"),
        ({"trials": 0, "width": 0}, "width must be >= 1, got 0"),
        ({"trials": 0, "max_steps": 0}, "max_steps must be >= 1, got 0"),
        ({"trials": 0, "depths": (0,)}, "trials must be >= 1, got 0"),
        ({"depths": (1, -2)}, "depth must be >= 1, got -2"),
        ({"matmul_precision": "fast"}, "--matmul_precision: unknown matmul precision"),
    ]  # fmt: skip
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            JSB(**bad)
    assert JSB(matmul_precision="float32").settings() == {
        "width": 64, "epochs": 40, "batch_size": 16, "seed": 0, "max_steps": None,
        "matmul_precision": "highest"}  # fmt: skip


def test_jsb_presets_hold_the_papers_study():
    from rhnzoo.configs import jsb

    full = jsb.get_config()
    # Zilly et al. 2017, sec. 5.1 / Fig. 4: RHN vs DT-RNN vs DT(S)-RNN at depths 1, 2, 4, 6.
    assert full.archs == ("rhn", "dtrnn", "dtsrnn") and full.depths == (1, 2, 4, 6)
    assert (full.width, full.trials, full.epochs, full.batch_size) == (64, 20, 40, 16)
    cpu = jsb.get_config("cpu")
    assert (cpu.width, cpu.trials, cpu.epochs, cpu.batch_size) == (32, 10, 25, 16)
    assert cpu.depths == full.depths and cpu.archs == full.archs
    with pytest.raises(ValueError, match="^--preset must be one of cpu, got 'gpu'$"):
        jsb.get_config("gpu")


# A trial workdir written by the code before the configs (commit 0016358): study(...,
# archs rhn, dtrnn, depths 2, 2 trials, width 4, epochs 1, batch 8, seed 3, 'highest').
OLD_TRIAL_CONFIG = {
    "arch": "rhn", "batch_size": 8, "depth": 2, "epochs": 1, "hidden": 4,
    "init_bias": -2.267492239054105, "init_scale": 0.013773344750579892,
    "lr": 0.3185562740273419, "matmul_precision": "highest",
    "max_grad_norm": 14.599032390543904, "max_steps": None, "momentum": 0.0,
    "params": 1224, "seed": 3, "trial": 0, "width": 4,
}  # fmt: skip
OLD_STUDY = polyphonic.JSBConfig(archs=("rhn",), depths=(2,), trials=1, width=4, epochs=1,
                                 batch_size=8, seed=3, matmul_precision="float32")  # fmt: skip


def test_trial_config_is_the_config_json_of_before():
    sizes = polyphonic.plan(OLD_STUDY.archs, OLD_STUDY.depths, OLD_STUDY.width)
    (trial,) = polyphonic.trial_configs(OLD_STUDY, sizes)
    assert trial.name == "rhn_d2_t0"
    assert trial.to_dict() == OLD_TRIAL_CONFIG
    assert polyphonic.TrialConfig.from_dict(OLD_TRIAL_CONFIG) == trial
    assert trial.training() == polyphonic.PolyphonicConfig(
        lr=trial.lr, momentum=0.0, max_grad_norm=trial.max_grad_norm, batch_size=8, epochs=1,
        matmul_precision="highest")  # fmt: skip


def test_study_resumes_a_study_written_before_the_configs(tmp_path):
    """The finished trial of a study root written at 0016358 is accepted and not run again."""
    import json

    trial_dir = tmp_path / "trials" / "rhn_d2_t0"
    trial_dir.mkdir(parents=True)
    (trial_dir / "config.json").write_text(json.dumps(OLD_TRIAL_CONFIG, indent=1, sort_keys=True))
    old_results = {"best_epoch": 1, "diverged": False, "epochs_run": 1, "seconds": 49.91,
                   "test_nll": 45.78940993088942, "valid_nll": 45.76331865026596}  # fmt: skip
    (trial_dir / "results.json").write_text(json.dumps(old_results))
    lines = []
    rows = polyphonic.study(fixture_data(), tmp_path, OLD_STUDY, log=lines.append)
    assert lines == ["1 of 1 trials already finished"]
    assert rows == [{**OLD_TRIAL_CONFIG, **old_results}]
    assert json.loads((tmp_path / "results.jsonl").read_text()) == rows[0]


def test_study_table_rows():
    sizes = {("rhn", 1): {"hidden": 6, "params": 1756, "target": 1756},
             ("dtrnn", 1): {"hidden": 9, "params": 1762, "target": 1756}}  # fmt: skip
    rows = [{"arch": "rhn", "depth": 1, "valid_nll": 12.5, "test_nll": 12.8},
            {"arch": "rhn", "depth": 1, "valid_nll": math.inf, "test_nll": 9.0},
            {"arch": "rhn", "depth": 1, "valid_nll": 13.0, "test_nll": 13.25}]  # fmt: skip
    config = polyphonic.JSBConfig(archs=("rhn", "dtrnn"), depths=(1,))
    assert polyphonic.study_table(rows, config, sizes).splitlines() == [
        "| architecture | depth | hidden | params | target | trials | failed | "
        "test NLL (best valid trial) | median test NLL | best valid NLL |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| RHN | 1 | 6 | 1,756 | 1,756 | 3 | 1 | 12.800 | 13.250 | 12.500 |",
        "| DT-RNN | 1 | 9 | 1,762 | 1,756 | 0 | 0 | - | - | - |",
    ]


@pytest.mark.slow
def test_study_trial_gives_the_nll_of_before(tmp_path):
    """Trial 1 of the study above, trained now, has the NLLs the code at 0016358 wrote."""
    rows = polyphonic.study(fixture_data(), tmp_path, OLD_STUDY.replace(trials=2), log=print)
    (row,) = [r for r in rows if r["trial"] == 1]
    assert row["valid_nll"] == pytest.approx(59.69663709275266, rel=1e-6)
    assert row["test_nll"] == pytest.approx(59.69930795522836, rel=1e-6)
    assert (row["best_epoch"], row["epochs_run"], row["diverged"]) == (1, 1, False)


@pytest.mark.parametrize("bad, message", [
    (dict(lr=0.0), "need lr > 0"), (dict(momentum=1.0), "need lr > 0"),
    (dict(epochs=0), "epochs must be >= 1"), (dict(batch_size=0), "batch_size must be >= 1"),
    (dict(max_steps=0), "max_steps must be >= 1"),
])  # fmt: skip
def test_polyphonic_config_rejects_bad_settings_in_one_line(bad, message):
    with pytest.raises(ValueError, match=message) as e:
        polyphonic.PolyphonicConfig(**{"lr": 0.1, **bad})
    assert "\n" not in str(e.value)
