"""K seeds stacked (``engine.run(..., seeds=K)``, issue 47): the K seeds train as one
program (their states stacked, the step vmapped), and each seed's records equal those of
a separate run of ``config.replace(seed=config.seed + k)`` in its own workdir.

The toy (tests/engine_toy.py) equals its separate runs bit for bit: results, every
metrics record (timings aside), best checkpoints, the final state; also when one seed
diverges and another stops by patience, across a SIGTERM and a kill -9. The real tasks
(RRL classifier, highway net, LM, piano rolls) equal theirs to float32 rounding.
"""

import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
from unittest import mock

import engine_toy
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rhnzoo import engine
from rhnzoo.engine import workdir as workdir_lib
from rhnzoo.engine import signals, stacking

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPE = engine_toy.N_TRAIN // engine_toy.BATCH  # 12 steps per epoch
TIMING = ("_per_s", "elapsed_s", "_eval_s")  # fields that differ between any two runs
K = 3
CFG = {"epochs": 3, "progress": False, "log_every": 5, "max_steps": 30, "checkpoint_every_steps": 5}


def cfg(**kw):
    return engine_toy.ToyConfig(**{**CFG, **kw})


def seed_dirs(workdir, k=K):
    """The workdirs of a stacked run's seeds: ``workdir``, ``<workdir>_s1``, ..."""
    workdir = pathlib.Path(workdir)
    return [workdir.with_name(stacking.seed_name(workdir.name, i)) for i in range(k)]


def untimed(record):
    return {k: v for k, v in record.items() if not k.endswith(TIMING)}


def restore_all(directory):
    """Every checkpoint in ``directory``: ``{step: tree}``."""
    mngr = ocp.CheckpointManager(pathlib.Path(directory).absolute())
    try:
        return {s: mngr.restore(s, args=ocp.args.StandardRestore()) for s in mngr.all_steps()}
    finally:
        mngr.close()


def latest_state(directory):
    """The latest checkpoint in ``directory`` (``<workdir>/checkpoints``,
    ``<workdir>/stacked/checkpoints``)."""
    saved = restore_all(directory)
    return saved[max(saved)]


def records(workdir):
    """A seed's records, timing fields removed: metrics lines, best checkpoints, results."""
    workdir = pathlib.Path(workdir)
    metrics = [untimed(json.loads(l)) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    results = untimed(json.loads((workdir / "results.json").read_text()))
    return metrics, restore_all(workdir / "best"), results


def assert_same_records(a, b):
    (metrics_a, best_a, results_a), (metrics_b, best_b, results_b) = a, b
    assert results_a == results_b
    assert metrics_a == metrics_b
    assert sorted(best_a) == sorted(best_b)
    assert jax.tree.structure(best_a) == jax.tree.structure(best_b)
    for x, y in zip(jax.tree.leaves(best_a), jax.tree.leaves(best_b)):
        np.testing.assert_array_equal(x, y)


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def assert_same_as_stacked(workdir, reference):
    """Every seed's records and the final stacked state of the stacked run in ``workdir``
    equal those of the stacked run in ``reference``."""
    for mine, theirs in zip(seed_dirs(workdir), seed_dirs(reference), strict=True):
        assert_same_records(records(mine), records(theirs))
    a = latest_state(pathlib.Path(workdir) / "stacked" / "checkpoints")
    b = latest_state(pathlib.Path(reference) / "stacked" / "checkpoints")
    assert_trees_equal(a["state"], b["state"])
    for meta_a, meta_b in zip(a["meta"], b["meta"], strict=True):
        assert_trees_equal(
            {k: v for k, v in meta_a.items() if k != "elapsed"},
            {k: v for k, v in meta_b.items() if k != "elapsed"},
        )


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    """The toy stacked (``run``, ``run_s1``, ``run_s2``) and as K separate runs
    (``sep<k>``): 30 steps (2.5 epochs), checkpoints every 5 steps."""
    root = tmp_path_factory.mktemp("stacked")
    lines = []
    results = engine.run(engine_toy.make_task(), cfg(), root / "run", seeds=K, log=lines.append)
    for k in range(K):
        engine.run(engine_toy.make_task(), cfg(seed=k), root / f"sep{k}", log=None)
    return root, results, lines


# ------------------------------------------------------------------------------- 1. toy


def test_stacked_toy_seeds_equal_separate_runs_bit_for_bit(toy_runs):
    root, stacked, lines = toy_runs
    assert sorted(p.name for p in root.iterdir()) == [
        "run",
        "run_s1",
        "run_s2",
        "sep0",
        "sep1",
        "sep2",
    ]
    assert json.loads((root / "run" / "stacked" / "seeds.json").read_text()) == [0, 1, 2]
    assert [l for l in lines if "seeds stacked" in l] == [
        "6 parameters, 12 steps per epoch, 30 steps in this run, 3 seeds stacked"
    ]
    assert len(stacked) == K and [r.results["stopped"] for r in stacked] == ["end"] * K
    final = latest_state(root / "run" / "stacked" / "checkpoints")
    assert int(final["state"]["step"]) == 30
    for k, workdir in enumerate(seed_dirs(root / "run")):
        separate = root / f"sep{k}"
        assert json.loads((workdir / "config.json").read_text()) == json.loads(
            (separate / "config.json").read_text()
        )
        assert json.loads((workdir / "config.json").read_text())["seed"] == k
        assert_same_records(records(workdir), records(separate))
        # The returned RunResult is the separate run's too.
        assert untimed(stacked[k].results) == records(separate)[2]
        epochs = [r for r in records(separate)[0] if r["kind"] == "epoch"]
        assert [untimed(r) for r in stacked[k].history] == epochs
        assert_trees_equal(stacked[k].best_params, workdir_lib.restore_params(separate))
        # Row k of the final stacked state (and its bookkeeping) is the separate run's state.
        alone = latest_state(separate / "checkpoints")
        assert int(alone["state"]["step"]) == 30
        assert_trees_equal(
            jax.tree.map(lambda a, k=k: a[k], final["state"]["task"]), alone["state"]["task"]
        )
        assert_trees_equal(
            {n: v for n, v in final["meta"][k].items() if n != "elapsed"},
            {n: v for n, v in alone["meta"].items() if n != "elapsed"},
        )
        # Each seed's lines carry its seed; its final line is the separate run's.
        assert f"[seed {k}] {stacked[k].results['final']}" in lines
    # A rerun only reads: one "already finished" line per seed, the same results.
    before = {p: p.read_bytes() for p in (root / "run").rglob("*") if p.is_file()}
    again_lines = []
    again = engine.run(engine_toy.make_task(), cfg(), root / "run", seeds=K, log=again_lines.append)
    assert again_lines == [
        f"[seed {k}] already finished: {r.results['final']}" for k, r in enumerate(stacked)
    ]
    assert [a.results for a in again] == [r.results for r in stacked]
    assert {p: p.read_bytes() for p in (root / "run").rglob("*") if p.is_file()} == before


def test_one_seed_is_a_plain_run():
    """``seeds=1``: the run unstacked, as a list of one."""
    (one,) = engine.run(engine_toy.make_task(), cfg(max_steps=15), None, seeds=1, log=None)
    plain = engine.run(engine_toy.make_task(), cfg(max_steps=15), None, log=None)
    assert one.results == plain.results
    assert_trees_equal(one.best_params, plain.best_params)


# ----------------------------------------------------- 2. one seed diverges, one runs out


DIVERGE_AT = 15  # batch 15 (0-based), step 16: seed 1's targets x 1e30, its loss inf


def fated_task(stop_at=None):
    """The toy where seed 1 blows up from batch :data:`DIVERGE_AT` on (its squared error
    overflows float32), seed 2's targets shift by +3 from epoch 2 on (its validation never
    improves on epoch 1's: patience) and seed 0 trains as usual; ``stop_at``: SIGTERM
    once, when seed 0's batch of that step is made. (At lr 0.005 the toy's seeds improve
    every epoch of 3; at 0.01 seed 0 did not in epoch 3.)"""
    base = engine_toy.make_task(lr=0.005)

    def train_batch(seed, epoch, index):
        step = epoch * SPE + index
        if stop_at is not None and seed == 0 and step == stop_at:
            os.kill(os.getpid(), signal.SIGTERM)
        x, y = base.train_batch(seed, epoch, index)
        if seed == 1 and step >= DIVERGE_AT:
            y = y * np.float32(1e30)
        if seed == 2 and epoch >= 1:
            y = y + np.float32(3.0)
        return x, y

    return dataclasses.replace(base, train_batch=train_batch)


def test_a_diverging_seed_and_a_patient_one_stop_as_their_separate_runs(tmp_path):
    """Seed 1 stops 'diverged' at step 16 (non-finite loss), seed 2 by patience at the
    start of epoch 3, seed 0 at the end (step 36): each with the results, metrics and best
    checkpoints of its separate run; stopped by SIGTERM at step 20 (after seed 1
    stopped, before seed 2 did) and resumed, the stacked run ends the same."""
    config = cfg(epochs=3, max_steps=None, patience=1, lr=0.005)
    stacked = engine.run(
        fated_task(), config, tmp_path / "run", seeds=K, on_divergence="stop", log=None
    )
    assert [r.results["stopped"] for r in stacked] == ["end", "diverged", "patience"]
    assert [r.diverged for r in stacked] == [False, True, False]
    assert (
        stacked[1]
        .results["diverged"]
        .startswith(
            "non-finite training loss at step 16 (inf): the run diverged; the last good "
            "checkpoint (step 15) is intact"
        )
    )
    assert stacked[2].results["step"] == 2 * SPE and stacked[0].results["step"] == 3 * SPE
    for k, workdir in enumerate(seed_dirs(tmp_path / "run")):
        separate = engine.run(
            fated_task(),
            config.replace(seed=k),
            tmp_path / f"sep{k}",
            on_divergence="stop",
            log=None,
        )
        assert separate.results == stacked[k].results
        assert_same_records(records(workdir), records(tmp_path / f"sep{k}"))
        assert_trees_equal(stacked[k].best_params, separate.best_params)

    lines = []
    with pytest.raises(signals.Interrupted):
        engine.run(
            fated_task(stop_at=19),
            config,
            tmp_path / "again",
            seeds=K,
            on_divergence="stop",
            log=lines.append,
        )
    assert lines[-1].startswith(
        "stopped by signal 15 in training at step 20; checkpoint saved "
        f"at step 20 in {tmp_path / 'again' / 'stacked' / 'checkpoints'}"
    )
    assert json.loads((tmp_path / "again_s1" / "results.json").read_text())["stopped"] == "diverged"
    assert not (tmp_path / "again_s2" / "results.json").exists()
    lines = []
    engine.run(
        fated_task(), config, tmp_path / "again", seeds=K, on_divergence="stop", log=lines.append
    )
    assert f"resumed {tmp_path / 'again' / 'stacked'} at step 20" in lines
    assert any(l.startswith("[seed 1] already finished: final (") for l in lines), lines
    for mine, theirs in zip(seed_dirs(tmp_path / "again"), seed_dirs(tmp_path / "run")):
        assert_same_records(records(mine), records(theirs))


# ---------------------------------------------------------------------- 3. SIGTERM, 4. kill -9


def signalled_task(step):
    """The toy, SIGTERM once when the batch of ``step`` (0-based) is made. (engine_toy's
    ``on_batch`` runs for every seed's batch: K signals, and a second signal exits.)"""
    base = engine_toy.make_task()

    def train_batch(seed, epoch, index):
        if seed == 0 and epoch * SPE + index == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return base.train_batch(seed, epoch, index)

    return dataclasses.replace(base, train_batch=train_batch)


@pytest.mark.parametrize(  # mid-epoch, the epoch's last step, epoch 2 (CI)
    "stop_at",
    [3, pytest.param(11, marks=pytest.mark.slow), pytest.param(17, marks=pytest.mark.slow)],
)
def test_a_stacked_run_resumes_after_a_signal_exactly(tmp_path, toy_runs, stop_at):
    reference = toy_runs[0] / "run"
    lines = []
    with pytest.raises(signals.Interrupted) as info:
        engine.run(signalled_task(stop_at), cfg(), tmp_path / "run", seeds=K, log=lines.append)
    assert info.value.signum == signal.SIGTERM
    assert lines[-1].startswith(f"stopped by signal 15 in training at step {stop_at + 1}; ")
    assert int(latest_state(tmp_path / "run" / "stacked" / "checkpoints")["state"]["step"]) == (
        stop_at + 1
    )
    lines = []
    resumed = engine.run(engine_toy.make_task(), cfg(), tmp_path / "run", seeds=K, log=lines.append)
    assert f"resumed {tmp_path / 'run' / 'stacked'} at step {stop_at + 1}" in lines
    assert [r.results for r in resumed] == [r.results for r in toy_runs[1]]
    assert_same_as_stacked(tmp_path / "run", reference)


KILLED = textwrap.dedent("""
    import os, pathlib, sys
    sys.path.insert(0, {tests!r})
    import engine_toy
    from rhnzoo import engine

    workdir, marker = sys.argv[1], pathlib.Path(sys.argv[2])

    def on_batch(epoch, index):  # the first try dies when its batch {kill_at} is made
        if epoch * {spe} + index == {kill_at} and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), 9)

    task = engine_toy.make_task(on_batch=on_batch)
    engine.run(task, engine_toy.ToyConfig(**{config!r}), workdir, seeds={k})
""")


def test_kill_9_in_a_stacked_run_then_resume_gives_identical_outputs(tmp_path, toy_runs):
    """A process running the stacked toy is killed (SIGKILL, nothing saved on the way
    out) at step 18, 3 steps after its checkpoint of step 15; a second process resumes
    from it and ends with the outputs of the uninterrupted stacked run."""
    script = KILLED.format(tests=str(ROOT / "tests"), spe=SPE, kill_at=17, config=CFG, k=K)
    args = [sys.executable, "-c", script, str(tmp_path / "run"), str(tmp_path / "killed")]
    first = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert (tmp_path / "killed").exists() and not (tmp_path / "run" / "results.json").exists()
    assert int(latest_state(tmp_path / "run" / "stacked" / "checkpoints")["state"]["step"]) == 15
    second = subprocess.run(
        args, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False
    )
    assert second.returncode == 0, second.stderr
    assert f"resumed {tmp_path / 'run' / 'stacked'} at step 15" in second.stdout
    assert_same_as_stacked(tmp_path / "run", toy_runs[0] / "run")


# ------------------------------------------------------------------------ 5. bad input


def test_stacking_zero_pads_batches_of_other_lengths():
    """``stacking.stack``: K seeds' batches whose token buckets differ (the RRL's case,
    ``test_rrl_classifier_stacked_equals_separate_runs``, in CI) stack on a new leading
    axis, each leaf zero-padded at the end of each axis to the largest, on the host for
    host arrays; ``axes=None`` keeps the first seed's leaves, shared by all seeds."""
    a = (np.ones((2, 3), np.int32), np.array([3, 1], np.int32))
    b = (np.full((2, 5), 2, np.int32), np.array([5, 4], np.int32))
    tokens, lengths = stacking.stack([a, b])
    assert isinstance(tokens, np.ndarray) and tokens.shape == (2, 2, 5)
    np.testing.assert_array_equal(tokens[0], [[1, 1, 1, 0, 0]] * 2)
    np.testing.assert_array_equal(tokens[1], b[0])
    np.testing.assert_array_equal(lengths, [[3, 1], [5, 4]])
    assert stacking.stack([a, b], (0, None))[1] is a[1]
    on_device = stacking.stack([jnp.ones(3), jnp.ones(5)])
    np.testing.assert_array_equal(on_device, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


def test_bad_seed_counts_are_refused_and_leave_nothing_behind(tmp_path):
    with pytest.raises(ValueError, match="^seeds must be >= 1, got 0$"):
        engine.run(engine_toy.make_task(), cfg(), tmp_path / "zero", seeds=0, log=None)
    assert list(tmp_path.iterdir()) == []
    # A partial stacked run of 3 seeds, rerun with 2: refused, naming the stacked dir.
    with pytest.raises(signals.Interrupted):
        engine.run(signalled_task(7), cfg(), tmp_path / "run", seeds=3, log=None)
    snapshot = lambda: {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    before = snapshot()
    stack = tmp_path / "run" / "stacked"
    with pytest.raises(
        ValueError,
        match=f"^{stack} holds the stacked state of seeds "
        r"\[0, 1, 2\], not \[0, 1\]; rerun with those seeds or delete ",
    ):
        engine.run(engine_toy.make_task(), cfg(), tmp_path / "run", seeds=2, log=None)
    assert snapshot() == before  # nothing written, no lock left: the 3 seeds still resume
    resumed = engine.run(
        engine_toy.make_task(), cfg(max_steps=10), tmp_path / "run", seeds=3, log=None
    )
    assert [r.results["step"] for r in resumed] == [10] * 3


# ------------------------------------------------------------------- 6. the real tasks


def numeric(record):
    return {k: v for k, v in untimed(record).items() if isinstance(v, (int, float))}


def assert_close_results(stacked, separate, rtol):
    """Results (or records): the same keys, strings equal, numbers to ``rtol``."""
    assert sorted(untimed(stacked)) == sorted(untimed(separate))
    text = lambda r: {k: v for k, v in untimed(r).items() if k not in numeric(r) and k != "final"}
    assert text(stacked) == text(separate)
    keys = sorted(numeric(separate))
    np.testing.assert_allclose(
        [stacked[k] for k in keys], [separate[k] for k in keys], rtol=rtol, err_msg=str(keys)
    )


def assert_close_trees(a, b, rtol, atol):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def assert_close_runs(stacked, separate, rtol=1e-5, atol=1e-7):
    """Two engine RunResults: results, epoch records and best parameters to ``rtol``."""
    assert_close_results(stacked.results, separate.results, rtol)
    assert len(stacked.history) == len(separate.history)
    for a, b in zip(stacked.history, separate.history):
        assert_close_results(a, b, rtol)
    assert_close_trees(stacked.best_params, separate.best_params, rtol, atol)


# The other tasks' stacked runs (CI): the fast tier keeps the toy's (the engine's, bit for
# bit) and the LM's.
@pytest.mark.slow
def test_rrl_classifier_stacked_equals_separate_runs():
    """Ragged sequences (1-16 tokens) in buckets of 8 and 16: at some steps the seeds'
    batches come from different buckets, so the engine's stacking pads the shorter to 16
    (the lengths mask it). Measured on the CPU: dev_xent / valid_loss in the results and
    epoch records differ by up to 6e-8 (9e-8 relative), the other values not at all; the
    best parameters by up to 1.5e-8 absolute (9e-6 relative, on an entry near 0). The
    same 1.5e-8 with one bucket (no padding): the vmapped step rounds differently."""
    from rhnzoo.data import sequences
    from rhnzoo.tasks import rrl
    from rhnzoo.configs import rrl as rrl_configs

    rng = np.random.default_rng(0)

    def split(n):
        seqs = [rng.integers(3, 8, int(rng.integers(1, 17))).astype(np.int32) for _ in range(n)]
        return sequences.Split(seqs, rng.integers(0, 2, n).astype(np.int32))

    dataset = sequences.Dataset(
        split(40), split(16), split(16), num_classes=2, vocab=tuple("abcdefgh"), input_size=None
    )
    config = rrl_configs.RRLConfig(
        model="lstm",
        hidden_size=6,
        embed_size=4,
        init_scale=0.3,
        drop=0.3,
        embeddings="random",
        batch_size=8,
        max_len=16,
        buckets=2,
        epochs=2,
        progress=False,
    )
    plans = [
        [length for length, _ in rrl.plan(dataset.train, config, (seed, epoch))]
        for seed in range(K)
        for epoch in range(2)
    ]
    assert any(
        len({plans[2 * k + e][i] for k in range(K)}) > 1
        for e in range(2)
        for i in range(len(plans[0]))
    )  # buckets differ across seeds
    stacked = rrl.train_and_evaluate(config, dataset, log=None, seeds=K)
    for k in range(K):
        separate = rrl.train_and_evaluate(config.replace(seed=k), dataset, log=None)
        assert_close_runs(stacked[k], separate)
    assert stacked[0].results["dev_xent"] != stacked[1].results["dev_xent"]


@pytest.mark.slow
def test_highway_net_stacked_equals_separate_runs():
    """Synthetic images, a depth-3 highway net. Measured: equal bit for bit on the CPU
    (the batch indices are stacked, the one training set shared); the validation losses,
    which pick the best checkpoint, are held to that."""
    from rhnzoo.models.highway import FeedForwardNet
    from rhnzoo import evaluation
    from rhnzoo.tasks import highway as hw
    from rhnzoo.configs import highway as highway_configs

    net = FeedForwardNet("highway", 3, 6, 12, 3, transform_bias=-1.0)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (120, 12), dtype=np.uint8)
    labels = (images[:, 0] > images[:, 1]).astype(np.int32) + (images[:, 2] > 200)
    splits = evaluation.split_data(images[:, :, None], labels, images[:30], labels[:30], 30)
    config = highway_configs.HighwayConfig(
        lr=0.05, batch_size=10, epochs=2, log_every=10**6, progress=False
    )
    stacked = hw.train_and_evaluate(config, splits, net=net, log=None, seeds=K)
    for k in range(K):
        separate = hw.train_and_evaluate(config.replace(seed=k), splits, net=net, log=None)
        assert_close_runs(stacked[k], separate)
        valid = lambda run: [r["valid_xent"] for r in run.history] + [run.results["valid_xent"]]
        assert valid(stacked[k]) == valid(separate)  # exactly: what picks the best checkpoint
    assert stacked[0].results["valid_xent"] != stacked[1].results["valid_xent"]


@pytest.mark.parametrize("kind", ["highway", pytest.param("plain", marks=pytest.mark.slow)])
def test_stacked_highway_validation_gives_each_seed_its_own_sums_bit_for_bit(kind):
    """Issue 62 item 8: K stacked seeds' validation sums equal each seed's own evaluation
    exactly (a jax.vmap over the seeds rounded them differently at this shape: the
    8th digit, enough to flip a near-tie between checkpoints)."""
    from rhnzoo.models.highway import FeedForwardNet
    from rhnzoo.engine import evaluate
    from rhnzoo.tasks import classify
    from rhnzoo.tasks import highway as hw

    net = FeedForwardNet(kind, 3 if kind == "highway" else 2, 6, 12, 10, transform_bias=-1.0)
    params = [net.init(jax.random.PRNGKey(k)) for k in range(K)]
    rng = np.random.default_rng(0)
    split = (
        rng.integers(0, 256, (23, 12), dtype=np.uint8),
        rng.integers(0, 10, 23).astype(np.int32),
    )
    stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)
    batches = classify.eval_batches({"valid": split}, 10)("valid", False)
    totals = evaluate.evaluate(hw.eval_step(net), stack(params), batches, seeds=K)
    stacked = evaluate.seed_rows(totals, K)  # the engine's validation of K stacked seeds
    alone = [
        evaluate.seed_rows(evaluate.evaluate(hw.eval_step(net), p, batches), None)[0]
        for p in params
    ]
    assert stacked == alone and len({r["loss"] for r in alone}) == K


def test_language_model_stacked_equals_separate_runs(tmp_path):
    """A tiny RHN LM with dropout at every site (the per-seed step keys draw the masks),
    2 epochs, in workdirs (the LM's default workdir is not in memory). Measured: results,
    metrics and best parameters equal bit for bit on the CPU (every seed reads the one
    training stream; only the timings differ)."""
    from rhnzoo import data
    from rhnzoo.tasks import lm as lm_training
    from rhnzoo.configs import lm as lm_configs
    from rhnzoo.engine.workdir import read_metrics, restore_params

    rng = np.random.default_rng(2)
    corpus = data.Corpus(
        *(rng.integers(0, 9, n).astype(np.int32) for n in (200, 80, 80)), tuple("abcdefghi")
    )
    config = lm_configs.LMConfig(
        hidden_size=8,
        depth=2,
        batch_size=4,
        num_steps=5,
        max_max_epoch=2,
        max_epoch=1,
        progress=False,
        eval_batch_size=4,
        drop_x=0.1,
        drop_i=0.3,
        drop_h=0.2,
        drop_o=0.3,
    )
    stacked = lm_training.train_and_evaluate(
        config, corpus, workdir=tmp_path / "run", log=None, seeds=K
    )
    assert len(stacked) == K
    for k, workdir in enumerate(seed_dirs(tmp_path / "run")):
        separate = lm_training.train_and_evaluate(
            config.replace(seed=k), corpus, workdir=tmp_path / f"sep{k}", log=None
        )
        assert_close_results(stacked[k], separate, rtol=1e-5)
        assert stacked[k]["final"] == separate["final"]
        mine, theirs = read_metrics(workdir), read_metrics(tmp_path / f"sep{k}")
        assert len(mine) == len(theirs) == 2
        for a, b in zip(mine, theirs):
            assert_close_results(a, b, rtol=1e-5)
        assert_close_trees(
            restore_params(workdir), restore_params(tmp_path / f"sep{k}"), rtol=1e-5, atol=1e-7
        )
    assert stacked[0]["valid_ppl"] != stacked[1]["valid_ppl"]


@pytest.mark.slow
def test_polyphonic_training_stacked_equals_separate_runs():
    """polyphonic.train_and_evaluate on synthetic piano rolls (a shifting chord, 6-13
    frames), a DT(S)RNN, 2 epochs of 3 steps. Measured: equal bit for bit on the CPU."""
    from rhnzoo import cells
    from rhnzoo.models.piano_roll import PianoRollModel
    from rhnzoo.tasks import polyphonic
    from rhnzoo.configs import jsb as jsb_configs

    from test_polyphonic import fixture_data

    rolls = fixture_data()  # shifted chords, ragged lengths
    model = PianoRollModel(cells.DTSRNN(5, 3))
    settings = {
        "lr": 1.0,
        "momentum": 0.9,
        "max_grad_norm": 5.0,
        "batch_size": 8,
        "epochs": 2,
        "progress": False,
    }
    config = jsb_configs.PolyphonicConfig(**settings)
    stacked = polyphonic.train_and_evaluate(config, rolls, model=model, seeds=K)
    assert len(stacked) == K
    for k in range(K):
        separate = polyphonic.train_and_evaluate(config.replace(seed=k), rolls, model=model)
        a, b = stacked[k], separate
        np.testing.assert_allclose(
            [a.best_valid, a.test_at_best], [b.best_valid, b.test_at_best], rtol=1e-5
        )
        assert (a.best_epoch, a.diverged, a.epochs_run) == (b.best_epoch, b.diverged, b.epochs_run)
        for h, g in zip(a.history, b.history, strict=True):
            np.testing.assert_allclose(
                [h["train"], h["valid"]], [g["train"], g["valid"]], rtol=1e-5
            )
        assert_close_trees(a.best_params, b.best_params, rtol=1e-5, atol=1e-7)
    assert stacked[0].best_valid != stacked[1].best_valid


@pytest.mark.slow  # the fast tier: the highway's stacked validation and the LM's stacked run
def test_stacked_evaluations_of_the_lm_and_jsb_give_each_seed_s_own(tmp_path):
    """The engine's validation of K stacked seeds at once (``lax.map`` of the task's
    evaluation step) gives each JSB seed its own NLL, held to float32 rounding; and a
    stacked LM run validates its K seeds in one engine evaluation."""
    from test_polyphonic import fixture_data

    from rhnzoo import cells, data
    from rhnzoo.configs import lm as lm_configs
    from rhnzoo.models.piano_roll import PianoRollModel
    from rhnzoo.engine import evaluate as engine_evaluate
    from rhnzoo.tasks import lm as lm_training
    from rhnzoo.tasks import polyphonic

    stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)
    rng = np.random.default_rng(4)
    corpus = data.Corpus(
        *(rng.integers(0, 9, n).astype(np.int32) for n in (200, 80, 80)), tuple("abcdefghi")
    )
    config = lm_configs.LMConfig(
        hidden_size=8,
        depth=2,
        batch_size=4,
        num_steps=5,
        max_epoch=1,
        max_max_epoch=1,
        progress=False,
        eval_batch_size=4,
    )
    rolls, piano = fixture_data(), PianoRollModel(cells.DTSRNN(5, 3))
    params = [piano.init(jax.random.PRNGKey(k)) for k in range(K)]
    seqs, length = rolls["valid"], max(r.shape[0] for r in rolls["valid"])
    batches = [polyphonic.pad_batch(seqs[i : i + 3], length, 3) for i in range(0, len(seqs), 3)]
    totals = engine_evaluate.evaluate(
        polyphonic._eval_step(piano), stack(params), batches, seeds=K
    )  # the engine's validation of K stacked seeds
    got = [s["loss"] / s["count"] for s in engine_evaluate.seed_rows(totals, K)]
    alone = [engine_evaluate.evaluate(polyphonic._eval_step(piano), p, batches) for p in params]
    want = [s["loss"] / s["count"] for t in alone for s in engine_evaluate.seed_rows(t)]
    assert len(set(got)) == K
    np.testing.assert_allclose(got, want, rtol=1e-6)

    calls, real = [], engine_evaluate.evaluate

    def spy(*args, seeds=None, **kwargs):  # the engine's evaluation of one split
        calls.append(seeds is not None)
        return real(*args, seeds=seeds, **kwargs)

    with mock.patch.object(engine_evaluate, "evaluate", spy):
        lm_training.train_and_evaluate(config, corpus, workdir=tmp_path / "run", log=None, seeds=K)
    assert calls[0] is True and calls.count(True) == 1  # one validation, then K finals
