"""Issue 15: the paper's Table 3, Word2Vec trained on the training split, the RRN recipe
options (orthogonal U, bias of F), input dropout, the studies of experiments/rrl.py."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import write_random_mnist

from rhnzoo import cells
from rhnzoo.data import sequences, word2vec
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.configs import rrl as presets
from rhnzoo.studies import rrl_table3
from rhnzoo.tasks import rrl
from rhnzoo.engine import workdir as workdir_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAPER = ROOT.parent / "shared" / "papers" / "004_b303ba294415a388.txt"


@pytest.mark.skipif(not PAPER.is_file(), reason=f"{PAPER} (the paper's text) is not here")
def test_paper_table3_is_the_papers_table():
    """PAPER_TABLE3 against the rows of Table 3 as the paper's text file prints them."""
    labels = {
        "LSTM": "lstm",
        "RRN": "rrn",
        "SC-LSTM-P": "sc_lstm_p",
        "SC-LSTM-I": "sc_lstm_i",
        "LSTM+GRU": "lstm_gru",
        "HRL": "hrl",
    }
    text = PAPER.read_text().split("Table 2: Model Sizes")[1].split("Table 3:")[0]
    rows = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if parts[0] in labels:
            rows[labels[parts[0]]] = [float(p.rstrip("%")) for p in parts[1:]]
    assert len(rows) == 6
    for model, accs in rows.items():
        for dataset, acc in zip(("agnews", "imdb", "20ng", "pmnist"), accs):
            assert rrl_table3.PAPER_TABLE3[(model, dataset)] == acc
    assert len(rrl_table3.PAPER_TABLE3) == 24


def test_rrn_recurrent_init_and_f_bias():
    n, K = 16, 3
    plain = cells.RRN(n, depth=K).init(jax.random.PRNGKey(0), 5)
    np.testing.assert_array_equal(plain["b"], 0.0)  # eq. 4 as written: zero biases
    assert float(jnp.abs(plain["U"]).max()) <= 0.04
    p = cells.RRN(n, depth=K, recurrent_init="orthogonal", f_bias=-3.0).init(
        jax.random.PRNGKey(0), 5
    )
    for k in range(K):
        np.testing.assert_allclose(p["U"][k] @ p["U"][k].T, np.eye(n), atol=1e-5)
    assert not np.allclose(p["U"][0], p["U"][1])
    np.testing.assert_array_equal(p["b"][: (K - 1) * n], 0.0)
    np.testing.assert_array_equal(p["b"][(K - 1) * n :], -3.0)  # only F's last layer, b_K
    with pytest.raises(ValueError, match="recurrent_init"):
        cells.RRN(n, recurrent_init="identity")


def test_the_rrn_options_reach_the_hybrid():
    hrl = presets.RRLConfig(
        model="hrl",
        hidden_size=8,
        hybrid_hidden_size=6,
        rrn_recurrent_init="orthogonal",
        rrn_f_bias=-2.0,
    ).cell()
    rrn = hrl.cells[1]
    assert (rrn.recurrent_init, rrn.f_bias, rrn.hidden_size) == ("orthogonal", -2.0, 6)


class _Echo:
    """A cell whose state and output are its last input (any protocol user accepts it)."""

    hidden_size = 50

    def init(self, key, input_size):
        return {}

    def initial_carry(self, batch_size, dtype=jnp.float32):
        return jnp.zeros((batch_size, self.hidden_size), dtype)

    def project_inputs(self, params, xs):
        return xs

    def step(self, params, carry, x, mask=None):
        return x, x


def test_input_dropout_drops_input_units_only_in_training():
    model = SequenceClassifier(_Echo(), 2, 50, vocab_size=9, input_drop=0.5)
    params = model.init(jax.random.PRNGKey(0))
    inputs, lengths = jnp.tile(jnp.arange(2, 8), (40, 1)), jnp.full(40, 6)
    embedded = np.asarray(params["embed"][7])  # the last step's word
    np.testing.assert_array_equal(
        model.features(params, inputs, lengths), np.broadcast_to(embedded, (40, 50))
    )  # no key: no dropout
    h = np.asarray(model.features(params, inputs, lengths, jax.random.PRNGKey(3)))
    kept = h != 0
    assert 0.4 < kept.mean() < 0.6  # element-wise, rate 0.5
    np.testing.assert_allclose(h[kept], 2 * np.broadcast_to(embedded, h.shape)[kept], rtol=1e-6)


class _Ones(_Echo):
    """A cell whose output is 1 whatever its input (input dropout leaves it unchanged)."""

    def step(self, params, carry, x, mask=None):
        return jnp.ones_like(x), jnp.ones_like(x)


def _identity_readout(model):
    """``model``'s parameters with ``W_out = I``, ``b_out = 0``: the logits are the
    (dropped-out) representation itself."""
    params = model.init(jax.random.PRNGKey(0))
    return {**params, "W_out": jnp.eye(50), "b_out": jnp.zeros(50)}


def test_each_dropout_mask_is_the_same_whether_or_not_the_other_site_drops():
    """The output-dropout mask for a key is the same with input dropout off and on, and
    the input-dropout mask the same with output dropout off and on (the output mask read
    through a cell whose output ignores its input, the input mask through one that
    echoes it; the softmax layer the identity)."""
    inputs, lengths, key = jnp.tile(jnp.arange(2, 8), (40, 1)), jnp.full(40, 6), jax.random.key(5)
    out_mask = {}
    for input_drop in (0.0, 0.3):
        model = SequenceClassifier(_Ones(), 50, 50, vocab_size=9, drop=0.5, input_drop=input_drop)
        out_mask[input_drop] = np.asarray(
            model.logits(_identity_readout(model), inputs, lengths, key)
        )
    assert set(np.unique(out_mask[0.0])) == {0.0, 2.0}  # a mask at rate 0.5, scaled
    np.testing.assert_array_equal(out_mask[0.3], out_mask[0.0])
    echoed = {}
    for drop in (0.0, 0.5):
        model = SequenceClassifier(_Echo(), 50, 50, vocab_size=9, drop=drop, input_drop=0.3)
        echoed[drop] = np.asarray(model.logits(_identity_readout(model), inputs, lengths, key))
    assert 0.5 < (echoed[0.0] != 0).mean() < 0.9  # the input mask, rate 0.3
    np.testing.assert_allclose(echoed[0.5], echoed[0.0] * out_mask[0.0], rtol=1e-6)


def _topic_corpus(rng, n_docs=300):
    """Two topics with disjoint words (ids 2-11 and 12-21): a doc uses one topic."""
    vocab = ("<pad>", "<unk>") + tuple(f"w{i}" for i in range(2, 22))
    docs = []
    for d in range(n_docs):
        low = 2 if d % 2 else 12
        docs.append(rng.integers(low, low + 10, 30).astype(np.int32))
    return docs, vocab


def test_word2vec_learns_the_training_text_deterministically_and_caches(tmp_path, monkeypatch):
    pytest.importorskip("gensim")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    docs, vocab = _topic_corpus(np.random.default_rng(0))
    lines = []
    vectors, found = word2vec.train_word2vec(docs, vocab, 8, dataset="toy", log=lines.append)
    assert found[2:].all() and not found[:2].any()  # <pad>, <unk> never occur
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
    cos = unit @ unit.T
    same = np.mean([cos[i, j] for i in range(2, 12) for j in range(2, 12) if i != j])
    across = np.mean([cos[i, j] for i in range(2, 12) for j in range(12, 22)])
    assert same > across + 0.3, (same, across)
    cached = list((tmp_path / "rhnzoo" / "toy" / "word2vec").glob("8d_*.bin"))
    assert len(cached) == 1 and "trained" in lines[0]
    again, found2 = word2vec.train_word2vec(docs, vocab, 8, dataset="toy", log=lines.append)
    assert "cached" in lines[1]
    np.testing.assert_array_equal(again, vectors)
    np.testing.assert_array_equal(found2, found)
    fresh, _ = word2vec.train_word2vec(docs, vocab, 8, dataset="toy", cache=False, log=print)
    np.testing.assert_array_equal(fresh, vectors)  # deterministic: the same on a fresh run
    other, _ = word2vec.train_word2vec(docs[:-1], vocab, 8, dataset="toy", log=lines.append)
    assert "trained" in lines[2]  # other documents: another cache entry


def test_embeddings_come_from_the_training_split_only(tmp_path, monkeypatch):
    pytest.importorskip("gensim")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    docs, vocab = _topic_corpus(np.random.default_rng(1))
    train_docs = [d[d < 20] for d in docs]  # words 20, 21 only in dev / test
    split = lambda ds: sequences.Split(ds, np.zeros(len(ds), np.int32))
    data = sequences.Dataset(split(train_docs), split(docs), split(docs), 2, vocab, None)
    config = presets.RRLConfig(embeddings="word2vec", embed_size=6, dataset="imdb")
    vectors, found = rrl.embeddings_for(config, data, log=lambda line: None)
    assert found[2:20].all() and not found[20:].any()
    assert rrl.embeddings_for(config.replace(embeddings="random"), data) is None
    pixels = sequences.Dataset(*(split([np.zeros((3, 1), np.float32)]),) * 3, 10, None, 1)
    assert rrl.embeddings_for(config, pixels) is None


def test_every_study_setting_is_a_valid_config():
    base = dict(
        dataset="imdb",
        embed_size=8,
        hidden_size=8,
        hybrid_hidden_size=6,
        rrn_depth=2,
        rrn_activation="sigmoid",
        rrn_recurrent_init="uniform",
        rrn_f_bias=0.0,
        skip=20,
        forget_bias=1.0,
        init_scale=0.1,
        drop=0.5,
        input_drop=0.0,
        batch_size=4,
        max_len=40,
        keep="last",
        buckets=2,
        lr=1.0,
        adadelta_eps=1e-6,
        max_grad_norm=5.0,
        epochs=2,
        subset=None,
        embeddings="word2vec",
        freeze_embeddings=False,
        patience=None,
        divergence_factor=2.0,
    )
    for (study, dataset), spec in presets.STUDIES.items():
        for name, overrides in spec["settings"].items():
            overrides = dict(overrides)
            model = overrides.pop("model", spec["model"])
            assert set(overrides) | set(spec["budget"]) <= set(base), (study, name)
            presets.RRLConfig.from_dict({**base, **spec["budget"], **overrides, "model": model})


def test_subset_is_a_fixed_sample_of_the_training_split():
    split = sequences.Split([np.full(2, i, np.int32) for i in range(50)], np.arange(50) % 2)
    data = sequences.Dataset(split, split, split, 2, ("<pad>", "<unk>"), None)
    a, b = rrl.subset(data, 20), rrl.subset(data, 20)
    assert len(a.train.labels) == 20 and a.dev is data.dev
    assert [x[0] for x in a.train.inputs] == [x[0] for x in b.train.inputs]
    assert len({int(x[0]) for x in a.train.inputs}) == 20
    assert rrl.subset(data, None) is data and rrl.subset(data, 80) is data


def test_eval_subset_is_a_fixed_sample_of_dev_and_test_and_what_the_run_evaluates():
    # Smoke windows (tools.harvest) evaluate 160 sequences, not all 19,000 of P-MNIST.
    split = lambda n, k: sequences.Split(
        [np.full(2, i, np.int32) for i in range(n)], (np.arange(n) + k) % 2
    )
    data = sequences.Dataset(split(40, 0), split(50, 1), split(60, 0), 2, tuple("abcdefgh"), None)
    a, b = rrl.eval_subset(data, 20), rrl.eval_subset(data, 20)
    assert a.train is data.train and (len(a.dev.labels), len(a.test.labels)) == (20, 20)
    for cut, full in ((a.dev, data.dev), (a.test, data.test)):
        kept = [int(x[0]) for x in cut.inputs]
        assert kept == sorted(set(kept)) and len(kept) == 20  # a sample, in its order
        assert list(cut.labels) == [full.labels[i] for i in kept]
    assert [x[0] for x in a.test.inputs] == [x[0] for x in b.test.inputs]
    assert rrl.eval_subset(data, None) is data and rrl.eval_subset(data, 60) is data
    lines = []
    config = presets.RRLConfig(
        model="lstm",
        hidden_size=4,
        embed_size=4,
        embeddings="random",
        batch_size=4,
        max_len=2,
        buckets=1,
        epochs=1,
        max_steps=1,
        eval_subset=8,
        progress=False,
    )
    run = rrl.train_and_evaluate(config, data, log=lines.append)
    assert "40 train / 8 dev / 8 test sequences" in lines[0], lines
    assert {"dev_acc", "test_acc"} <= set(run.results)


@pytest.mark.slow
def test_study_mode_runs_every_setting_and_prints_its_table(tmp_path):
    write_random_mnist(tmp_path / "mnist", train=60, test=10)
    args = [
        sys.executable,
        str(ROOT / "experiments" / "rrl.py"),
        "--dataset=pmnist",
        "--study=skip",
        "--hidden_size=4",
        "--max_len=16",
        "--batch_size=20",
        "--max_steps=1",
        "--noprogress",
        f"--data_dir={tmp_path / 'mnist'}",
        "--noverify_data",
        "--nodownload",
        f"--workdir={tmp_path / 'root'}",
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [l for l in out.stdout.splitlines() if re.match(r"\| L\d+ \|", l)]
    assert [r.split("|")[1].strip() for r in rows] == ["L10", "L20", "L50"], out.stdout
    assert all("—" not in r.split("|")[3] for r in rows)  # a test accuracy in every row
    for L in (10, 20, 50):
        config = json.loads(
            (tmp_path / "root" / "study_skip" / f"L{L}" / "config.json").read_text()
        )
        assert (config["model"], config["skip"], config["subset"]) == ("sc_lstm_i", L, 12000)
    assert (tmp_path / "root" / "study_skip" / "table.md").read_text().count("| L") == 3


def test_frozen_embeddings_do_not_move_and_the_rest_trains():
    import optax

    params = {"embed": jnp.ones((4, 3)), "W": jnp.ones((3, 2))}
    grads = {"embed": jnp.full((4, 3), 100.0), "W": jnp.full((3, 2), 0.5)}
    for freeze in (False, True):
        tx = presets.TrainConfig(freeze_embeddings=freeze, max_grad_norm=1.0).optimizer()
        updates, _ = tx.update(grads, tx.init(params), params)
        new = optax.apply_updates(params, updates)
        moved = lambda k: float(jnp.abs(new[k] - params[k]).max())
        assert moved("W") > 0 and (moved("embed") == 0) == freeze
    # Frozen: the clipping norm ignores the embedding's (large) gradient, so W's update is
    # the one it gets when it is the only parameter.
    alone = presets.TrainConfig(max_grad_norm=1.0).optimizer()
    w_only = {"W": params["W"]}
    u_alone, _ = alone.update({"W": grads["W"]}, alone.init(w_only), w_only)
    tx = presets.TrainConfig(freeze_embeddings=True, max_grad_norm=1.0).optimizer()
    u, _ = tx.update(grads, tx.init(params), params)
    np.testing.assert_allclose(u["W"], u_alone["W"], rtol=1e-6)


# ------------------------------------------------------------- the config and its presets

RUNS = ROOT / "docs" / "runs" / "rrl"


def test_config_round_trips_and_refuses_unknown_keys_in_one_line():
    config = presets.RRLConfig(model="hrl", dataset="pmnist", hidden_size=7, subset=30, seed=3)
    assert presets.RRLConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"^unknown RRLConfig setting\(s\): hiden_size$"):
        presets.RRLConfig.from_dict({**config.to_dict(), "hiden_size": 8})
    # config.json holds every setting, each once under its flag's name.
    assert list(config.to_dict()) == [f.name for f in dataclasses.fields(presets.RRLConfig)]
    assert config.to_dict()["adadelta_eps"] == 1e-6 and "eps" not in config.to_dict()
    fused = config.replace(scan_impl="fused", dtype="bfloat16").to_dict()
    assert (fused["scan_impl"], fused["dtype"]) == ("fused", "bfloat16")
    assert presets.RRLConfig.from_dict(fused).scan_impl == "fused"


def test_the_training_settings_are_the_configs_own():
    """An RRLConfig is the TrainConfig the task reads: Adadelta's eps is --adadelta_eps,
    its rho 0.95."""
    import optax

    config = presets.RRLConfig(adadelta_eps=0.5, lr=2.0, max_grad_norm=100.0)
    assert isinstance(config, presets.TrainConfig)
    params, grads = {"W": jnp.zeros(3)}, {"W": jnp.array([1.0, -2.0, 0.0])}
    updates, _ = config.optimizer().update(grads, config.optimizer().init(params), params)
    direct = optax.adadelta(learning_rate=2.0, rho=0.95, eps=0.5)
    expect, _ = direct.update(grads, direct.init(params), params)
    np.testing.assert_allclose(updates["W"], expect["W"], rtol=1e-6)
    assert float(jnp.abs(updates["W"]).max()) > 0


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"model": "transformer"}, "unknown cell 'transformer'"),
        # (a field's own type, bounds and choices: tests/test_config_contract.py's)
        ({"input_drop": 1.5}, "--input_drop must be a drop probability in [0, 1), got 1.5"),
        ({"divergence_factor": 0.5}, "--divergence_factor must be 0 (off) or a finite number >= 1"),
        (
            {"model": "rrn", "dtype": "bfloat16", "scan_impl": "reference"},
            "needs the fused or pallas scan",
        ),
        ({"model": "dtrnn", "scan_impl": "fused"}, "scan_impl='fused' cannot run DTRNN"),
    ],
)
def test_a_bad_setting_is_one_line_on_construction(changes, message):
    with pytest.raises(ValueError) as e:
        presets.RRLConfig(**changes)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(not RUNS.is_dir(), reason=f"{RUNS} is not here")
def test_the_recorded_runs_configs_are_read_as_they_are_and_resume(tmp_path):
    """Every config.json of docs/runs/rrl (written before RRLConfig existed) is a config;
    its keys keep their values, the keys added since take their defaults, and a workdir
    holding it resumes under that config."""

    paths = sorted(RUNS.rglob("config.json"))
    assert paths
    for path in paths:
        recorded = json.loads(path.read_text())
        config = presets.RRLConfig.from_dict(recorded)
        written = config.to_dict()
        assert {k: written[k] for k in recorded} == recorded, path
        assert config.conflicts(recorded) == [], path
    workdir = tmp_path / "old"
    workdir.mkdir()
    (workdir / "config.json").write_text(path.read_text())
    (workdir / "checkpoints" / "1").mkdir(parents=True)  # a run there: settings count
    workdir_lib.prepare_workdir(workdir, config, check_only=True)  # raises if incompatible
    with pytest.raises(ValueError, match="incompatible run"):
        workdir_lib.prepare_workdir(workdir, config.replace(hidden_size=7), check_only=True)


def _workdir_with_a_run(tmp_path, recorded):
    """A workdir whose ``config.json`` is ``recorded`` and which holds a checkpoint."""
    workdir = tmp_path / "w"
    (workdir / "checkpoints" / "1").mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(recorded))
    return workdir


def test_a_workdir_written_before_later_settings_resumes(tmp_path):
    """config.json without the settings added since (dtype, hybrid_embed_size, scan_impl,
    matmul_precision, preset): each counts as its default, so the run resumes, also
    with other resumable settings (length, scan, root, data flags); the resumed run's
    config.json then holds every setting."""

    config = presets.get_config("cpu", "pmnist", model="sc_lstm_i", hidden_size=6)
    later = ("dtype", "hybrid_embed_size", "scan_impl", "matmul_precision", "preset")
    recorded = {k: v for k, v in config.to_dict().items() if k not in later}
    workdir = _workdir_with_a_run(tmp_path, recorded)
    resumed = config.replace(
        max_steps=5,
        scan_impl="reference",
        workdir="elsewhere",
        data_dir="/data",
        patience=2,
        progress=False,
    )
    workdir_lib.prepare_workdir(workdir, resumed, check_only=True)
    workdir_lib.prepare_workdir(workdir, resumed)
    now = json.loads((workdir / "config.json").read_text())
    assert (now["dtype"], now["scan_impl"], now["max_steps"], now["preset"]) == (
        "float32",
        "reference",
        5,
        "cpu",
    )


@pytest.mark.parametrize(
    "change",
    [
        {"hidden_size": 7},
        {"adadelta_eps": 1e-4},
        {"dtype": "bfloat16", "scan_impl": "fused"},
        {"hybrid_embed_size": 4},
    ],
)
def test_a_structural_change_is_refused_in_one_line(tmp_path, change):

    config = presets.RRLConfig(model="lstm", dataset="pmnist", hidden_size=6)
    recorded = {
        k: v for k, v in config.to_dict().items() if k not in ("dtype", "hybrid_embed_size")
    }
    workdir = _workdir_with_a_run(tmp_path, recorded)
    with pytest.raises(ValueError) as e:
        workdir_lib.prepare_workdir(workdir, config.replace(**change), check_only=True)
    message = str(e.value)
    assert "\n" not in message and "incompatible run" in message, message
    name = "dtype" if "dtype" in change else next(iter(change))
    assert f"{name}=" in message, message
    assert json.loads((workdir / "config.json").read_text()) == recorded  # left as it was


def test_the_sizes_of_the_paper_preset_are_table_2():
    """``paper`` against Wang & Tian's Table 2 (embedding x hidden; "Hybrid": HRL and
    LSTM+GRU), as the model is built: the embedding table's width and the cell's."""
    table2 = {
        "agnews": ((256, 512), (256, 384)),
        "imdb": ((256, 512), (256, 384)),
        "20ng": ((500, 768), (256, 512)),
        "pmnist": ((1, 100), (1, 80)),
    }
    for dataset, ((m, n), (hybrid_m, hybrid_n)) in table2.items():
        for name in presets.MODELS:
            c = presets.get_config("paper", dataset).replace(model=name)
            hybrid = name in ("hrl", "lstm_gru")
            assert c.cell().hidden_size == (hybrid_n if hybrid else n), (dataset, name)
            assert c.embedding_size() == (hybrid_m if hybrid else m), (dataset, name)
            if dataset == "20ng":
                model = c.classifier(20, vocab_size=30)
                shapes = jax.eval_shape(model.init, jax.random.key(0))
                assert shapes["embed"].shape == (30, hybrid_m if hybrid else m), name
    assert presets.get_config("paper", "pmnist").max_len == 784  # every pixel, one per step


def test_presets_and_the_pixel_input():
    cpu = presets.get_config("cpu", "imdb")
    assert (cpu.embed_size, cpu.hidden_size, cpu.hybrid_hidden_size, cpu.patience, cpu.preset) == (
        64,
        128,
        96,
        3,
        "cpu",
    )
    assert presets.get_config(None, "imdb") == presets.RRLConfig()
    assert presets.get_config(None, "pmnist").embed_size == 1  # one pixel per step
    assert presets.preset_overrides(None, "imdb") == {}
    given = presets.get_config("cpu", "pmnist", hidden_size=32, model="rrn")
    assert (given.hidden_size, given.model, given.embed_size, given.epochs, given.preset) == (
        32,
        "rrn",
        1,
        8,
        "cpu",
    )  # the given settings over the preset, the rest the preset's
    assert presets.RRLConfig(model="hrl", hybrid_embed_size=32).embedding_size() == 32
    assert presets.RRLConfig(model="lstm", hybrid_embed_size=32).embedding_size() == 256
    with pytest.raises(ValueError, match="^--hybrid_embed_size must be >= 1, got 0$"):
        presets.RRLConfig(hybrid_embed_size=0)
    with pytest.raises(ValueError, match="^--preset must be one of paper, cpu, got 'gpu'$"):
        presets.get_config("gpu")
    with pytest.raises(ValueError, match=r"^unknown RRLConfig setting\(s\): hiden_size$"):
        presets.get_config("cpu", "imdb", hiden_size=8)


def test_runs_are_one_config_per_model_or_per_study_setting():
    base = presets.RRLConfig(dataset="pmnist", hidden_size=6, seed=4, model="rhn", epochs=7)
    table = presets.runs(base, ["gru", "lstm", "gru"])
    assert list(table) == ["gru", "lstm"] and table["lstm"].model == "lstm"
    assert table["gru"].replace(model="lstm") == table["lstm"] == base.replace(model="lstm")
    study = presets.runs(base, ["gru"], "rrn")
    assert list(study) == list(presets.STUDIES[("rrn", "pmnist")]["settings"])
    assert {c.model for name, c in study.items() if name != "lstm_reference"} == {"rrn"}
    assert study["lstm_reference"].model == "lstm"
    eps = study["eps1e-4"]
    assert (
        eps.adadelta_eps,
        eps.subset,
        eps.epochs,
        eps.divergence_factor,
        eps.hidden_size,
        eps.seed,
    ) == (1e-4, 12000, 3, 5.0, 6, 4)  # the budget over the base
    with pytest.raises(ValueError, match="no skip study on agnews"):
        presets.runs(base.replace(dataset="agnews"), [], "skip")


def _script_config(*argv):
    """``{'config': experiments/rrl.py's base config, 'flags': its config flags}`` for
    the command line ``argv`` (parsed in a fresh process; $JAX_DEFAULT_MATMUL_PRECISION
    unset)."""
    code = (
        "import json, sys; from rhnzoo.apps import cli, rrl; rrl.define_flags(); "
        "cli.FLAGS(sys.argv); print(json.dumps({'config': rrl.config().to_dict(), "
        "'flags': rrl._NAMES}))"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_DEFAULT_MATMUL_PRECISION"}
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_the_flags_are_the_configs_fields_and_given_ones_go_over_the_preset():
    """experiments/rrl.py without flags is RRLConfig(); every field but the recorded
    preset name is a flag; with --preset the flags given (and only they) override it."""
    plain = _script_config()
    assert set(plain["flags"]) == {f.name for f in dataclasses.fields(presets.RRLConfig)} - {
        "preset"
    }
    default = "default"  # the matmul precision where JAX's is unset
    assert presets.RRLConfig.from_dict(plain["config"]) == presets.RRLConfig(
        matmul_precision=default
    )
    given = _script_config(
        "--dataset=pmnist", "--preset=cpu", "--hidden_size=32", "--model=rrn", "--epochs=10"
    )  # 10: also the default
    expect = presets.get_config(
        "cpu", "pmnist", hidden_size=32, model="rrn", epochs=10, matmul_precision=default
    )
    assert presets.RRLConfig.from_dict(given["config"]) == expect
    assert (expect.embed_size, expect.batch_size, expect.epochs) == (1, 100, 10)
