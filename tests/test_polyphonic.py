"""rhnzoo.tasks.polyphonic: next-step NLL, the clipped-SGD step, training on piano
rolls, the settings; and the JSB study (rhnzoo.studies.jsb)."""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.configs import jsb
from rhnzoo.data.music import pad_batch
from rhnzoo.models import num_params
from rhnzoo.models.piano_roll import PianoRollModel, nll_sums
from rhnzoo.engine import evaluate
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.studies import jsb as jsb_study
from rhnzoo.tasks import polyphonic


def nll_per_step(model, params, seqs, *, length=None, batch_size=None):
    """NLL per time step (nats) of ``seqs`` by the engine's evaluation loop: batches of
    ``batch_size`` sequences (default: all) padded to ``length`` (default: the longest)."""
    length = max(s.shape[0] for s in seqs) if length is None else length
    batch_size = len(seqs) if batch_size is None else batch_size
    batches = [
        pad_batch(seqs[i : i + batch_size], length, batch_size)
        for i in range(0, len(seqs), batch_size)
    ]
    totals = evaluate.evaluate(polyphonic._eval_step(model), params, batches)
    sums = evaluate.seed_rows(totals)[0]
    return sums["loss"] / sums["count"]


def random_rolls(rng, lengths, density=0.08):
    return [(rng.uniform(size=(t, 88)) < density).astype(np.float32) for t in lengths]


def small_model(arch="dtrnn"):
    cell = {"dtrnn": cells.DTRNN(6, 2), "rhn": cells.RHN(5, 2), "dtsrnn": cells.DTSRNN(5, 3)}
    return PianoRollModel(cell[arch])


def test_zero_output_layer_gives_88_log_2_per_step():
    """Logits 0 -> p = 1/2 for every note -> NLL per step = 88 log 2 (hand value 60.9970)."""
    model = small_model()
    params = model.init(jax.random.PRNGKey(0))
    params["W_out"] = jnp.zeros_like(params["W_out"])
    seqs = random_rolls(np.random.default_rng(0), [4, 7, 2])
    assert nll_per_step(model, params, seqs) == pytest.approx(88 * math.log(2), rel=1e-6)


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
        got = nll_per_step(model, params, seqs, **kwargs)
        assert got == pytest.approx(expected, rel=2e-5)


def test_num_params_counts_cell_and_output_layer():
    m = PianoRollModel(cells.RHN(10, 3))
    # RHN: W [88, 20], R [3, 10, 20], b [3, 20]; output: W_out [10, 88], b_out [88].
    assert num_params(m) == 88 * 20 + 3 * 200 + 60 + 880 + 88
    m = PianoRollModel(cells.DTSRNN(7, 4))
    assert num_params(m) == 88 * 7 + 7 * 49 + 4 * 7 + 7 * 88 + 88


def test_training_steps_are_clipped_heavy_ball_sgd():
    """Two steps of the task on the engine (a config's hyperparameters -> the optimizer
    state -> the compiled step) against hand-written clip-then-momentum SGD:
    v <- mu v + clip(g), theta <- theta - eta v."""
    model = small_model()
    seqs = random_rolls(np.random.default_rng(2), [6, 4, 8], density=0.3)
    x, mask = (jnp.asarray(a) for a in pad_batch(seqs))  # the one batch of an epoch
    lr, mu, clip = 0.3, 0.9, 0.5
    params = model.init(jax.random.PRNGKey(3))
    theta = jax.tree.map(np.asarray, params)

    def loss(p):
        t, c = nll_sums(model, p, x, mask)
        return t / c

    velocity = jax.tree.map(np.zeros_like, theta)
    expected_losses, thetas = [], [theta]
    value_and_grad = jax.jit(jax.value_and_grad(loss))
    for _ in range(2):
        value, g = value_and_grad(theta)
        expected_losses.append(float(value))
        norm = math.sqrt(sum(float(np.sum(np.square(a))) for a in jax.tree.leaves(g)))
        assert norm > clip  # so the clipping is exercised
        g = jax.tree.map(lambda a, s=clip / norm: np.asarray(a) * s, g)
        velocity = jax.tree.map(lambda v, a: mu * v + a, velocity, g)
        theta = jax.tree.map(lambda p, v: p - lr * v, theta, velocity)
        thetas.append(theta)

    config = jsb.PolyphonicConfig(
        lr=lr, momentum=mu, max_grad_norm=clip, batch_size=3, epochs=2, progress=False
    )
    data = {"train": seqs, "valid": seqs, "test": seqs}
    out = polyphonic.train_and_evaluate(
        config, data, model=model, params=jax.tree.map(jnp.array, params)
    )
    assert [r["train"] for r in out.history] == pytest.approx(expected_losses, rel=1e-5)
    best = out.best_epoch  # one step per epoch
    for a, b in zip(jax.tree.leaves(out.best_params), jax.tree.leaves(thetas[best])):
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

    return {
        split: [song(int(rng.integers(6, 14))) for _ in range(k)]
        for split, k in (("train", 24), ("valid", 6), ("test", 6))
    }


def test_training_lowers_the_nll_and_reports_test_at_best_valid():
    data = fixture_data()
    model = small_model("dtsrnn")
    logs = []
    before = nll_per_step(model, model.init(jax.random.PRNGKey(5)), data["valid"])
    config = jsb.PolyphonicConfig(
        lr=1.0, momentum=0.9, max_grad_norm=5.0, batch_size=8, epochs=4, progress=False, seed=5
    )
    result = polyphonic.train_and_evaluate(config, data, model=model, log=logs.append)
    assert result.epochs_run == 4 and not result.diverged
    assert len([line for line in logs if line.startswith("epoch")]) == 4
    assert logs[-1].startswith("final (best checkpoint")  # the engine's lines, unfiltered
    assert result.best_valid < before - 5.0
    best = result.history[result.best_epoch - 1]
    assert best["valid"] == result.best_valid == min(h["valid"] for h in result.history)
    assert math.isfinite(result.test_at_best)


def test_nan_parameters_are_reported_as_diverged():
    model = small_model()
    params = model.init(jax.random.PRNGKey(0))
    params["b_out"] = params["b_out"].at[0].set(jnp.nan)
    config = jsb.PolyphonicConfig(lr=0.1, epochs=3, progress=False)
    result = polyphonic.train_and_evaluate(config, fixture_data(), model=model, params=params)
    assert result.diverged and result.epochs_run == 1 and result.best_epoch == 0
    assert result.best_valid == math.inf and result.test_at_best == math.inf


# ------------------------------------------------------------------ configs and the study


def test_polyphonic_config_round_trip_and_one_line_errors():
    config = jsb.PolyphonicConfig(lr=0.3, momentum=0.9, max_steps=7, patience=2)
    values = config.to_dict()
    assert {
        k: values[k]
        for k in (
            "lr",
            "momentum",
            "max_grad_norm",
            "batch_size",
            "epochs",
            "max_steps",
            "patience",
            "seed",
        )
    } == {
        "lr": 0.3,
        "momentum": 0.9,
        "max_grad_norm": 10.0,
        "batch_size": 16,
        "epochs": 40,
        "max_steps": 7,
        "patience": 2,
        "seed": 0,
    }
    assert jsb.PolyphonicConfig.from_dict(values) == config
    # The engine reads the run's length from the config itself: 40 epochs cut to 7 steps.
    assert config.total_steps(steps_per_epoch=2) == 7 and config.cut_short(2)
    with pytest.raises(ValueError, match="unknown PolyphonicConfig setting.*: dropout$"):
        jsb.PolyphonicConfig.from_dict({**values, "dropout": 0.1})


@pytest.mark.parametrize(
    "bad, message",
    [
        # (a field's own type, bounds and choices: tests/test_config_contract.py's)
        ({"momentum": 1.0}, "^--momentum must be < 1, got 1.0$"),
        ({"divergence_factor": 0.5}, "^--divergence_factor must be 0"),
    ],
)
def test_polyphonic_config_rejects_bad_settings_in_one_line(bad, message):
    with pytest.raises(ValueError, match=message) as e:
        jsb.PolyphonicConfig(**bad)
    assert "\n" not in str(e.value)


def test_jsb_config_checks_and_drops_repeats():
    JSB = jsb.JSBConfig
    config = JSB(archs=["rhn", "lstm", "rhn"], depths=[4, 1, 4])
    assert config.archs == ("rhn", "lstm") and config.depths == (4, 1)
    assert JSB.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    cases = [
        ({"archs": ["x", "x"]}, r"^--archs must be a non-empty subset of .*got \['x', 'x'\]$"),
        ({"archs": []}, r"^--archs .*got \[\]$"),
        ({"depths": (1, -2)}, r"^--depths: every depth must be >= 1, got \[1, -2\]$"),
        ({"depths": ()}, r"^--depths: every depth must be >= 1"),
        ({"matmul_precision": "fast"}, "^--matmul_precision: unknown matmul precision"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            JSB(**bad)


def test_jsb_config_resume_rules():
    """The study's extent and where its files are may change on a rerun; what shapes a
    trial's result may not, though the engine lets a checkpointed run change some."""
    config = jsb.JSBConfig(matmul_precision="float32")
    assert config.matmul_precision == "highest"  # recorded as a level
    recorded = json.loads(json.dumps(config.to_dict()))
    extent = {
        "trials": 30,
        "archs": ["rhn"],
        "depths": [6],
        "workdir": "x",
        "data_dir": "d",
        "preset": "cpu",
        "download": False,
    }
    assert config.conflicts({**recorded, **extent}) == []
    for name, value in [
        ("epochs", 3),
        ("batch_size", 8),
        ("width", 32),
        ("seed", 1),
        ("max_steps", 5),
        ("max_epochs", 5),
        ("patience", 2),
        ("divergence_factor", 0.0),
        ("matmul_precision", "default"),
    ]:
        assert config.conflicts({**recorded, name: value}) == [
            f"{name}={value!r} there vs {recorded[name]!r}"
        ]
    # On its own, a piano-roll run may change its run limits on resume.
    assert jsb.PolyphonicConfig().conflicts({"max_steps": 5, "patience": 2}) == []


def test_jsb_presets_hold_the_papers_study():
    from rhnzoo.configs import jsb

    full = jsb.get_config()
    # Zilly et al. 2017, sec. 5.1 / Fig. 4: RHN vs DT-RNN vs DT(S)-RNN at depths 1, 2, 4, 6.
    assert full.archs == ("rhn", "dtrnn", "dtsrnn") and full.depths == (1, 2, 4, 6)
    assert (full.width, full.trials, full.epochs, full.batch_size) == (64, 20, 40, 16)
    assert full.preset is None
    cpu = jsb.get_config("cpu")
    assert (cpu.width, cpu.trials, cpu.epochs, cpu.batch_size) == (32, 10, 25, 16)
    assert cpu.depths == full.depths and cpu.archs == full.archs and cpu.preset == "cpu"
    mine = jsb.get_config("cpu", trials=3, depths=[1, 4])  # given settings over the preset
    assert (mine.width, mine.trials, mine.depths, mine.preset) == (32, 3, (1, 4), "cpu")
    with pytest.raises(ValueError, match="^--preset must be one of cpu, got 'gpu'$"):
        jsb.get_config("gpu")
    with pytest.raises(ValueError, match="^unknown JSBConfig setting.*: lr$"):
        jsb.get_config(lr=0.1)


# A trial workdir written by the code before the configs (commit 0016358): study(...,
# archs rhn, dtrnn, depths 2, 2 trials, width 4, epochs 1, batch 8, seed 3, 'highest').
OLD_TRIAL_CONFIG = {
    "arch": "rhn",
    "batch_size": 8,
    "depth": 2,
    "epochs": 1,
    "hidden": 4,
    "init_bias": -2.267492239054105,
    "init_scale": 0.013773344750579892,
    "lr": 0.3185562740273419,
    "matmul_precision": "highest",
    "max_grad_norm": 14.599032390543904,
    "max_steps": None,
    "momentum": 0.0,
    "params": 1224,
    "seed": 3,
    "trial": 0,
    "width": 4,
}
OLD_RESULTS = {
    "best_epoch": 1,
    "diverged": False,
    "epochs_run": 1,
    "seconds": 49.91,
    "test_nll": 45.78940993088942,
    "valid_nll": 45.76331865026596,
}
# The study root's config.json of that code: the settings every trial shared, no more.
OLD_ROOT_CONFIG = {
    "batch_size": 8,
    "epochs": 1,
    "matmul_precision": "highest",
    "max_steps": None,
    "seed": 3,
    "width": 4,
}
OLD_STUDY = jsb.JSBConfig(
    archs=("rhn",),
    depths=(2,),
    trials=1,
    width=4,
    epochs=1,
    batch_size=8,
    seed=3,
    matmul_precision="float32",
)


def test_trial_config_holds_the_config_json_of_before():
    sizes = jsb_study.plan(OLD_STUDY.archs, OLD_STUDY.depths, OLD_STUDY.width)
    (trial,) = jsb_study.trial_configs(OLD_STUDY, sizes)
    assert trial.name == "rhn_d2_t0"
    values = trial.to_dict()
    assert {k: values[k] for k in OLD_TRIAL_CONFIG} == OLD_TRIAL_CONFIG
    assert trial.conflicts(OLD_TRIAL_CONFIG) == []  # the settings added since: defaults
    assert not trial.progress  # a trial trains silently
    assert isinstance(trial, jsb.PolyphonicConfig)  # how its model trains


def old_study(root):
    """``root`` as the code of 0016358 left a study: its config.json and trial 0 done."""
    trial_dir = root / "trials" / "rhn_d2_t0"
    trial_dir.mkdir(parents=True)
    (trial_dir / "config.json").write_text(json.dumps(OLD_TRIAL_CONFIG, indent=1, sort_keys=True))
    (trial_dir / "results.json").write_text(json.dumps(OLD_RESULTS))
    (root / "config.json").write_text(json.dumps(OLD_ROOT_CONFIG, indent=1, sort_keys=True))


def test_study_resumes_a_study_written_before_the_configs(tmp_path):
    """The finished trial of a study root written at 0016358 is accepted and not run
    again; the root's config.json then records every setting."""
    old_study(tmp_path)
    lines = []
    rows = jsb_study.study(fixture_data(), tmp_path, OLD_STUDY, log=lines.append)
    assert lines[0].startswith("parameter counts (target: RHN of width 4")
    assert lines[1:] == [
        "        RHN depth 2: hidden    4,    1,224 params (target 1,224, +0.00%)",
        "1 of 1 trials already finished",
    ]
    assert rows == [{**OLD_TRIAL_CONFIG, **OLD_RESULTS}]
    assert json.loads((tmp_path / "results.jsonl").read_text()) == rows[0]
    assert json.loads((tmp_path / "config.json").read_text()) == workdir_lib.strict(
        OLD_STUDY.to_dict()
    )


def test_study_refuses_another_structural_setting_in_one_line(tmp_path):
    old_study(tmp_path)
    with pytest.raises(ValueError, match=r"holds an incompatible run \(epochs=1 there vs 2\)") as e:
        jsb_study.study(fixture_data(), tmp_path, OLD_STUDY.replace(epochs=2), log=print)
    assert "\n" not in str(e.value)
    # A setting the old config.json lacks counts as its default: patience None there.
    with pytest.raises(ValueError, match=r"\(patience=None there vs 3\)"):
        jsb_study.study(fixture_data(), tmp_path, OLD_STUDY.replace(patience=3), log=print)
    assert json.loads((tmp_path / "config.json").read_text()) == OLD_ROOT_CONFIG


def test_study_with_more_trials_extends_a_study_written_before_the_configs(tmp_path):
    """Trial 0 of the old study is kept; trial 1, trained now, has the NLLs the code at
    0016358 wrote for it."""
    old_study(tmp_path)
    lines = []
    rows = jsb_study.study(fixture_data(), tmp_path, OLD_STUDY.replace(trials=2), log=lines.append)
    assert "1 of 2 trials already finished" in lines
    assert [line[:8] for line in lines if line.startswith("[")] == ["[   2/2]"]
    old, new = rows
    assert old == {**OLD_TRIAL_CONFIG, **OLD_RESULTS} and new["trial"] == 1
    assert new["valid_nll"] == pytest.approx(59.69663709275266, rel=1e-6)
    assert new["test_nll"] == pytest.approx(59.69930795522836, rel=1e-6)
    assert (new["best_epoch"], new["epochs_run"], new["diverged"]) == (1, 1, False)
    assert json.loads((tmp_path / "config.json").read_text())["trials"] == 2


def test_an_in_process_study_says_the_time_its_trials_left_take(tmp_path):
    """Issue 62 item 7: each trial line of a study in this process ends with the whole
    job's estimate, as the other multi-run scripts' lines do (it printed none): after
    trial 1 (trial 0 finished before), one trial left; after the last, nothing."""
    old_study(tmp_path)
    lines = []
    jsb_study.study(fixture_data(), tmp_path, OLD_STUDY.replace(trials=3), log=lines.append)
    first, last = [line for line in lines if line.startswith("[")]
    assert first.startswith("[   2/3]") and last.startswith("[   3/3]")
    assert re.search(r" s; about [\d a-z]+ for the 1 trial left$", first), first
    assert re.search(r"\d s$", last), last


def test_study_table_rows():
    sizes = {
        ("rhn", 1): {"hidden": 6, "params": 1756, "target": 1756},
        ("dtrnn", 1): {"hidden": 9, "params": 1762, "target": 1756},
    }
    rows = [
        {"arch": "rhn", "depth": 1, "valid_nll": 12.5, "test_nll": 12.8},
        {"arch": "rhn", "depth": 1, "valid_nll": math.inf, "test_nll": 9.0},
        {"arch": "rhn", "depth": 1, "valid_nll": 13.0, "test_nll": 13.25},
    ]
    config = jsb.JSBConfig(archs=("rhn", "dtrnn"), depths=(1,))
    assert jsb_study.study_table(rows, config, sizes).splitlines() == [
        (
            "| architecture | depth | hidden | params | target | trials | failed | "
            "test NLL (best valid trial) | median test NLL | best valid NLL |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
        "| RHN | 1 | 6 | 1,756 | 1,756 | 3 | 1 | 12.800 | 13.250 | 12.500 |",
        "| DT-RNN | 1 | 9 | 1,762 | 1,756 | 0 | 0 | - | - | - |",
    ]


def test_bool_or_integer_piano_rolls_are_their_float_values():
    # Before: the carry took the frames' dtype, so 0/1 bool or uint8 rolls failed in the scan.
    model = small_model()
    params = model.init(jax.random.PRNGKey(0))
    rolls = np.random.default_rng(4).random((6, 2, 88)) < 0.1
    want = model.logits(params, jnp.asarray(rolls, jnp.float32))
    for dtype in (bool, np.uint8):
        np.testing.assert_allclose(model.logits(params, jnp.asarray(rolls, dtype)), want, rtol=1e-6)
