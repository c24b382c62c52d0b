"""rhnzoo.cells.make: every registered cell builds and steps, and trains in the language
model; one cell trains in each other task."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rhnzoo import cells, data
from rhnzoo.data import sequences
from rhnzoo.models import lm
from rhnzoo.tasks import lm as lm_training
from rhnzoo.configs import lm as lm_configs
from rhnzoo.tasks import polyphonic, rrl
from rhnzoo.configs import rrl as rrl_configs

SETTINGS = dict(depth=2, init_scale=0.1, init_bias=-1.0)
# Every base cell, and HSG around two of them (all HSG variants step in test_every_name...).
IN_TASKS = cells.NAMES + ("hsg_rhn", "hsg_gru")


def build(name, n=4):
    return cells.make(name, n, **cells.applicable(name, SETTINGS))


@pytest.mark.parametrize("name", cells.ALL_NAMES)
def test_every_name_builds_and_steps(name):
    cell = build(name)
    assert cell.hidden_size == 4
    params = cell.init(jax.random.PRNGKey(0), 3)
    carry = cell.initial_carry(2)
    x_proj = cell.project_inputs(params, jnp.ones((1, 2, 3)))
    _, y = cell.step(params, carry, jax.tree.map(lambda a: a[0], x_proj), jnp.ones((2, 4)))
    assert y.shape == (2, 4) and bool(jnp.all(jnp.isfinite(y)))
    assert cells.label(name)


def test_registry_matches_the_cells():
    assert cells.make("rhn", 8, depth=3, init_bias=-2.5) == cells.RHN(8, 3, init_bias=-2.5)
    assert cells.make("hsg_rhn", 8, depth=3) == cells.HSG(cells.RHN(8, 3))
    assert cells.make("gru", 8, hsg=True, hsg_init_bias=-1.0) == cells.HSG(
        cells.GRU(8), init_bias=-1.0
    )
    assert cells.make("hrl", 8) == cells.Parallel((cells.LSTM(8), cells.RRN(8)))
    assert cells.make("sc_lstm_p", 8, skip=5) == cells.SCLSTM(8, skip=5, learn_alpha=True)
    assert set(cells.NAMES) == {
        "rhn",
        "dtrnn",
        "dtsrnn",
        "lstm",
        "gru",
        "rrn",
        "sc_lstm_i",
        "sc_lstm_p",
        "hrl",
        "lstm_gru",
    }


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: cells.make("transformer", 8), "unknown cell 'transformer'; choose from rhn,"),
        (lambda: cells.make("lstm", 8, depth=2), "takes no depth; its options are forget_bias"),
        (lambda: cells.make("lstm", 8, hsg=True), "HSG needs a cell whose carry is one [B, n]"),
        (lambda: cells.make("hsg_hrl", 8), "HSG needs a cell whose carry is one [B, n]"),
        (lambda: cells.HSG(cells.LSTM(8)), "HSG needs a cell whose carry is one [B, n]"),
        (lambda: cells.make("rhn", 0), "hidden_size must be an integer >= 1"),
        # The option values by type (old: each of these was accepted and built a cell).
        (lambda: cells.make("rhn", 4, init_scale="x"), "cell 'rhn': init_scale must be a number"),
        (lambda: cells.make("rhn", 4, coupled="no"), "coupled must be True or False, got 'no'"),
        (lambda: cells.make("gru", 4, reset_after=1), "reset_after must be True or False"),
        (lambda: cells.make("lstm", 4, forget_bias=True), "forget_bias must be a number"),
        (lambda: cells.make("hsg_rhn", 4, hsg_init_bias="-2"), "hsg_init_bias must be a number"),
        (lambda: cells.make("hrl", 4, f_bias=None), "cell 'hrl': f_bias must be a number"),
    ],
)
def test_registry_errors_are_one_line(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert message in str(e.value) and "\n" not in str(e.value)


def loss_falls(step, state, batch, steps=8):
    """``steps`` train steps on one repeated batch (one dropout key: the same masks):
    every loss finite, and the last below the first (a memorisable batch is learned)."""
    step = jax.jit(step, donate_argnums=0)
    losses = []
    for _ in range(steps):
        state, sums = step(state, batch, jax.random.PRNGKey(0))
        losses.append(float(sums["loss"]))
    assert all(math.isfinite(v) for v in losses), losses
    assert losses[-1] < 0.97 * losses[0], losses


# Every cell of IN_TASKS in the language model (the fast tier: the RHN, HSG, a gated
# cell, a Parallel); one cell in each other task, whose wiring is cell-independent
# (every cell's scan with lengths and its final output: tests/test_scan_dispatch.py).
@pytest.mark.parametrize(
    "name",
    [
        n if n in ("rhn", "hsg_rhn", "lstm", "hrl") else pytest.param(n, marks=pytest.mark.slow)
        for n in IN_TASKS
    ],
)
def test_every_cell_trains_in_the_language_model(name):
    rng = np.random.default_rng(0)
    corpus = data.Corpus(
        rng.integers(0, 7, 200), rng.integers(0, 7, 50), rng.integers(0, 7, 50), tuple("abcdefg")
    )
    opts = cells.applicable(name, dict(depth=2, init_bias=-1.0))
    model = lm.language_model(name, corpus.vocab_size, 8, **opts)
    cfg = lm_configs.LMConfig(
        lr=1.0, batch_size=2, num_steps=5, drop_x=0.1, drop_i=0.2, drop_h=0.2, drop_o=0.2
    )
    tx = lm_training.make_optimizer(cfg, 10)
    state = lm_training.init_state(model, cfg, tx, jax.random.PRNGKey(0))
    rows = jnp.asarray(data.batchify(corpus.train, cfg.batch_size))
    loss_falls(lm_training.make_train_step(model, cfg, tx), state, (rows, np.int32(0)))


def test_a_cell_trains_on_piano_rolls():
    model = polyphonic.PianoRollModel(build("dtrnn"))
    params = model.init(jax.random.PRNGKey(0))
    state = {"params": params, "opt_state": polyphonic.sgd(0.1, 0.9, 1.0).init(params)}
    rng = np.random.default_rng(0)
    x = jnp.asarray((rng.uniform(size=(6, 2, 88)) < 0.1).astype(np.float32))
    mask = jnp.ones((6, 2), jnp.float32)
    loss_falls(polyphonic._engine_step(model), state, (x, mask))


def test_a_cell_trains_as_a_sequence_classifier():
    """The task's train step learns one padded batch; the task end to end (its whole
    first epoch, two steps, then its evaluation) gives finite losses."""
    config = rrl_configs.RRLConfig(
        model="sc_lstm_p",
        hidden_size=4,
        init_scale=0.1,
        batch_size=4,
        max_len=8,
        buckets=1,
        epochs=1,
        progress=False,
    )
    rng = np.random.default_rng(0)
    split = sequences.Split(
        [rng.uniform(size=(int(t), 1)).astype(np.float32) for t in (5, 8, 3, 6)],
        np.array([0, 1, 2, 1], np.int32),
    )
    model = config.classifier(3, input_size=1)
    params = model.init(jax.random.PRNGKey(0))
    tx = optax.adam(0.1)
    batch = rrl.pad(split, np.arange(4), 4, 8, config.keep)
    loss_falls(
        rrl.make_train_step(model, tx), {"params": params, "opt_state": tx.init(params)}, batch
    )
    dataset = sequences.Dataset(split, split, split, num_classes=3, vocab=None, input_size=1)
    run = rrl.train_and_evaluate(config.replace(batch_size=2), dataset, log=None)
    assert run.results["step"] == 2
    assert all(math.isfinite(run.results[k]) for k in ("dev_xent", "test_xent")), run.results


def test_hsg_documents_its_error_and_its_protocol_methods():
    # old: HSG raised ValueError with no Raises section; init, initial_carry and
    # project_inputs had no docstring.
    assert "Raises:" in cells.HSG.__doc__ and "ValueError" in cells.HSG.__doc__
    for method in ("init", "initial_carry", "project_inputs"):
        doc = getattr(cells.HSG, method).__doc__
        assert doc and "[" in doc, method  # a shape, e.g. [B, n]
