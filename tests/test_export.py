"""Export (issue 71, item 4): a language model's ``forward`` and ``step`` and a classifier's
``logits`` written as ``jax.export`` artifacts (:mod:`rhnzoo.models.export`), loaded in a
fresh Python where ``import rhnzoo`` fails, with the library's outputs; and
``experiments/export.py`` on a workdir."""

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.models import export, lm
from rhnzoo.models.classifier import SequenceClassifier
from test_bad_inputs import ROOT, run_app

V, B, T = 11, 3, 7

# The fresh process: rhnzoo made unimportable (the editable install and the checkout both),
# then the artifact's own loader, which imports jax and numpy.
NO_RHNZOO = textwrap.dedent(
    """
    import sys
    sys.modules["rhnzoo"] = None
    import os
    sys.path = [p for p in sys.path if os.path.realpath(p or ".") != {root!r}]  # the checkout
    try:
        import rhnzoo
    except ImportError:
        pass
    else:
        raise SystemExit("rhnzoo is importable")
    import numpy as np
    sys.path.insert(0, {artifact!r})
    import exported
    inputs = np.load({inputs!r})
    model = exported.load({artifact!r})
    out = {{}}
    {body}
    np.savez({out!r}, **out)
    loaded = {{m.split(".")[0] for m, module in sys.modules.items() if module is not None}}
    leaked = loaded & {{"rhnzoo", "flax", "optax", "orbax"}}
    assert not leaked, leaked
    print(",".join(model.manifest["platforms"]))
    """
)

LM_BODY = """
state = model.initial_state(inputs["tokens"].shape[0])
logits, state = model.forward(state, inputs["tokens"])
out["forward"] = np.asarray(logits)
for i, leaf in enumerate(state):
    out[f"forward_state{i}"] = np.asarray(leaf)
state, steps = model.initial_state(inputs["tokens"].shape[0]), []
for t in range(inputs["tokens"].shape[1]):
    logits, state = model.step(state, inputs["tokens"][:, t])
    steps.append(np.asarray(logits))
out["step"] = np.stack(steps, axis=1)
"""

CLASSIFIER_BODY = """
out["logits"] = np.asarray(model.logits(inputs["inputs"], inputs["lengths"]))
"""


def run_without_rhnzoo(tmp_path, artifact, inputs, body):
    """Runs ``body`` in a fresh Python that cannot import rhnzoo; returns its outputs and
    the platforms it printed."""
    np.savez(tmp_path / "inputs.npz", **inputs)
    script = NO_RHNZOO.format(
        root=str(ROOT),
        artifact=str(artifact),
        inputs=str(tmp_path / "inputs.npz"),
        out=str(tmp_path / "out.npz"),
        body=body.strip(),
    )
    (tmp_path / "load.py").write_text(script)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "load.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return dict(np.load(tmp_path / "out.npz")), proc.stdout.strip().split(",")


def random_params(model, seed=0):
    rng = np.random.default_rng(seed)
    params = model.init(jax.random.PRNGKey(seed))
    return jax.tree.map(
        lambda a: jnp.asarray(np.asarray(a) + 0.3 * rng.normal(size=a.shape), a.dtype), params
    )


# an array carry; a 4-leaf one (an int32 counter too): a fresh Python each, about 5 s
@pytest.mark.parametrize("cell", ["rhn", pytest.param("sc_lstm_i", marks=pytest.mark.slow)])
def test_an_exported_language_model_runs_without_rhnzoo(cell, tmp_path):
    opts = {"depth": 2} if cell == "rhn" else {}
    model = lm.language_model(cell, V, 8, tied=cell == "rhn", scan_impl="auto", **opts)
    params = random_params(model)
    manifest = export.export_language_model(model, params, tmp_path / "art")
    assert manifest["platforms"] == ["cpu", "cuda", "tpu"] and manifest["platforms_note"] is None
    assert sorted(p.name for p in (tmp_path / "art").iterdir()) == [
        "exported.py",
        "forward.jaxexport",
        "manifest.json",
        "params.npz",
        "step.jaxexport",
    ]
    assert json.loads((tmp_path / "art" / "manifest.json").read_text()) == manifest
    tokens = np.random.default_rng(1).integers(0, V, (B, T)).astype(np.int32)
    got, platforms = run_without_rhnzoo(tmp_path, tmp_path / "art", {"tokens": tokens}, LM_BODY)
    assert platforms == ["cpu", "cuda", "tpu"]
    carry = model.initial_carry(B)
    logits, carry_T = model.forward(params, carry, jnp.asarray(tokens))
    np.testing.assert_allclose(got["forward"], logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["step"], logits, rtol=1e-5, atol=1e-5)
    for i, leaf in enumerate(jax.tree.leaves(carry_T)):
        np.testing.assert_allclose(got[f"forward_state{i}"], leaf, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "tokens", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["tokens", "features"]
)
def test_an_exported_classifier_runs_without_rhnzoo(tokens, tmp_path):
    model = SequenceClassifier(
        cells.make("lstm", 8), 3, 5, vocab_size=20 if tokens else None, scan_impl="fused"
    )
    params = random_params(model)
    rng = np.random.default_rng(2)
    inputs = (
        rng.integers(0, 20, (4, 9)).astype(np.int32)
        if tokens
        else rng.normal(size=(4, 9, 5)).astype(np.float32)
    )
    lengths = np.array([9, 4, 1, 0], np.int32)  # rows of length 0 and 1 included
    export.export_classifier(model, params, tmp_path / "art", platforms=("cpu",))
    got, platforms = run_without_rhnzoo(
        tmp_path, tmp_path / "art", {"inputs": inputs, "lengths": lengths}, CLASSIFIER_BODY
    )
    assert platforms == ["cpu"]
    want = model.logits(params, jnp.asarray(inputs), jnp.asarray(lengths))
    np.testing.assert_allclose(got["logits"], want, rtol=1e-6, atol=1e-6)


def test_any_batch_and_window_length_in_process(tmp_path):
    """The batch and time axes are symbolic: one artifact, several shapes (deserialised
    here, the library beside it)."""
    model = lm.rhn_language_model(V, 8, 2)
    params = random_params(model)
    export.export_language_model(model, params, tmp_path, platforms=("cpu",))
    leaves = [np.asarray(a) for a in jax.tree.leaves(params)]
    forward = jax.export.deserialize(bytearray((tmp_path / "forward.jaxexport").read_bytes()))
    for b, t in ((1, 1), (2, 5), (5, 3)):
        tokens = np.random.default_rng(b).integers(0, V, (b, t)).astype(np.int32)
        logits, _ = forward.call(leaves, [np.zeros((b, 8), np.float32)], tokens)
        want, _ = model.forward(params, model.initial_carry(b), jnp.asarray(tokens))
        np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cell", ["gru", "rrn"])
def test_a_gated_fused_scan_exports_with_a_symbolic_batch(cell, tmp_path):
    # Before: the fused scan padded B to its lanes when -B % 8 * 16 <= B, a comparison
    # jax.export cannot decide for a symbolic B: GRU, RRN and HRL models did not export.
    model = lm.language_model(
        cell, V, 8, scan_impl="fused", **({"depth": 2} if cell == "rrn" else {})
    )
    params = random_params(model)
    export.export_language_model(model, params, tmp_path, platforms=("cpu",))
    leaves = [np.asarray(a) for a in jax.tree.leaves(params)]
    forward = jax.export.deserialize(bytearray((tmp_path / "forward.jaxexport").read_bytes()))
    for b, t in ((1, 1), (9, 4)):
        tokens = np.random.default_rng(b).integers(0, V, (b, t)).astype(np.int32)
        carry = model.initial_carry(b)
        logits, _ = forward.call(leaves, jax.tree.leaves(carry), tokens)
        want, _ = model.forward(params, carry, jnp.asarray(tokens))
        np.testing.assert_allclose(logits, want, rtol=1e-6, atol=1e-6)


def test_a_lowering_that_fails_falls_back_to_the_cpu(tmp_path, monkeypatch):
    real = jax.export.export

    def cpu_only(fn, *, platforms=None, **kw):
        if platforms and tuple(platforms) != ("cpu",):
            raise NotImplementedError("no lowering rule for the op on tpu")
        return real(fn, platforms=platforms, **kw)

    monkeypatch.setattr(export.jax_export, "export", cpu_only)
    model = lm.rhn_language_model(V, 8, 1)
    manifest = export.export_language_model(
        model, model.init(jax.random.PRNGKey(0)), tmp_path, platforms=("cpu", "tpu")
    )
    assert manifest["platforms"] == ["cpu"]
    assert "exported for cpu only" in manifest["platforms_note"]
    assert "no lowering rule" in manifest["platforms_note"]


def test_parameters_of_another_model_are_refused(tmp_path):
    model = lm.rhn_language_model(V, 8, 2)
    other = lm.rhn_language_model(V, 8, 3).init(jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="do not have the model's structure and shapes"):
        export.export_language_model(model, other, tmp_path)
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------- experiments/export.py


def test_export_py_writes_a_runs_best_model(tiny_lm_run, monkeypatch, capfd, tmp_path):
    from rhnzoo.analysis import lm as lm_analysis

    workdir, _, corpus = tiny_lm_run
    argv = [f"--workdir={workdir}", f"--out={tmp_path / 'art'}", "--platforms=cpu"]
    end, out, err = run_app("export.py", argv, monkeypatch, capfd, tmp_path)
    assert end is None, (end, err)
    assert out.startswith(f"exported forward, step of {workdir} to {tmp_path / 'art'} for cpu")
    assert json.loads((tmp_path / "art" / "vocab.json").read_text()) == list(corpus.vocab)
    manifest = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert manifest["model"]["dataset"] == "ptb" and manifest["model"]["vocab_size"] == len(
        corpus.vocab
    )
    model, params, _ = lm_analysis.load_run(workdir)
    stored = np.load(tmp_path / "art" / "params.npz")
    for i, leaf in enumerate(jax.tree.leaves(params)):
        np.testing.assert_array_equal(stored[f"p{i}"], leaf)


@pytest.mark.parametrize("what", ["missing", "no checkpoint", "images"])
def test_export_py_refuses_a_workdir_without_a_model(
    what, tiny_lm_run, monkeypatch, capfd, tmp_path
):
    workdir = tmp_path / "w"
    if what != "missing":
        workdir.mkdir()
        config = {"dataset": "mnist"} if what == "images" else None
        text = json.dumps(config) if config else (tiny_lm_run[0] / "config.json").read_text()
        (workdir / "config.json").write_text(text)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    end, out, err = run_app("export.py", [f"--workdir={workdir}"], monkeypatch, capfd, tmp_path)
    expected = {
        "missing": "has no config.json",
        "no checkpoint": "has no checkpoint",
        "images": "is a feed-forward run (mnist)",
    }[what]
    assert end is not None and isinstance(end.code, str), (end, err)
    assert end.code.startswith("error: ") and "\n" not in end.code and expected in end.code
    assert out == "" and err == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_export_run_rebuilds_a_classifier_run(tmp_path, monkeypatch):
    """An ``rrl.py`` workdir: the classifier from its config.json and the shapes of its
    checkpoint (the checkpoint stood in for here: training one costs a data set)."""
    from rhnzoo.apps import export as export_app
    from rhnzoo.configs import rrl as rrl_configs

    config = rrl_configs.get_config(None, "imdb", model="lstm", hidden_size=8, embed_size=6)
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    model = config.classifier(2, None, 30)
    params = random_params(model)
    monkeypatch.setattr(export_app.workdir_lib, "restore_params", lambda workdir: params)
    manifest = export_app.export_run(tmp_path, tmp_path / "art", ("cpu",))
    assert list(manifest["functions"]) == ["logits"]
    assert manifest["model"]["vocab_size"] == 30 and manifest["model"]["input_size"] == 6
    exp = jax.export.deserialize(bytearray((tmp_path / "art" / "logits.jaxexport").read_bytes()))
    tokens = np.random.default_rng(0).integers(0, 30, (2, 5)).astype(np.int32)
    lengths = np.array([5, 2], np.int32)
    got = exp.call([np.asarray(a) for a in jax.tree.leaves(params)], tokens, lengths)
    want = model.logits(params, jnp.asarray(tokens), jnp.asarray(lengths))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
