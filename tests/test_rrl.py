"""Recurrent Residual Learning experiments: the sequence classifier, length-bucketed
batches, the task on the run engine, word2vec vectors, experiments/rrl.py."""

import functools
import json
import pathlib
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import normal, write_random_mnist

from rhnzoo import cells
from rhnzoo.data import DataError, sequences
from rhnzoo.data.word2vec import load_word2vec
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.studies import rrl_table3, sweep
from rhnzoo.tasks import rrl
from rhnzoo.configs import rrl as rrl_configs

ROOT = pathlib.Path(__file__).resolve().parents[1]


def ragged(rng, n, vocab, max_len):
    return [
        rng.integers(2, vocab, int(rng.integers(0, max_len + 1))).astype(np.int32) for _ in range(n)
    ]


@pytest.mark.parametrize(  # the fast tier: the Parallel (an LSTM inside)
    "cell",
    [
        pytest.param(cells.LSTM(6), marks=pytest.mark.slow),
        cells.Parallel((cells.LSTM(6), cells.RRN(6))),
    ],
)
def test_features_are_each_rows_output_at_its_last_real_step(cell):
    """Each row alone, unpadded, through the cell in a plain scan: its last output is the
    classifier's representation of that row in a padded batch (empty rows: zeros)."""
    model = SequenceClassifier(cell, 3, 4, vocab_size=11)
    params = model.init(jax.random.PRNGKey(0))
    seqs = ragged(np.random.default_rng(0), 5, 11, 9) + [np.zeros(0, np.int32)]
    split = sequences.Split(seqs, np.zeros(len(seqs), np.int32))
    inputs, lengths, _, _ = rrl.pad(split, range(len(seqs)), len(seqs), 9)
    inputs[lengths == 0] = 7  # garbage in the padding must not matter
    got = model.features(params, jnp.asarray(inputs), jnp.asarray(lengths))
    for row, seq in enumerate(seqs):
        if len(seq) == 0:
            np.testing.assert_array_equal(got[row], 0.0)
            continue
        x_proj = cell.project_inputs(params["cell"], params["embed"][seq][:, None])
        _, ys = jax.lax.scan(
            functools.partial(cell.step, params["cell"]), cell.initial_carry(1), x_proj
        )
        np.testing.assert_allclose(got[row], ys[-1, 0], rtol=1e-5, atol=1e-6)


def test_batches_cover_every_example_once_and_depend_only_on_seed_and_epoch():
    rng = np.random.default_rng(1)
    split = sequences.Split(ragged(rng, 50, 20, 40), rng.integers(0, 2, 50).astype(np.int32))
    cfg = rrl_configs.TrainConfig(batch_size=8, max_len=32, buckets=3)
    assert cfg.bucket_lengths() == (8, 16, 32)
    epoch0, again, epoch1 = (rrl.plan(split, cfg, (3, e)) for e in (0, 0, 1))
    assert [b[0] for b in epoch0] == [b[0] for b in again]
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(epoch0, again))
    assert any(not np.array_equal(a[1], b[1]) for a, b in zip(epoch0, epoch1))
    rows = np.concatenate([b[1] for b in epoch0])
    assert sorted(rows[rows >= 0]) == list(range(50))
    for length, idx in epoch0:  # every sequence fits its bucket (after the cut to max_len)
        assert all(min(len(split.inputs[i]), 32) <= length for i in idx if i >= 0)
    assert len({b[0] for b in epoch0}) <= 3


def test_pad_keeps_the_last_or_first_steps():
    split = sequences.Split([np.arange(1, 11, dtype=np.int32)], np.array([1], np.int32))
    last, n, label, w = rrl.pad(split, [0, -1], 2, 4)
    first, *_ = rrl.pad(split, [0], 1, 4, keep="first")
    assert last[0].tolist() == [7, 8, 9, 10] and first[0].tolist() == [1, 2, 3, 4]
    assert n.tolist() == [4, 0] and label.tolist() == [1, 0] and w.tolist() == [1.0, 0.0]


def test_the_task_learns_a_sequence_rule_on_the_engine():
    """Label = whether token 2 occurs in the sequence (an LSTM must carry it to the end):
    dev accuracy after 6 short epochs of Adadelta (lr 1, as published) is far above
    chance (0.5); a probe run reached 0.97-0.98 by epoch 5-6."""
    rng = np.random.default_rng(0)

    def split(n):
        seqs = [rng.integers(3, 8, int(rng.integers(4, 13))).astype(np.int32) for _ in range(n)]
        labels = rng.integers(0, 2, n).astype(np.int32)
        for s, y in zip(seqs, labels):
            if y:
                s[int(rng.integers(len(s)))] = 2
        return sequences.Split(seqs, labels)

    config = rrl_configs.RRLConfig(
        model="lstm",
        hidden_size=16,
        embed_size=8,
        init_scale=0.3,
        drop=0.0,
        embeddings="random",
        batch_size=16,
        max_len=12,
        buckets=1,
        epochs=6,
        progress=False,
    )
    dataset = sequences.Dataset(
        split(256), split(64), split(64), num_classes=2, vocab=tuple("abcdefgh"), input_size=None
    )
    run = rrl.train_and_evaluate(config, dataset, log=None)
    assert run.results["dev_acc"] > 0.85, run.history


def make_cell(name, hidden, hybrid_hidden, **settings):
    return rrl_configs.RRLConfig(
        model=name, hidden_size=hidden, hybrid_hidden_size=hybrid_hidden, **settings
    ).cell()


def test_every_model_of_the_paper_builds_with_table_2_sizes():
    for name in rrl_configs.MODELS:
        cell = make_cell(name, 12, 8)
        expected = 8 if name in ("hrl", "lstm_gru") else 12
        assert cell.hidden_size == expected, name
    hrl = make_cell("hrl", 12, 8)
    assert [type(c).__name__ for c in hrl.cells] == ["LSTM", "RRN"]
    assert (
        make_cell("sc_lstm_p", 12, 8).learn_alpha and not make_cell("sc_lstm_i", 12, 8).learn_alpha
    )
    with pytest.raises(ValueError, match="unknown cell"):
        make_cell("transformer", 12, 8)


def test_word2vec_text_and_binary_files(tmp_path):
    vocab = ("<pad>", "<unk>", "good", "bad", "film")
    vectors = {"good": [1.0, 2.0, 3.0], "film": [-1.0, 0.5, 0.25], "other": [9.0, 9.0, 9.0]}
    text = tmp_path / "v.txt"
    text.write_text("3 3\n" + "".join(f"{w} {' '.join(map(str, v))}\n" for w, v in vectors.items()))
    binary = tmp_path / "v.bin"
    binary.write_bytes(
        b"3 3\n"
        + b"".join(w.encode() + b" " + struct.pack("<3f", *v) + b"\n" for w, v in vectors.items())
    )
    for path in (text, binary):
        got, found = load_word2vec(path, vocab, 3)
        assert found.tolist() == [False, False, True, False, True]
        np.testing.assert_array_equal(got[2], vectors["good"])
        np.testing.assert_array_equal(got[4], vectors["film"])
        np.testing.assert_array_equal(got[3], 0.0)
    with pytest.raises(DataError, match="3 dimensions, the embedding has 4"):
        load_word2vec(text, vocab, 4)
    (tmp_path / "bad.txt").write_text("good 1.0 x\n")
    with pytest.raises(DataError, match="not a word2vec file"):
        load_word2vec(tmp_path / "bad.txt", vocab)


def rrl_script(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "rrl.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def tiny_mnist(tmp_path_factory):
    return write_random_mnist(tmp_path_factory.mktemp("mnist"), train=120, test=20)


@pytest.mark.slow
def test_table_mode_trains_the_missing_models_and_prints_table_3(tmp_path, tiny_mnist):
    args = [
        "--dataset=pmnist",
        "--models=lstm,sc_lstm_i",
        "--hidden_size=4",
        "--max_len=16",
        "--batch_size=20",
        "--max_steps=2",
        "--noprogress",
        f"--data_dir={tiny_mnist}",
        "--noverify_data",
        "--nodownload",
        f"--workdir={tmp_path / 'root'}",
    ]
    first = rrl_script(*args, "--table")
    assert first.returncode == 0, first.stderr[-2000:]
    rows = [l for l in first.stdout.splitlines() if l.startswith("| LSTM") or l.startswith("| SC")]
    assert len(rows) == 2 and all("—" not in r for r in rows), first.stdout
    results = json.loads((tmp_path / "root" / "lstm" / "results.json").read_text())
    assert 0.0 <= results["test_acc"] <= 1.0
    config = json.loads((tmp_path / "root" / "lstm" / "config.json").read_text())
    assert config["model"] == "lstm" and config["preset"] is None and config["dtype"] == "float32"
    again = rrl_script(*args, "--table", "--norun_missing")  # collects only
    assert again.returncode == 0 and "parameters" not in again.stdout.split("|")[0]
    assert [l for l in again.stdout.splitlines() if l.startswith("| LSTM")] == rows[:1]


# Bad flags: tests/test_bad_inputs.py's table (one subprocess a script, the rest in-process)
# and tests/test_config_contract.py (every field's low / high / choices).


@pytest.mark.slow  # the fast tier: tests/test_bad_inputs.py's missing-data row
def test_missing_data_is_one_line_naming_the_files(tmp_path):
    result = rrl_script(
        "--dataset=pmnist",
        "--max_steps=1",
        f"--data_dir={tmp_path / 'none'}",
        "--nodownload",
        f"--workdir={tmp_path / 'w'}",
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "train-images-idx3-ubyte.gz" in lines[0]
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("cell", [cells.LSTM(5), cells.RHN(5, 2), cells.SCLSTM(5, skip=3)])
def test_projecting_inside_the_scan_computes_the_same_function(cell):
    params = cell.init(jax.random.PRNGKey(1), 2)
    xs = normal(jax.random.PRNGKey(2), (7, 3, 2))
    lengths = jnp.array([7, 4, 0])
    run = lambda per_step: cells.unroll(
        cell, params, cell.initial_carry(3), xs, lengths=lengths, project_per_step=per_step
    )
    for a, b in zip(jax.tree.leaves(run(False)), jax.tree.leaves(run(True))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def table_rows(stdout):
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in stdout.splitlines()
        if line.startswith("| LSTM") or line.startswith("| SC")
    ]


TINY = [
    "--dataset=pmnist",
    "--hidden_size=4",
    "--max_len=16",
    "--batch_size=20",
    "--max_steps=2",
    "--noprogress",
    "--noverify_data",
    "--nodownload",
    "--table",
]


@pytest.mark.slow
def test_two_jobs_give_the_rows_of_one_after_another(tmp_path, tiny_mnist):
    args = [*TINY, "--models=lstm,sc_lstm_i", f"--data_dir={tiny_mnist}"]
    seq = rrl_script(*args, f"--workdir={tmp_path / 'seq'}")
    par = rrl_script(*args, f"--workdir={tmp_path / 'par'}", "--jobs=2")
    assert seq.returncode == 0 and par.returncode == 0, par.stderr[-2000:]
    assert "2 runs, 2 at a time in child processes" in par.stdout
    assert sorted(l.split()[1] for l in par.stdout.splitlines() if l.startswith("[")) == [
        "lstm",
        "sc_lstm_i",
    ]  # one line per run finished
    without_minutes = lambda rows: [row[:-1] for row in rows]
    assert without_minutes(table_rows(par.stdout)) == without_minutes(table_rows(seq.stdout))
    assert len(table_rows(par.stdout)) == 2
    for model in ("lstm", "sc_lstm_i"):
        read = lambda root, name: json.loads((tmp_path / root / model / name).read_text())
        untimed = lambda r: {k: v for k, v in r.items() if not k.endswith("_s")}
        assert untimed(read("par", "results.json")) == untimed(read("seq", "results.json"))
        assert read("par", "config.json") == {
            **read("seq", "config.json"),
            "workdir": str(tmp_path / "par"),
        }


@pytest.mark.slow
def test_seeds_train_one_workdir_each_and_the_table_shows_mean_and_sd(tmp_path, tiny_mnist):
    import statistics

    root = tmp_path / "root"
    out = rrl_script(
        *TINY,
        "--models=lstm",
        "--max_steps=4",
        "--seeds=2",
        "--seed=5",
        f"--data_dir={tiny_mnist}",
        f"--workdir={root}",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    read = lambda name, file: json.loads((root / name / file).read_text())
    results = [read(name, "results.json") for name in ("lstm", "lstm_s1")]
    configs = [read(name, "config.json") for name in ("lstm", "lstm_s1")]
    assert [c["seed"] for c in configs] == [5, 6]
    assert results[0]["test_xent"] != results[1]["test_xent"]  # other initialisation
    (row,) = table_rows(out.stdout)
    cell = lambda key: (
        f"{statistics.mean(100 * r[key] for r in results):.2f} ± "
        f"{statistics.stdev(100 * r[key] for r in results):.2f} (n=2)"
    )
    assert row[2:4] == [cell("dev_acc"), cell("test_acc")], row
    assert "pmnist, preset custom, 2 seeds" in out.stdout


def body_rows(text):
    """The cells of a markdown table's rows (after its header and rule)."""
    return [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()[2:]
    ]


def fake_run(workdir, config, dev_accs, results=None):
    """A run's workdir without training: ``config.json``, one epoch record per dev
    accuracy in ``metrics.jsonl``, and ``results.json`` when finished."""
    workdir.mkdir(parents=True)
    (workdir / "config.json").write_text(json.dumps(config))
    (workdir / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"kind": "epoch", "epoch": e, "dev_acc": acc, "elapsed_s": 60.0 * e}) + "\n"
            for e, acc in enumerate(dev_accs, 1)
        )
    )
    if results is not None:
        (workdir / "results.json").write_text(json.dumps(results))


def test_tables_mark_an_unfinished_run_and_leave_its_test_cell_blank(tmp_path):
    """Issue 48: ``--table --norun_missing`` showed LSTM's dev accuracy after 1 of 10
    epochs like a finished run's."""
    fake_run(tmp_path / "lstm", {"model": "lstm", "epochs": 10}, [0.7933])
    fake_run(
        tmp_path / "gru",
        {"model": "gru", "epochs": 2},
        [0.8, 0.85],
        {"dev_acc": 0.85, "test_acc": 0.84, "parameters": 1234, "step": 20},
    )
    fake_run(tmp_path / "gru_s1", {"model": "gru", "epochs": 2}, [0.81])
    lstm, gru = body_rows(rrl_table3.table_text(tmp_path, ["lstm", "gru"], "imdb", "t"))
    assert lstm[2:4] == ["79.33 (epoch 1 of 10, unfinished)", "—"], lstm
    assert gru[2:4] == ["85.00", "84.00"], gru
    lstm, gru = body_rows(rrl_table3.study_table(tmp_path, ["lstm", "gru"], "t", seeds=2))
    assert lstm[1:3] == ["79.33 (2 of 2 unfinished: epoch 1 of 10; not started)", "—"], lstm
    assert gru[1:3] == ["83.00 ± 2.83 (n=2) (1 of 2 unfinished: epoch 1 of 2)", "84.00"], gru


def test_one_model_over_seeds_prints_and_writes_its_mean_and_sd(tmp_path):
    """Issue 48: ``rrl.py --model=gru --seeds=2`` trained both seeds and showed no mean ±
    sd. Both seeds' workdirs are finished runs (faked), so nothing trains."""
    config = rrl_configs.RRLConfig(
        model="gru",
        hidden_size=4,
        embed_size=4,
        max_len=8,
        batch_size=4,
        epochs=1,
        embeddings="random",
        progress=False,
        workdir=str(tmp_path),
    )
    for k, (dev, test) in enumerate([(0.80, 0.78), (0.82, 0.74)]):
        fake_run(
            tmp_path / sweep.seed_name("gru", k),
            config.replace(seed=config.seed + k).to_dict(),
            [dev],
            {"dev_acc": dev, "test_acc": test, "parameters": 100, "step": 10**6, "best_step": 1},
        )
    rng = np.random.default_rng(0)
    split = lambda n: sequences.Split(ragged(rng, n, 10, 8), rng.integers(0, 2, n).astype(np.int32))
    dataset = sequences.Dataset(split(8), split(4), split(4), 2, tuple("abcdefghij"), None)
    lines = []
    text = rrl_table3.run_experiment(
        {"gru": config},
        tmp_path,
        study=None,
        table=False,
        run_missing=False,
        load=lambda: dataset,
        title="imdb",
        log=lines.append,
        seeds=2,
    )
    assert text is not None, lines
    (row,) = body_rows(text)
    assert row[2:4] == ["81.00 ± 1.41 (n=2)", "76.00 ± 2.83 (n=2)"], row
    assert (tmp_path / "table.md").read_text() == text + "\n"
    assert sum("already finished" in line for line in lines) == 2, lines


def test_integer_pixels_are_their_float_values():
    # Before: the carry took the inputs' dtype, so uint8 pixels failed in the scan.
    model = SequenceClassifier(cells.LSTM(6), 3, 2)
    params = model.init(jax.random.PRNGKey(0))
    pixels = np.random.default_rng(5).integers(0, 4, (2, 7, 2)).astype(np.uint8)
    lengths = jnp.array([7, 4])
    want = model.features(params, jnp.asarray(pixels, jnp.float32), lengths)
    np.testing.assert_allclose(
        model.features(params, jnp.asarray(pixels), lengths), want, rtol=1e-6
    )
