"""The sequence classifier with ``bidirectional`` (``--bidirectional`` of
experiments/rrl.py, issue 71): its representation is each row's forward output at the
last real step beside the backward output after reading step 0, under the reference and
the fused scan; a tiny run of the task trains in-process."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rhnzoo import cells
from rhnzoo.configs import rrl as rrl_configs
from rhnzoo.data import sequences
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.tasks import rrl


def _last_output(cell, params, xs):
    _, ys = jax.lax.scan(
        functools.partial(cell.step, params), cell.initial_carry(1), cell.project_inputs(params, xs)
    )
    return ys[-1, 0]


@pytest.mark.parametrize("impl", ["fused", "reference"])
def test_bidirectional_features_are_both_directions_final_outputs(impl):
    """Each row alone, unpadded, through each direction's cell in a plain scan (the
    backward one over the row reversed): the forward's last output beside the backward's
    is the classifier's representation of the row in a padded batch; empty rows zeros."""
    cell = cells.GRU(5)
    model = SequenceClassifier(cell, 3, 4, vocab_size=11, bidirectional=True, scan_impl=impl)
    params = model.init(jax.random.PRNGKey(0))
    assert params["W_out"].shape == (10, 3) and set(params["cell"]) == {"forward", "backward"}
    rng = np.random.default_rng(0)
    seqs = [rng.integers(2, 11, n).astype(np.int32) for n in (9, 1, 4, 0, 6)]
    split = sequences.Split(seqs, np.zeros(len(seqs), np.int32))
    inputs, lengths, _, _ = rrl.pad(split, range(len(seqs)), len(seqs), 9)
    for row, n in enumerate(lengths):
        inputs[row, n:] = 7  # garbage in the padding must not matter
    got = model.features(params, jnp.asarray(inputs), jnp.asarray(lengths))
    assert got.shape == (len(seqs), 10)
    for row, seq in enumerate(seqs):
        if len(seq) == 0:
            np.testing.assert_array_equal(got[row], 0.0)
            continue
        xs = params["embed"][seq][:, None]
        forward = _last_output(cell, params["cell"]["forward"], xs)
        backward = _last_output(cell, params["cell"]["backward"], xs[::-1])
        want = np.concatenate([forward, backward])
        np.testing.assert_allclose(got[row], want, rtol=1e-5, atol=1e-6)


def test_a_tiny_bidirectional_run_trains_in_process():
    """``bidirectional=True`` (the ``--bidirectional`` flag) through the task's one entry
    point: the label is the sequence's first token (the backward direction reads it last),
    learnt well above chance in a few short epochs."""
    assert "bidirectional" in rrl_configs.RRLConfig.flags()
    rng = np.random.default_rng(0)

    def split(n):
        seqs = [rng.integers(3, 8, int(rng.integers(4, 13))).astype(np.int32) for _ in range(n)]
        labels = rng.integers(0, 2, n).astype(np.int32)
        for s, y in zip(seqs, labels):
            s[0] = 2 if y else 3
        return sequences.Split(seqs, labels)

    config = rrl_configs.RRLConfig(
        model="gru",
        bidirectional=True,
        hidden_size=8,
        embed_size=8,
        init_scale=0.3,
        drop=0.0,
        embeddings="random",
        batch_size=16,
        max_len=12,
        buckets=1,
        epochs=4,
        progress=False,
    )
    assert config.classifier(2, vocab_size=8).bidirectional
    dataset = sequences.Dataset(
        split(192), split(64), split(64), num_classes=2, vocab=tuple("abcdefgh"), input_size=None
    )
    run = rrl.train_and_evaluate(config, dataset, log=None)
    assert run.results["dev_acc"] > 0.8, run.history
