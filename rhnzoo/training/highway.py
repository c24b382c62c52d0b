"""Training the fully connected highway and plain nets (Srivastava et al.) on the run engine.

The optimiser is the ECBM4040 reproduction's: SGD with momentum 0.9 on the batch's
mean cross-entropy, the learning rate decayed by 0.96 every 100,000 steps
(staircase), batches of 128. Images are ``uint8``; the step divides by 255.

Data: the last ``valid_size`` training images (10,000 by default, the usual
50,000 / 10,000 MNIST split) are held out for validation, which picks the best
epoch's parameters; the test set is evaluated once, on those (``results.json``).
The papers' figure of merit, the mean training cross-entropy per epoch
(Srivastava et al. Fig. 1), is the engine's ``train_xent`` (running mean over the
epoch's batches, as Keras reports it).

The whole training split lives on the device; batch k of epoch e is an index
vector (:func:`rhnzoo.training.classify.batch_indices`, a function of the seed,
e and k) and the step gathers its images, so a step moves 512 bytes to the device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo.models.highway import FeedForwardNet
from rhnzoo.training import classify, engine, sharding, step

Array = jax.Array
Params = Any
Split = tuple[np.ndarray, np.ndarray]  # (images uint8 [N, m], labels int32 [N])

__all__ = ["TrainConfig", "inputs", "split_data", "make_optimizer", "make_train_step",
           "make_sums_fn", "evaluate", "make_task", "train", "SweepRun", "sweep"]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings.

    Attributes:
      lr: initial learning rate (> 0); the reproduction: 0.1 for highway nets, 1e-3
        (depth 10, 20) and 1e-5 (depth 50, 100) for plain nets.
      momentum: heavy-ball momentum in [0, 1).
      decay_rate: the rate is multiplied by this every ``decay_steps`` steps
        (staircase), in (0, 1].
      decay_steps: >= 1.
      batch_size: images per step (>= 1; the last partial batch of an epoch is dropped).
      eval_batch_size: images per evaluation call (>= 1).

    Raises:
      ValueError: for a value outside its range (one line naming the flag).
    """

    lr: float = 0.1
    momentum: float = 0.9
    decay_rate: float = 0.96
    decay_steps: int = 100_000
    batch_size: int = 128
    eval_batch_size: int = 1000

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"--momentum must be in [0, 1), got {self.momentum}")
        if not 0 < self.decay_rate <= 1:
            raise ValueError(f"--lr_decay_rate must be in (0, 1], got {self.decay_rate}")
        for name, value in (("lr_decay_steps", self.decay_steps), ("batch_size", self.batch_size),
                            ("eval_batch_size", self.eval_batch_size)):  # fmt: skip
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name} must be an integer >= 1, got {value!r}")


def inputs(images: Array) -> Array:
    """``uint8 [B, ...] -> float32 [B, m]`` in [0, 1]: flattened, pixel / 255."""
    return images.reshape(images.shape[0], -1).astype(jnp.float32) / 255.0


def split_data(
    train_images: np.ndarray,
    train_labels: np.ndarray,
    test_images: np.ndarray,
    test_labels: np.ndarray,
    valid_size: int,
) -> dict[str, Split]:
    """``{'train', 'valid', 'test'}`` -> (images uint8 ``[N, m]`` flattened, labels
    int32 ``[N]``); valid is the last ``valid_size`` training images.

    Raises:
      ValueError: unless 1 <= valid_size < number of training images.
    """
    n = len(train_images)
    if not isinstance(valid_size, int) or not 1 <= valid_size < n:
        raise ValueError(f"--valid_size must be in [1, {n - 1}] for {n} training images, "
                         f"got {valid_size!r}")  # fmt: skip
    flat = lambda a: np.ascontiguousarray(np.asarray(a, np.uint8).reshape(len(a), -1))
    x, y = flat(train_images), np.asarray(train_labels, np.int32)
    return {"train": (x[: n - valid_size], y[: n - valid_size]),
            "valid": (x[n - valid_size :], y[n - valid_size :]),
            "test": (flat(test_images), np.asarray(test_labels, np.int32))}  # fmt: skip


def make_optimizer(cfg: TrainConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """SGD with momentum and a staircase exponential decay: ``(tx, schedule)``."""
    schedule = optax.exponential_decay(cfg.lr, cfg.decay_steps, cfg.decay_rate, staircase=True)
    return optax.sgd(schedule, momentum=cfg.momentum or None), schedule


def make_train_step(net: FeedForwardNet, tx: optax.GradientTransformation):
    """The engine's ``train_step``: ``(state, (images, labels, idx), key) -> (state, sums)``.

    ``images uint8 [N, m]`` and ``labels [N]`` are the device-resident training
    split, ``idx int [B]`` the batch; the update is on the batch's mean
    cross-entropy; ``sums`` are :func:`rhnzoo.training.classify.xent_sums` before
    the update.
    """

    def forward(params, batch, key):
        del key  # no dropout
        images, labels, idx = batch
        return net.apply(params, inputs(images[idx])), labels[idx], None, {}

    return step.make_train_step(classify.xent_loss(forward), tx)


@functools.lru_cache(maxsize=16)
def make_sums_fn(net: FeedForwardNet) -> Callable[..., dict[str, Array]]:
    """jit ``(params, images uint8 [B, m], labels [B], weights [B]) -> xent_sums``."""
    return jax.jit(lambda p, images, labels, w: classify.xent_sums(net.apply(p, inputs(images)),
                                                                   labels, w))  # fmt: skip


def evaluate(net: FeedForwardNet, params: Params, split: Split, batch_size: int = 1000,
             track=None, desc: str = "", mesh=None) -> dict[str, float]:  # fmt: skip
    """Mean cross-entropy (nats) and accuracy of ``params`` on ``split``:
    ``{'loss', 'accuracy', 'count'}`` (:func:`rhnzoo.training.classify.evaluate`)."""
    return classify.evaluate(make_sums_fn(net), params, split, batch_size, track, desc, mesh)


def make_task(
    net: FeedForwardNet,
    splits: Mapping[str, Split],
    cfg: TrainConfig,
    *,
    seed: int = 0,
    devices: list | None = None,
) -> engine.Task:
    """The classification task for the run engine.

    Args:
      net: the model; splits: :func:`split_data`; cfg: optimisation; seed: the batch
        order (the engine's ``--seed`` seeds the initialisation); devices: data
        parallelism over these (default: all): the training split and parameters
        are replicated, each batch's rows split over a ``Mesh(("data",))``.

    Raises:
      ValueError: if the training split has fewer images than a batch, the images
        are not ``[N, net.input_size]``, or the devices do not divide the batch.
    """
    x_train, y_train = splits["train"]
    for name, (x, _) in splits.items():
        if x.ndim != 2 or x.shape[1] != net.input_size:
            raise ValueError(f"{name} images are {x.shape[1:]} per example, the net takes "
                             f"{net.input_size} inputs")  # fmt: skip
    spe = classify.steps_per_epoch(len(x_train), cfg.batch_size)
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(cfg.batch_size, mesh)
    tx, schedule = make_optimizer(cfg)
    images, labels = sharding.put_tree((x_train, y_train), sharding.replicated(mesh))

    @jax.jit  # one compilation instead of one per random array shape
    def init(key):
        params = net.init(key)
        return {"params": params, "opt_state": tx.init(params)}

    def init_state(key):
        return sharding.put_tree(init(key), sharding.replicated(mesh))

    def get_batch(epoch: int, index: int):
        idx = classify.batch_indices(seed, epoch, index, len(x_train), cfg.batch_size)
        return images, labels, sharding.put_rows(idx.astype(np.int32), mesh)

    def metrics(params, split, track, desc):
        r = evaluate(net, params, splits[split], cfg.eval_batch_size, track, desc, mesh)
        return {f"{split}_xent": r["loss"], f"{split}_acc": r["accuracy"]}

    def validate(params, track):
        out = metrics(params, "valid", track, "valid")
        return {**out, "valid_loss": out["valid_xent"]}

    def final_evaluate(params, track):
        return {**metrics(params, "valid", track, "valid"),
                **metrics(params, "test", track, "test")}

    return engine.Task(
        init_state=init_state, train_step=make_train_step(net, tx), get_batch=get_batch,
        steps_per_epoch=spe, validate=validate, final_evaluate=final_evaluate,
        select="valid_xent", train_metrics=classify.train_metrics,
        chance_loss=math.log(net.num_classes), unit="img",
        learning_rate=lambda step: float(schedule(step)),
    )  # fmt: skip


def train(
    net: FeedForwardNet,
    splits: Mapping[str, Split],
    cfg: TrainConfig,
    run: engine.RunConfig,
    workdir=None,
    config: Mapping[str, Any] | None = None,
    **kwargs,
) -> engine.RunResult:
    """Trains ``net`` with :func:`make_task` through :func:`rhnzoo.training.engine.run`
    (``kwargs``: ``on_divergence``, ``log``); the batch order is seeded by ``run.seed``."""
    task = make_task(net, splits, cfg, seed=run.seed)
    return engine.run(task, run, workdir, config, **kwargs)


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One run of a sweep: its net, optimisation, workdir and ``config.json`` settings;
    ``seed`` (None: the sweep's ``run.seed``) seeds its initialisation and batch order."""

    net: FeedForwardNet
    cfg: TrainConfig
    workdir: Any
    config: Mapping[str, Any]
    seed: int | None = None


def sweep(
    runs: list[SweepRun],
    splits: Mapping[str, Split],
    run: engine.RunConfig,
    *,
    log: Callable[[str], None] | None = print,
    jobs=None,
) -> list[dict[str, Any]]:
    """Trains ``runs``, each in its own workdir, on the multi-run runner
    (:mod:`rhnzoo.training.sweep`): one after another in this process, or side by side
    in child processes (``jobs``: :class:`rhnzoo.training.sweep.Jobs`).

    A finished run says ``already finished`` (the engine), an interrupted one resumes
    from its checkpoint. A run that diverges stops there and is reported
    (``results['diverged']``), the sweep goes on. Every workdir is checked before the
    first run starts, so an incompatible one fails the sweep before any training. The
    workdirs share one root.

    Returns:
      Per run: ``{'kind', 'depth', 'width', 'params', 'lr', 'seed', 'workdir',
      'results' (results.json), 'history' (epoch records), 'failed' (why its child
      failed, or None)}``.

    Raises:
      ValueError: an incompatible workdir; Interrupted: SIGTERM/SIGINT (the current
      run's state saved); RunError: a file could not be written.
    """
    from rhnzoo.training import sweep as runner

    roots = {pathlib.Path(r.workdir).parent for r in runs}
    if len(roots) != 1:
        raise ValueError(f"the runs of a sweep share one root, got {sorted(map(str, roots))}")
    (root,) = roots

    def trainer(r: SweepRun):
        cfg = run if r.seed is None else dataclasses.replace(run, seed=r.seed)
        return lambda workdir, on_divergence: train(r.net, splits, r.cfg, cfg, workdir, r.config,
                                                    on_divergence=on_divergence, log=log).results  # fmt: skip

    plan = [runner.Run(pathlib.Path(r.workdir).name, r.config, trainer(r)) for r in runs]
    runner.run_all(plan, root, log=log, jobs=jobs)
    done = runner.collect(root, [p.name for p in plan])
    return [{"kind": r.net.kind, "depth": r.net.depth, "width": r.net.width,
             "params": r.net.num_params(), "lr": r.cfg.lr,
             "seed": run.seed if r.seed is None else r.seed, "workdir": r.workdir,
             **{k: (done[p.name] or {}).get(k) for k in ("results", "history", "failed")}}
            for r, p in zip(runs, plan)]  # fmt: skip
