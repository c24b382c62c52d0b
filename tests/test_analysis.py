"""Analysis tools on a tiny trained HSG(RHN) run: load_run, gates, lesions, MC dropout,
the analyze/sweep CLIs and their PNGs.

The run is trained by rhnzoo.tasks.lm.train on a slice of real PTB when
$RHNZOO_DATA/ptb exists, else on a generated corpus written as ptb.*.txt files.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rhnzoo import analysis, data, dropout
from rhnzoo.analysis import lm as lm_analysis
from rhnzoo.models import lm
from rhnzoo.tasks import lm as train
from rhnzoo.configs import lm as lm_configs
from rhnzoo.engine import signals

ROOT = pathlib.Path(__file__).resolve().parents[1]
PTB_DIR = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "ptb"
HIDDEN, DEPTH = 16, 3
RATES = dropout.Rates(0.1, 0.2, 0.1, 0.2)

sigmoid = lambda z: 1.0 / (1.0 + np.exp(-z))


def generated_ptb(directory):
    """A 40-word corpus with sentence structure (each word mostly predicts the next)."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    successor = rng.permutation(40)
    for split, n_lines in (("train", 300), ("valid", 60), ("test", 60)):
        lines = []
        for _ in range(n_lines):
            w, line = int(rng.integers(40)), []
            for _ in range(int(rng.integers(5, 15))):
                line.append(words[w])
                w = int(successor[w]) if rng.random() < 0.8 else int(rng.integers(40))
            lines.append(" ".join(line))
        (directory / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    return directory


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(workdir, data_dir, corpus): a few SGD steps of hidden 16, depth 3, HSG on."""
    tmp = tmp_path_factory.mktemp("analysis")
    if (PTB_DIR / "ptb.train.txt").exists():
        data_dir = PTB_DIR
    else:
        data_dir = generated_ptb(tmp / "data")
    full = data.load_ptb(data_dir, download=False, verify=False)
    corpus = data.Corpus(full.train[:4000], full.valid[:400], full.test[:400], full.vocab)
    model = lm.rhn_language_model(corpus.vocab_size, HIDDEN, DEPTH, hsg=True)
    cfg = lm_configs.LMConfig(
        lr=0.5,
        batch_size=4,
        num_steps=10,
        drop_x=RATES.x,
        drop_i=RATES.i,
        drop_h=RATES.h,
        drop_o=RATES.o,
        eval_batch_size=4,
        eval_num_steps=50,
    )
    # config.json: the model's settings (what the analyses read) and the data directory.
    recorded = cfg.replace(
        hidden_size=HIDDEN,
        depth=DEPTH,
        hsg=True,
        init_bias=-2.0,
        data_dir=str(data_dir),
        max_steps=6,
        progress=False,
    )
    workdir = tmp / "run"
    train.train_and_evaluate(recorded, corpus, workdir=workdir, model=model)
    return workdir, data_dir, corpus


@pytest.fixture(scope="module")
def loaded(run):
    return analysis.load_run(run[0])


def restore(directory):
    mngr = ocp.CheckpointManager(directory)
    tree = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore())
    mngr.close()
    return tree


def perturbed(params, scale=0.5, seed=0):
    """Random offsets on every leaf, so gates and layers differ from their init."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(
        tree, [p + scale * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
    )


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_load_run_round_trip(run, loaded, tmp_path):
    workdir, _, corpus = run
    model, params, config = loaded
    assert model == lm.rhn_language_model(corpus.vocab_size, HIDDEN, DEPTH, hsg=True)
    assert config["depth"] == DEPTH and config["hsg"] is True
    assert_trees_equal(params, restore(workdir / "best"))
    # Without best/, the latest training state's params are used.
    shutil.copytree(workdir, tmp_path / "nobest", ignore=shutil.ignore_patterns("best"))
    _, fallback, _ = analysis.load_run(tmp_path / "nobest")
    assert_trees_equal(fallback, restore(workdir / "checkpoints")["state"]["task"]["params"])
    # No checkpoint / no config: a one-line ValueError.
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/config.json").write_text(json.dumps({"hidden_size": 8, "depth": 2}))
    with pytest.raises(ValueError, match="no checkpoint") as e:
        analysis.load_run(tmp_path / "empty")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="no config.json"):
        analysis.load_run(tmp_path / "nothing")


def numpy_gates(params, tokens, steps):
    """Zilly et al. eqs. 6-8 and Shoham & Permuter eqs. 5-6, one row at a time, float64."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    c, r, n = p["cell"], p["cell"]["cell"], HIDDEN
    t_all = np.zeros((steps, DEPTH, tokens.shape[0], n))
    g_all = np.zeros((steps, tokens.shape[0], n))
    for b, row in enumerate(tokens):
        s_hat = np.zeros(n)
        for t in range(steps):
            x, s = p["embed"][row[t]], s_hat
            for l in range(DEPTH):
                pre = s @ r["R"][l] + r["b"][l] + (x @ r["W"] if l == 0 else 0.0)
                h, gate = np.tanh(pre[:n]), sigmoid(pre[n : 2 * n])
                s = h * gate + s * (1.0 - gate)
                t_all[t, l, b] = gate
            g = sigmoid(s_hat @ c["W_R"] + s @ c["W_F"] + c["b_G"])
            g_all[t, b] = g
            s_hat = g * s_hat + (1.0 - g) * s
    return t_all, g_all


def test_gate_activity_shapes_values_and_numpy(run, loaded):
    _, _, corpus = run
    model, params, _ = loaded
    tokens = np.stack([corpus.valid[:25], corpus.valid[100:125]])
    gates = analysis.gate_activity(model, params, tokens)
    assert gates.t.shape == (25, DEPTH, 2, HIDDEN) and gates.g.shape == (25, 2, HIDDEN)
    for a in (gates.t, gates.g):
        assert np.all((np.asarray(a) > 0) & (np.asarray(a) < 1))
    # Against NumPy, with perturbed params so that every layer and the HSG matter.
    params = perturbed(params)
    gates = analysis.gate_activity(model, params, tokens)
    t_np, g_np = numpy_gates(params, tokens, 3)
    np.testing.assert_allclose(gates.t[:3], t_np, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(gates.g[:3], g_np, rtol=2e-4, atol=1e-5)
    assert np.std(t_np) > 0.05  # not a degenerate comparison
    # An RHN without HSG has no g.
    rhn_model = lm.rhn_language_model(corpus.vocab_size, HIDDEN, DEPTH)
    rhn = analysis.gate_activity(rhn_model, dict(params, cell=params["cell"]["cell"]), tokens)
    assert rhn.g is None and rhn.t.shape == (25, DEPTH, 2, HIDDEN)


def bypassed(model, params, layer):
    """The depth L - 1 model without micro-layer ``layer``; for layer 0 (the only one
    the input enters) the next micro-layer becomes the first, with W = 0."""
    rhn = model.cell.cell
    keep = np.array([l for l in range(rhn.depth) if l != layer])
    rp = params["cell"]["cell"]
    reduced = dict(rp, R=rp["R"][keep], b=rp["b"][keep])
    if layer == 0:
        reduced["W"] = jnp.zeros_like(rp["W"])
    cell = dataclasses.replace(model.cell, cell=dataclasses.replace(rhn, depth=rhn.depth - 1))
    return dataclasses.replace(model, cell=cell), dict(
        params, cell=dict(params["cell"], cell=reduced)
    )


def test_lesion_equals_removing_the_micro_layer(run, loaded):
    _, _, corpus = run
    model, params, _ = loaded
    params = perturbed(params, scale=0.3)
    tokens = corpus.train[:800]
    result = analysis.lesion_layers(model, params, tokens, batch_size=4, num_steps=50)
    base, count = lm_analysis.stream_nll(model, params, tokens, 4, 50)
    assert result.num_tokens == count == 4 * (200 - 1)
    assert result.base_nll == pytest.approx(base / count, rel=1e-6)
    for layer in range(DEPTH):
        small_model, small_params = bypassed(model, params, layer)
        nll, _ = lm_analysis.stream_nll(small_model, small_params, tokens, 4, 50)
        assert result.nll[layer] == pytest.approx(nll / count, rel=1e-6), layer
        assert abs(result.delta_nll[layer]) > 1e-3, "the lesion must change the loss"
    np.testing.assert_allclose(result.ppl, np.exp(result.nll))
    gates = analysis.gate_activity(model, analysis.lesion_params(model, params, 1), tokens[None])
    assert float(jnp.max(gates.t[:, 1])) == 0.0 and float(jnp.min(gates.t[:, 0])) > 0.0
    with pytest.raises(ValueError, match="layer must be in"):
        analysis.lesion_params(model, params, DEPTH)


def test_lesion_uncoupled_rhn_bypasses_the_layer():
    """Uncoupled (separate carry gate C): the lesion also opens C, so s^[l] = s^[l-1]."""
    model = lm.rhn_language_model(11, 8, 3, coupled=False)
    params = perturbed(model.init(jax.random.PRNGKey(0)))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 0, 11)
    _, ys = model.hidden(params, model.initial_carry(2), tokens)
    _, lesioned = model.hidden(
        analysis.lesion_params(model, params, 2), model.initial_carry(2), tokens
    )
    rhn, rp = model.cell, params["cell"]
    small = dataclasses.replace(model, cell=dataclasses.replace(rhn, depth=2))
    small_params = dict(params, cell=dict(rp, R=rp["R"][:2], b=rp["b"][:2]))
    _, bypass = small.hidden(small_params, small.initial_carry(2), tokens)
    np.testing.assert_allclose(lesioned, bypass, rtol=1e-6, atol=1e-7)
    assert np.abs(np.asarray(lesioned - ys)).max() > 1e-2


def test_mc_dropout(run, loaded):
    _, _, corpus = run
    model, params, _ = loaded
    tokens = corpus.test[:300]
    # K = 1 with all rates 0 is the deterministic batch-1 perplexity.
    nll, count = lm_analysis.stream_nll(model, params, tokens, 1, 50)
    deterministic = np.exp(nll / count)
    mc0 = analysis.mc_dropout_perplexity(model, params, tokens, dropout.Rates(), 1, num_steps=50)
    assert mc0.num_tokens == count == 299
    assert mc0.perplexity == pytest.approx(deterministic, rel=1e-5)
    # Probabilities, not losses, are averaged: by Jensen the MC loss is below the
    # mean single-pass loss when the passes differ.
    params = perturbed(params, scale=0.2)
    mc = analysis.mc_dropout_perplexity(model, params, tokens, RATES, 3, num_steps=50, seed=1)
    single = np.log(mc.sample_perplexities)
    assert len(set(mc.sample_perplexities)) == 3
    assert mc.nll < single.mean() - 1e-4
    assert len(mc.pass_s) == 3 and mc.seconds > 0
    # Masks are drawn once per pass, not per window: the window length does not matter.
    mc_long = analysis.mc_dropout_perplexity(model, params, tokens, RATES, 3, num_steps=299, seed=1)
    assert mc_long.perplexity == pytest.approx(mc.perplexity, rel=1e-5)
    with pytest.raises(ValueError, match="num_samples"):
        analysis.mc_dropout_perplexity(model, params, tokens, RATES, 0)


def recording_track(calls):
    """A tracker recording ``(desc, total, items taken)`` per call (no bar, no signals)."""

    def track(iterable, total=None, desc=""):
        calls.append([desc, total, 0])
        for item in iterable:
            calls[-1][2] += 1
            yield item

    return track


def test_long_analyses_take_one_bar_of_all_their_windows(run, loaded):
    """Lesions, MC dropout and the HSG sample iterate the tracker over every window (one
    bar per call, one item per window) and give the same numbers as without it."""
    _, _, corpus = run
    model, params, _ = loaded
    calls = []
    tokens = corpus.train[:1000]  # 4 rows of 250: 249 predictions, 5 windows of 50
    lesion = analysis.lesion_layers(
        model, params, tokens, batch_size=4, num_steps=50, track=recording_track(calls)
    )
    assert calls == [["lesion", (DEPTH + 1) * 5, (DEPTH + 1) * 5]]
    plain = analysis.lesion_layers(model, params, tokens, batch_size=4, num_steps=50)
    np.testing.assert_allclose(lesion.nll, plain.nll, rtol=1e-6)
    calls.clear()
    mc = analysis.mc_dropout_perplexity(
        model, params, corpus.test[:300], RATES, 2, num_steps=50, track=recording_track(calls)
    )
    assert calls == [["mc_dropout", 2 * 6, 2 * 6]] and len(mc.pass_s) == 2
    calls.clear()
    stream = corpus.valid[None, :200]
    windowed = analysis.hsg_gate_sample(
        model, params, stream, 50, num_steps=30, track=recording_track(calls)
    )
    assert [c[1:] for c in calls] == [[7, 7]]  # 200 steps in windows of 30, the last padded
    np.testing.assert_allclose(
        windowed, analysis.hsg_gate_sample(model, params, stream, 50), rtol=1e-6, atol=1e-7
    )


def cli(script, *args):
    result = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def png_shape(path):
    assert path.is_file(), path
    return matplotlib.image.imread(path).shape


@pytest.mark.slow
def test_analyze_cli_writes_pngs_and_numbers(run, tmp_path):
    workdir, data_dir, _ = run
    out = cli(
        "analyze.py",
        f"--workdir={os.path.relpath(workdir, ROOT)}",  # relative: orbax needs it made absolute
        f"--out={tmp_path}",
        f"--data_dir={data_dir}",
        "--noverify",
        "--mc_samples=2",
        "--max_eval_tokens=300",
        "--lesion_tokens=1000",
        "--lesion_batch_size=4",
        "--heatmap_steps=30",
        "--hist_tokens=200",
        "--hist_times=50",
    )
    # Documented defaults: figsize (10, 4) / (6.4, 4) inches at 100 dpi.
    assert png_shape(tmp_path / "gate_heatmap.png")[:2] == (400, 1000)
    assert png_shape(tmp_path / "lesion.png")[:2] == (400, 640)
    assert png_shape(tmp_path / "hsg_gates.png")[:2] == (400, 640)
    assert out.count("lesion micro-layer") == DEPTH
    assert "MC dropout K=2" in out
    numbers = json.loads((tmp_path / "analysis.json").read_text())
    assert len(numbers["lesion"]["ppl"]) == DEPTH
    assert numbers["hsg_gate"]["num_values"] == 50 * HIDDEN
    assert len(numbers["mc_dropout"]["sample_ppls"]) == 2
    assert numbers["mc_dropout"]["rates"] == [RATES.x, RATES.i, RATES.h, RATES.o]
    assert not (workdir / "gate_heatmap.png").exists(), "--out must be honoured"
    assert "checkpoint: best at step" in out and numbers["checkpoint"]["kind"] == "best"
    assert numbers["complete"] is True and "interrupted" not in numbers
    assert {name: p["status"] for name, p in numbers["phases"].items()} == dict.fromkeys(
        ["gate_heatmap", "lesion", "hsg_gate", "deterministic", "mc_dropout"], "done"
    )
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]


def sigterm_in(phase, at):
    """The engine's tracker (no bar) that sends this process SIGTERM while taking item
    ``at`` of the phase named ``phase`` (as tests/test_engine.py stops a run)."""

    def track(iterable, total=None, desc=""):
        for i, item in enumerate(signals.track(iterable, total=total, desc=desc, progress=False)):
            if desc == phase and i == at:
                os.kill(os.getpid(), signal.SIGTERM)
            yield item

    return track


def without_best(workdir, tmp_path):
    """A copy of the run as if stopped before its first validation (no best/)."""
    copy = tmp_path / "nobest"
    shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("best"))
    return copy


def latest_step(directory):
    mngr = ocp.CheckpointManager(directory)
    step = mngr.latest_step()
    mngr.close()
    return step


def test_checkpoint_used_is_best_else_latest(run, tmp_path):
    from rhnzoo.analysis import report

    workdir = run[0]
    assert report.checkpoint_used(workdir) == {
        "kind": "best",
        "step": latest_step(workdir / "best"),
        "path": str(workdir / "best" / str(latest_step(workdir / "best"))),
    }
    nobest = without_best(workdir, tmp_path)
    used = report.checkpoint_used(nobest)
    assert used["kind"] == "latest" and used["step"] == latest_step(nobest / "checkpoints")
    assert report.checkpoint_used(tmp_path / "nothing") is None


def test_analysis_stopped_in_its_lesion_phase_keeps_the_phases_done(run, tmp_path, capsys):
    """SIGTERM during the lesion study (its 12th of 4 x 5 windows): analysis.json holds the
    gate heatmap phase and its figure, the lesion phase marked interrupted with the intact
    model and the first lesion (the evaluations finished), no later phase, no temporary
    file; one line says so; the checkpoint read (latest: no best/) is printed and recorded."""
    from rhnzoo.analysis import report

    workdir, data_dir, corpus = run
    nobest = without_best(workdir, tmp_path)
    out = tmp_path / "out"
    opts = report.AnalysisOptions(
        data_dir=str(data_dir),
        verify=False,
        lesion_tokens=1000,
        lesion_batch_size=4,
        eval_num_steps=50,
        heatmap_steps=30,
        hist_tokens=200,
        hist_times=50,
        mc_samples=1,
        max_eval_tokens=300,
        track=sigterm_in("lesion", at=11),
    )
    signals.catch_signals()
    try:
        with pytest.raises(signals.Interrupted) as stopped:
            report.analyze(nobest, out, opts)
    finally:
        signals.release_signals()
    assert stopped.value.signum == signal.SIGTERM
    assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "gate_heatmap.png"]
    numbers = json.loads((out / "analysis.json").read_text())
    assert numbers["complete"] is False
    assert numbers["interrupted"] == {"phase": "lesion", "signal": signal.SIGTERM}
    assert list(numbers["phases"]) == ["gate_heatmap", "lesion"]
    assert numbers["phases"]["gate_heatmap"]["status"] == "done"
    assert numbers["phases"]["gate_heatmap"]["figures"] == ["gate_heatmap.png"]
    assert numbers["phases"]["lesion"]["status"] == "interrupted"
    assert numbers["phases"]["lesion"]["figures"] == []
    assert len(numbers["t_gate_mean_per_layer"]) == DEPTH
    step = latest_step(nobest / "checkpoints")
    assert numbers["checkpoint"]["kind"] == "latest" and numbers["checkpoint"]["step"] == step
    # The finished evaluations, as the whole study gives them.
    model, params, _ = analysis.load_run(nobest)
    whole = analysis.lesion_layers(model, params, corpus.train[:1000], batch_size=4, num_steps=50)
    partial = numbers["lesion"]
    assert partial["num_layers"] == DEPTH and len(partial["nll"]) == 1
    assert partial["intact_nll"] == pytest.approx(whole.base_nll, rel=1e-6)
    assert partial["nll"][0] == pytest.approx(whole.nll[0], rel=1e-6)
    lines = capsys.readouterr().out.splitlines()
    assert f"checkpoint: latest at step {step} (no validation has happened yet" in lines[0]
    assert any(line.startswith("  lesion: about ") and " left (" in line for line in lines)
    assert lines[-1] == (
        f"stopped by signal {signal.SIGTERM} in phase lesion: wrote "
        f"{out / 'analysis.json'} with the phases done (gate_heatmap) and "
        "lesion marked interrupted"
    )


def test_a_rerun_keeps_the_phases_done_and_an_interrupted_rerun_merges(run, tmp_path, capsys):
    """Issue 62 item 1 (a rerun redid every phase, and an interrupted one rewrote
    analysis.json with only its own phases): a second analysis of the same checkpoint with
    the same settings runs no phase and leaves the numbers as they were; one with --redo
    stopped in its lesion phase keeps the first run's lesion and later phases (the redone
    gate heatmap is its own); another setting redoes only the phases that depend on it."""
    from rhnzoo.analysis import report

    workdir, data_dir, _ = run
    out = tmp_path / "out"
    calls = []
    opts = report.AnalysisOptions(
        data_dir=str(data_dir),
        verify=False,
        lesion_tokens=400,
        lesion_batch_size=4,
        eval_num_steps=50,
        heatmap_steps=10,
        hist_tokens=100,
        hist_times=20,
        mc_samples=1,
        max_eval_tokens=100,
        track=recording_track(calls),
    )
    first = report.analyze(workdir, out, opts)
    names = ["gate_heatmap", "lesion", "hsg_gate", "deterministic", "mc_dropout"]
    assert {n for n, *_ in calls} == set(names) - {"gate_heatmap"}  # one pass, no bar
    written = json.loads((out / "analysis.json").read_text())
    assert sorted(written["phases"]) == sorted(names) and written["complete"] is True
    capsys.readouterr()

    calls.clear()
    assert report.analyze(workdir, out, opts) == written  # nothing recomputed
    assert calls == [] and json.loads((out / "analysis.json").read_text()) == written
    said = capsys.readouterr().out
    assert all(f"{n}: kept from the earlier analysis of this checkpoint" in said for n in names)

    signals.catch_signals()
    try:
        with pytest.raises(signals.Interrupted):
            report.analyze(
                workdir, out, dataclasses.replace(opts, redo=True, track=sigterm_in("lesion", at=3))
            )
    finally:
        signals.release_signals()
    merged = json.loads((out / "analysis.json").read_text())
    assert merged["interrupted"] == {"phase": "lesion", "signal": signal.SIGTERM}
    assert merged["complete"] is False
    assert {n: p["status"] for n, p in merged["phases"].items()} == dict.fromkeys(names, "done")
    for key in ("lesion", "hsg_gate", "deterministic", "mc_dropout"):
        assert merged[key] == first[key] and merged["phases"][key] == first["phases"][key]
    assert merged["phases"]["gate_heatmap"]["seconds"] != first["phases"]["gate_heatmap"]["seconds"]
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .endswith("and lesion as the earlier analysis left it")
    )

    calls.clear()
    again = report.analyze(workdir, out, dataclasses.replace(opts, mc_samples=2))
    assert {n for n, *_ in calls} == {"mc_dropout"}  # the one phase that depends on K
    assert again["complete"] is True and "interrupted" not in again
    assert len(again["mc_dropout"]["sample_ppls"]) == 2 and again["lesion"] == first["lesion"]


def test_flow_figures_keep_the_families_drawn_and_redo_them_when_asked(
    tmp_path, capsys, monkeypatch
):
    """Issue 62 item 1 for --flow: a second call with the same settings draws nothing and
    leaves flow.json as it was; other settings (flow_steps) or --redo draw again; a
    deleted figure is drawn again too (one cell family: the rule, not the cells)."""
    from rhnzoo.analysis import report

    monkeypatch.setattr(report, "FAMILIES", {"GRU": ("gru", {})})
    calls = []
    opts = report.AnalysisOptions(flow_hidden=3, flow_steps=4, track=recording_track(calls))
    first = report.flow_figures(None, tmp_path, opts)
    written = (tmp_path / "flow.json").read_text()
    assert [c[0] for c in calls] == ["gradient_flow"]
    calls.clear()
    assert report.flow_figures(None, tmp_path, opts) == first and calls == []
    assert (tmp_path / "flow.json").read_text() == written
    assert "gradient_flow: kept from the earlier analysis" in capsys.readouterr().out
    for again in (dataclasses.replace(opts, redo=True), dataclasses.replace(opts, flow_steps=3)):
        report.flow_figures(None, tmp_path, again)
        assert [c[0] for c in calls] == ["gradient_flow"]
        calls.clear()
    (tmp_path / "gradient_flow.png").unlink()
    report.flow_figures(None, tmp_path, dataclasses.replace(opts, flow_steps=3))
    assert [c[0] for c in calls] == ["gradient_flow"] and (tmp_path / "gradient_flow.png").is_file()


@pytest.mark.slow
def test_analyze_flow_draws_gradient_flow_and_gersgorin(run, tmp_path):
    """--flow: every cell family at initialisation, plus the run's cell at init and trained;
    the Gersgorin panel's eigenvalues lie in its discs (checked on the numbers written)."""
    workdir, data_dir, _ = run
    out = cli(
        "analyze.py",
        "--flow",
        f"--workdir={workdir}",
        f"--out={tmp_path}",
        f"--data_dir={data_dir}",
        "--noverify",
        "--flow_hidden=6",
        "--flow_steps=12",
        "--flow_tokens=8",
    )
    assert png_shape(tmp_path / "gradient_flow.png")[:2] == (450, 700)
    assert png_shape(tmp_path / "gersgorin.png")[:2] == (450, 900)  # two 4.5-inch panels
    numbers = json.loads((tmp_path / "flow.json").read_text())
    curves = numbers["gradient_norms_at_init"]
    assert len(curves) == 10 and all(
        len(c) == 13 and c[0] == pytest.approx(1.0) for c in curves.values()
    )
    for name in ("initialisation", "trained"):
        rho = numbers["run"][name]["spectral_radius"]
        sigma = numbers["run"][name]["largest_singular_value"]
        assert len(rho) == 9 and all(r <= s + 1e-6 for r, s in zip(rho, sigma))
    assert "wrote" in out and (tmp_path / "flow.json").is_file()


@pytest.mark.slow
def test_analyze_flow_with_few_steps_and_a_bad_count(tmp_path):
    """--flow_steps under 10 draws the figure (it ended in an IndexError); a bad count is
    one error line before anything is written."""
    cli("analyze.py", "--flow", f"--out={tmp_path / 'ok'}", "--flow_hidden=4", "--flow_steps=5")
    assert (
        len(
            json.loads((tmp_path / "ok" / "flow.json").read_text())["gradient_norms_at_init"][
                "LSTM"
            ]
        )
        == 6
    )
    bad = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "analyze.py"),
            "--flow",
            f"--out={tmp_path / 'bad'}",
            "--lesion_tokens=-1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: --lesion_tokens must be >= 1, got -1"
    ]
    assert not (tmp_path / "bad").exists()


def test_plot_helpers_pixel_size(tmp_path):
    records = [{"epoch": e, "valid_ppl": 300.0 / e} for e in (1, 2, 3)]
    path = analysis.plot_learning_curves({"a": records}, tmp_path / "c.png", figsize=(5, 3), dpi=80)
    assert png_shape(path)[:2] == (240, 400)
    path = analysis.plot_ppl_vs_depth({"RHN": {10: 70.0}}, tmp_path / "d.png", dpi=50)
    assert png_shape(path)[:2] == (200, 320)
    path = analysis.plot_gate_histogram(np.linspace(0, 1, 100), tmp_path / "h.png", dpi=50)
    assert png_shape(path)[:2] == (200, 320)


def drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def test_lesion_bar_labels_overlap_no_other_text():
    """The tallest bar (the last) keeps its label inside the axes, clear of the title and
    of the note, which the x-axis label carries."""
    from rhnzoo.analysis import plots

    result = analysis.LesionResult(4.0, np.array([4.1, 4.05, 4.3, 4.2, 9.9]), 100)
    fig = plots._lesion_figure(
        result, "RHN+HSG depth 40: lesioning (intact ppl 54.6)", (6.4, 4.0), 100
    )
    renderer = drawn(fig)
    (ax,) = fig.axes
    assert "bar labels: perplexity" in ax.get_xlabel()
    texts = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(texts) == 5, "only the bar labels are drawn in the axes"
    inside, title = ax.get_window_extent(renderer), ax.title.get_window_extent(renderer)
    for i, box in enumerate(texts):
        assert inside.y0 <= box.y0 and box.y1 <= inside.y1 and not box.overlaps(title), i
        assert not any(box.overlaps(other) for other in texts[i + 1 :]), i


def test_gradient_flow_legend_is_outside_the_axes_and_the_label_is_mathtext():
    from rhnzoo.analysis import plots, report

    labels = [
        *report.FAMILIES,
        "RHN+HSG depth 40, initialisation (valid)",
        "RHN+HSG depth 40, trained (valid)",
    ]
    curves = {label: np.exp(-0.02 * (i + 1) * np.arange(101)) for i, label in enumerate(labels)}
    fig = plots._gradient_flow_figure(
        curves,
        "Gradient flow: cells at initialisation (64 units) and a trained run",
        (7.0, 4.5),
        100,
    )
    renderer = drawn(fig)
    (ax,) = fig.axes
    legend = ax.get_legend().get_window_extent(renderer)
    assert not legend.overlaps(ax.get_window_extent(renderer))
    assert legend.x1 <= fig.bbox.x1 and legend.y0 >= 0
    title = fig._suptitle.get_window_extent(renderer)
    assert title.x0 >= 0 and title.x1 <= fig.bbox.x1
    assert ax.get_ylabel() == r"$\Vert\partial L_T / \partial s_{T-k}\Vert$"


def fake_run(root, name, depth, hsg, results=None, epochs=()):
    workdir = root / name
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps({"depth": depth, "hsg": hsg}))
    if results is not None:
        (workdir / "results.json").write_text(json.dumps(results))
    lines = [json.dumps({"kind": "epoch", "epoch": e, "valid_ppl": v}) for e, v in epochs]
    (workdir / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))


def test_sweep_table_fills_only_measured_cells(tmp_path):
    root = tmp_path / "sweep"
    fake_run(root, "a", 10, False, {"valid_ppl": 68.04, "test_ppl": 65.96}, [(1, 200), (2, 120)])
    fake_run(root, "b", 40, True, {"valid_ppl": 64.26, "test_ppl": 62.14}, [(1, 150), (2, 90)])
    fake_run(root, "c", 20, True, None, [(1, 180)])  # still running: no results.json
    fake_run(root, "d", 3, False, {"valid_ppl": 101.0, "test_ppl": 97.5})
    out = cli("sweep.py", f"--root={root}", "--table")
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in out.splitlines()
        if line.startswith("|")
    ]
    z, s = "65.4 (Zilly et al. 2017, RHN)", "61.7 (Shoham & Permuter, RHN+HSG)"
    assert rows[2:] == [
        ["3", "101.0", "97.5", "—", "—", "—"],
        ["10", "68.0", "66.0", "—", "—", z],
        ["20", "—", "—", "—", "—", "—"],
        ["30", "—", "—", "—", "—", "—"],
        ["40", "—", "—", "64.3", "62.1", s],
    ]
    assert "no results.json yet (not in the table): c" in out
    assert png_shape(root / "learning_curves.png")[:2] == (400, 640)
    assert png_shape(root / "ppl_vs_depth.png")[:2] == (400, 640)


def test_sweep_table_shows_the_mean_and_sd_over_seeds(tmp_path):
    import statistics

    root = tmp_path / "sweep"
    fake_run(root, "d10_rhn", 10, False, {"valid_ppl": 68.0, "test_ppl": 66.0})
    fake_run(root, "d10_rhn_s1", 10, False, {"valid_ppl": 70.0, "test_ppl": 67.5})
    (root / "d10_rhn_s1" / "config.json").write_text(
        json.dumps({"depth": 10, "hsg": False, "seed": 1})
    )
    fake_run(root, "z_copy", 10, False, {"valid_ppl": 1.0, "test_ppl": 1.0})  # seed 0 again
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "sweep.py"),
            f"--root={root}",
            "--table",
            "--depths=10",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (row,) = [line for line in out.stdout.splitlines() if line.startswith("| 10 ")]
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    mean_sd = lambda *v: f"{statistics.mean(v):.1f} ± {statistics.stdev(v):.1f} (n=2)"
    assert cells[1:3] == [mean_sd(68.0, 70.0), mean_sd(66.0, 67.5)]
    assert "z_copy repeats depth 10 hsg=False seed 0; showing" in out.stderr


def test_sweep_dry_run_lists_eight_commands(tmp_path):
    out = cli("sweep.py", f"--root={tmp_path}", "--dry_run", "--", "--preset=small", "--seed=3")
    lines = out.strip().splitlines()
    assert len(lines) == 8
    seen = set()
    for line in lines:
        args = line.split()
        assert args[1].endswith("experiments/ptb.py") and args[-2:] == [
            "--preset=small",
            "--seed=3",
        ]
        depth = next(int(a.split("=")[1]) for a in args if a.startswith("--depth="))
        hsg = "--hsg" in args
        assert ("--nohsg" in args) != hsg
        seen.add((depth, hsg, next(a for a in args if a.startswith("--workdir="))))
    assert {(d, h) for d, h, _ in seen} == {(d, h) for d in (10, 20, 30, 40) for h in (0, 1)}
    assert len({w for *_, w in seen}) == 8
    assert not any(tmp_path.iterdir()), "a dry run writes nothing"
    seeds = (
        cli(
            "sweep.py",
            f"--root={tmp_path}",
            "--dry_run",
            "--depths=10",
            "--seeds=2",
            "--",
            "--seed=3",
        )
        .strip()
        .splitlines()
    )
    assert len(seeds) == 4 and [line.split()[-1] for line in seeds[1::2]] == ["--seed=4"] * 2
    assert [a for a in seeds[1].split() if a.startswith("--workdir=")] == [
        f"--workdir={tmp_path / 'd10_rhn_s1'}"
    ]
