"""A model-free task for the run-engine tests: linear regression by SGD on shuffled data.

Used in-process (``make_task``) and as a script run in a subprocess by the signal
and kill tests::

    python tests/engine_toy.py --workdir=DIR [--max_steps=N] [--slow_eval] [--lr=...]

and by the multi-run runner's tests as a sweep (``--runs``: one run each in
``DIR/<run>``, with ``--jobs``, ``--seeds``; ``--fail=<run>``: that run fails; prints
``{run: results}`` as JSON)::

    python tests/engine_toy.py --workdir=DIR --runs=a,b --jobs=2 [--seeds=K] [--fail=b]

Batch k of epoch e is ``classify.batch_indices(seed, e, k, ...)``, a shuffled order,
so exact resume also checks that the batch order is a pure function of (seed,
epoch, index). The script prints ``validation started`` (flushed) when a
validation begins, so a test can signal it mid-evaluation without sleeping.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rhnzoo.config import RunSettings, setting
from rhnzoo.tasks import classify
from rhnzoo import engine
from rhnzoo.engine.evaluate import Batches, Report

N_TRAIN, N_VALID, DIM, BATCH = 96, 32, 5, 8


def dataset(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(DIM,)).astype(np.float32)
    x = rng.normal(size=(N_TRAIN + 2 * N_VALID, DIM)).astype(np.float32)
    y = x @ w + 0.1 * rng.normal(size=len(x)).astype(np.float32)
    cut = (N_TRAIN, N_TRAIN + N_VALID)
    return (
        (x[: cut[0]], y[: cut[0]]),
        (x[cut[0] : cut[1]], y[cut[0] : cut[1]]),
        (x[cut[1] :], y[cut[1] :]),
    )


def _sq_error(params, x, y):
    return jnp.sum(jnp.square(x @ params["w"] + params["b"] - y))


def make_task(
    lr: float = 0.01, slow_eval: bool = False, announce: bool = False, on_batch=None
) -> engine.Task:
    """The toy task: ``sums = {'loss': Σ squared error, 'count': B}``; valid/test MSE.

    ``on_batch(epoch, index)``, if given, is called whenever a batch is made (tests use
    it to send a signal at a chosen step).
    """
    (xt, yt), (xv, yv), (xs, ys) = dataset()
    tx = optax.sgd(lr, momentum=0.9)
    spe = classify.steps_per_epoch(N_TRAIN, BATCH)

    def init_state(key):
        params = {"w": 0.1 * jax.random.normal(key, (DIM,)), "b": jnp.zeros(())}
        # A carried state big enough that orbax stores it in data files, not inline.
        return {"params": params, "opt_state": tx.init(params), "trace": jnp.zeros((4096,))}

    def train_step(state, batch, key):
        x, y = batch
        noise = 1e-3 * jax.random.normal(key, y.shape)  # uses the engine's per-step key
        loss, grads = jax.value_and_grad(_sq_error)(state["params"], x, y + noise)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        trace = 0.5 * state["trace"] + loss * jax.random.normal(key, (4096,))  # incompressible
        state = {"params": params, "opt_state": opt_state, "trace": trace}
        return state, {"loss": loss, "count": jnp.float32(len(y))}

    def train_batch(seed, epoch, index):
        if on_batch is not None:
            on_batch(epoch, index)
        idx = classify.batch_indices(seed, epoch, index, N_TRAIN, BATCH)
        return xt[idx], yt[idx]

    def eval_step(params, batch):
        x, y = batch
        return {"loss": _sq_error(params, x, y), "count": jnp.float32(len(y))}

    splits = {"valid": (xv, yv), "test": (xs, ys)}

    def eval_batches(split, final):
        if announce and not final:
            print("validation started", flush=True)
        if final or split != "valid":
            return [splits[split]]
        # The validation set whole, once (--slow_eval: 10**7 times, a practically endless one).
        return Batches(10**7 if slow_eval else 1, lambda i: splits[split])

    return engine.Task(
        init_state=init_state,
        train_step=train_step,
        train_batch=train_batch,
        steps_per_epoch=spe,
        eval_step=eval_step,
        eval_batches=eval_batches,
        report=Report(
            select="valid_mse",
            metrics=lambda split, s: {f"{split}_mse": s["loss"] / s["count"]},
            train_metrics=lambda s: {"train_mse": s["loss"] / max(s["count"], 1.0)},
            unit="ex",
        ),
    )


@dataclasses.dataclass(frozen=True)
class ToyConfig(RunSettings):
    """The toy's settings: its flags and ``config.json``."""

    lr: float = setting(0.01, "SGD learning rate.")
    epochs: int = setting(
        1000, "Epochs of the schedule (the toy's step does not read it).", low=1, resumable=True
    )
    workdir: str | None = setting(None, "Run directory (with --runs: their root).", resumable=True)


def scripted_task(
    losses,
    chance_loss: float | None = None,
    valid_loss: float | None = None,
    steps_per_epoch: int = 1000,
    on_batch=None,
) -> engine.Task:
    """A task whose step k reports the loss ``losses[k]`` (nats, one unit per step): the
    divergence check on a loss curve of one's choosing (e.g. one measured on a real
    model). Its validation reports ``valid_loss`` as ``'valid_loss'`` if given."""
    losses = np.asarray(losses, np.float32)

    def train_batch(seed, epoch, index):
        if on_batch is not None:
            on_batch(epoch, index)
        return losses[epoch * steps_per_epoch + index]

    def train_step(state, loss, key):
        del key
        state = {"params": {"w": state["params"]["w"] + 1.0}}
        return state, {"loss": loss, "count": jnp.float32(1)}

    def eval_step(params, batch):  # valid: the mark (and loss); final: w
        sums = {"epoch_mark": jnp.float32(1), "w": params["w"]}
        return sums if valid_loss is None else {**sums, "loss": valid_loss, "count": 1.0}

    def metrics(split, sums):
        return {"w": sums["w"]} if split == "test" else {"epoch_mark": sums["epoch_mark"]}

    return engine.Task(
        init_state=lambda key: {"params": {"w": jnp.zeros(())}},
        train_step=train_step,
        train_batch=train_batch,
        steps_per_epoch=steps_per_epoch,
        eval_step=eval_step,
        eval_batches=lambda split, final: [None],
        report=Report(
            select="epoch_mark", metrics=metrics, chance_loss=chance_loss, final=("test",)
        ),
    )


def main(argv: list[str]) -> None:
    import json

    from absl import app, flags

    from rhnzoo.apps import cli, runner
    from rhnzoo.studies import sweep

    names = cli.define_config_flags(ToyConfig(log_every=1))
    flags.DEFINE_boolean("slow_eval", False, "Make every validation practically endless.")
    flags.DEFINE_list("runs", [], "A sweep of these runs, each in <workdir>/<run>.")
    flags.DEFINE_string("fail", None, "With --runs: this run fails at its start.")
    runner.define_flags()

    def body(_):
        F = flags.FLAGS

        def train(name: str, config: ToyConfig):
            def train(workdir, on_divergence="raise"):
                if F.fail is not None and name == F.fail:
                    raise ValueError(f"run {name} fails on purpose")
                task = make_task(config.lr, F.slow_eval, announce=True)
                return engine.run(task, config, workdir, on_divergence=on_divergence).results

            return train

        def run():
            config = ToyConfig(**{"log_every": 1, **cli.given(names)})
            if not F.runs:
                return train(None, config)(config.workdir)
            jobs, seeds = runner.from_flags()
            runs = [
                sweep.Run(sweep.seed_name(name, k), c, train(name, c))
                for name in F.runs
                for k in range(seeds)
                for c in [config.replace(seed=config.seed + k)]
            ]
            print(json.dumps(sweep.run_all(runs, F.workdir, jobs=jobs)))

        cli.main(run)

    app.run(body, argv)


if __name__ == "__main__":
    main(sys.argv)
