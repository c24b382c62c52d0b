"""Training the fully connected highway and plain nets (Srivastava et al.) on the run engine.

:func:`train_and_evaluate` is the one entry point of a run (:func:`sweep`: of a depth
sweep, each run through it).

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
vector (:func:`rhnzoo.tasks.classify.batch_indices`, a function of the seed,
e and k) and the step gathers its images, so a step moves 512 bytes to the device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import data
from rhnzoo.config import DataSettings, RunSettings, setting
from rhnzoo.models.highway import ACTIVATIONS, INITS, KINDS, FeedForwardNet
from rhnzoo.tasks import classify
from rhnzoo import engine
from rhnzoo.engine import sharding, step
from rhnzoo.studies import sweep as runner

Array = jax.Array
Params = Any
Split = tuple[np.ndarray, np.ndarray]  # (images uint8 [N, m], labels int32 [N])

__all__ = [
    "HighwayConfig",
    "inputs",
    "split_data",
    "make_optimizer",
    "forward",
    "make_train_step",
    "make_sums_fn",
    "evaluate",
    "init_state",
    "train_and_evaluate",
    "train_run",
    "sweep",
]


HIGHWAY_LR = 0.1  # the reproduction's learning rate of every highway net
DEFAULT_WIDTH = {"highway": 50, "plain": 71}  # about 5,000 parameters per layer either way


@dataclasses.dataclass(frozen=True)
class HighwayConfig(RunSettings, DataSettings):
    """Every setting of a highway / plain net run or depth sweep, one field each
    (``experiments/highway.py``'s flags are generated from them, ``--jobs`` and
    ``--seeds`` are the runner's). The engine's settings come from
    :class:`~rhnzoo.config.RunSettings` (the run's length: ``epochs``), the data flags
    from :class:`~rhnzoo.config.DataSettings`; presets: :mod:`rhnzoo.configs.highway`.
    The config itself is the engine's (:func:`train_and_evaluate`).

    A sweep's config narrows to each of its runs (:meth:`runs`; one net:
    :meth:`narrow`): the net's kind, depth, width and learning rate resolved, its own
    seed, no sweep. A run's ``config.json`` is its narrowed config's ``to_dict()``; the
    sweep-level fields (``sweep``, ``depths``, ``seeds``, ``jobs``, ``plain_lrs``) are
    resumable, as the run's own net, rate and seed are the structural ``kind``,
    ``depth``, ``width``, ``lr``, ``seed``.

    Raises:
      ValueError: on construction (one line naming the flag, as the script prints it):
        a value out of range, a plain net without a learning rate, or ``--seeds`` /
        ``--jobs`` without ``--sweep``.
    """

    # the net
    kind: str = setting("highway", "Net.", choices=KINDS)
    depth: int = setting(
        10,
        "Hidden layers in all (>= 2): the first plain layer and depth - 1 highway or plain layers.",
        low=2,
    )
    width: int | None = setting(
        None, "Units per layer (default 50 for highway, 71 for plain).", low=1
    )
    activation: str = setting("tanh", "H and plain-layer nonlinearity.", choices=tuple(ACTIVATIONS))
    init: str = setting("glorot_uniform", "Weight initialisation.", choices=sorted(INITS))
    transform_bias: float = setting(
        -4.0,
        "Initial transform-gate bias b_T (papers: -1 to "
        "-10; -2 for the MNIST heatmaps, -4 for the depth "
        "curves).",
    )
    # the data
    dataset: str = setting("mnist", "Data set.", choices=data.names("images"))
    data_source: str = setting(
        "files",
        "The original idx / python pickle files, or "
        "TensorFlow Datasets (pip install 'rhnzoo[tfds]').",
        choices=data.SOURCES,
    )
    valid_size: int = setting(10000, "Last training images held out for validation.", low=1)
    # the optimisation
    lr: float | None = setting(
        None,
        f"Initial learning rate (default: {HIGHWAY_LR} for "
        "highway nets, --plain_lrs at the depth for plain nets).",
    )
    plain_lrs: tuple[str, ...] = setting(
        ("10:1e-3", "20:1e-3", "50:1e-5", "100:1e-5"),
        "depth:rate pairs, the plain nets' learning rates when --lr is not given.",
        resumable=True,
    )
    momentum: float = setting(0.9, "SGD momentum, in [0, 1).", low=0)
    lr_decay_rate: float = setting(0.96, "Learning-rate factor every --lr_decay_steps, in (0, 1].")
    lr_decay_steps: int = setting(100_000, "Steps between learning-rate decays.", low=1)
    batch_size: int = setting(
        128, "Images per SGD step (an epoch's last partial batch is dropped).", low=1
    )
    eval_batch_size: int = setting(1000, "Images per evaluation call.", low=1, resumable=True)
    epochs: int = setting(400, "Training epochs (the papers: 400).", low=1)
    # the sweep (a run's own net and seed: kind, depth, seed) and the analyses
    sweep: bool = setting(
        False,
        "Train every --depths x (plain, highway), then write the table and figures.",
        resumable=True,
    )
    depths: tuple[str, ...] = setting(
        ("10", "20", "50", "100"), "Depths of --sweep.", resumable=True
    )
    seeds: int = setting(
        1,
        "Runs per (kind, depth) of --sweep, seeds --seed ... --seed + seeds - 1.",
        low=1,
        resumable=True,
    )
    jobs: int = setting(
        1, "Runs of --sweep at a time (child processes when > 1).", low=1, resumable=True
    )
    analyze: bool = setting(
        True,
        "After training a highway net, write its gate heatmaps and lesioning figure.",
        resumable=True,
    )
    heatmap_examples: int = setting(
        10000, "Training images averaged in the mean-T heatmap.", low=1, resumable=True
    )
    lesion_examples: int = setting(
        10000, "Training images of the lesioning study.", low=1, resumable=True
    )
    diagnostics_depth: int = setting(
        50,
        "Depth of the plain nets of the sweep's activation / "
        "gradient diagnostics (0: skip; else >= 2).",
        low=0,
        resumable=True,
    )
    workdir: str | None = setting(
        None,
        "Run directory (a sweep's root); rerunning with it resumes (default: "
        "runs/highway_<dataset>_<kind>_d<depth>, a sweep's runs/highway_<dataset>_<preset "
        "or full>).",
        resumable=True,
    )
    preset: str | None = setting(None, "The preset's name, recorded.", resumable=True, flag=False)

    def check(self) -> None:
        super().check()  # the run settings'
        if not self.sweep and (self.seeds > 1 or self.jobs > 1):
            raise ValueError("--jobs and --seeds are for --sweep")
        for kind, depth in self.plan():  # each net and its learning rate
            self.net(kind, depth)
            lr = self.learning_rate(kind, depth)
            if not lr > 0:
                raise ValueError(f"--lr must be > 0, got {lr}")
        if not self.momentum < 1:
            raise ValueError(f"--momentum must be in [0, 1), got {self.momentum}")
        if not 0 < self.lr_decay_rate <= 1:
            raise ValueError(f"--lr_decay_rate must be in (0, 1], got {self.lr_decay_rate}")
        counts = ("lr_decay_steps", "batch_size", "eval_batch_size", "valid_size")
        not_int = [name for name in counts if not isinstance(getattr(self, name), int)]
        if not_int:
            raise ValueError(
                f"--{not_int[0]} must be an integer, got {getattr(self, not_int[0])!r}"
            )
        if self.diagnostics_depth == 1:
            raise ValueError("--diagnostics_depth must be 0 or >= 2, got 1")

    def plan(self) -> list[tuple[str, int]]:
        """``[(kind, depth)]``: every ``depths`` x (plain, highway) for a sweep, else
        ``[(kind, depth)]``. Raises ValueError for a depth that is not an integer."""
        if not self.sweep:
            return [(self.kind, self.depth)]
        try:
            return [(k, int(d)) for d in self.depths for k in ("plain", "highway")]
        except ValueError:
            raise ValueError(f"--depths must be integers, got {','.join(self.depths)}") from None

    def plain_rates(self) -> dict[int, float]:
        """``plain_lrs`` as ``{depth: rate}``. Raises ValueError for a malformed pair."""
        try:
            pairs = [item.split(":") for item in self.plain_lrs]
            return {int(d): float(lr) for d, lr in pairs}
        except ValueError:
            raise ValueError(
                f"--plain_lrs must be depth:rate pairs, got {list(self.plain_lrs)}"
            ) from None

    def learning_rate(self, kind: str, depth: int) -> float:
        """The initial learning rate of a ``kind`` net of ``depth``: ``lr`` if given, else
        :data:`HIGHWAY_LR` or the plain rate at the depth. Raises ValueError for a plain
        depth without a rate."""
        if self.lr is not None:
            return self.lr
        if kind == "highway":
            return HIGHWAY_LR
        rates = self.plain_rates()
        if depth not in rates:
            raise ValueError(
                f"no plain learning rate for depth {depth} in --plain_lrs "
                f"({','.join(self.plain_lrs)}); pass --lr or add {depth}:rate"
            )
        return rates[depth]

    def net(self, kind: str | None = None, depth: int | None = None) -> FeedForwardNet:
        """The :class:`FeedForwardNet` of ``kind`` and ``depth`` (default: the config's),
        sized for ``dataset``. Raises ValueError (its one line) for a bad setting."""
        kind = self.kind if kind is None else kind
        depth = self.depth if depth is None else depth
        spec = data.DATASETS[self.dataset]
        width = DEFAULT_WIDTH[kind] if self.width is None else self.width
        return FeedForwardNet(
            kind,
            depth,
            width,
            spec.input_size,
            spec.num_classes,
            self.activation,
            self.init,
            self.transform_bias,
        )

    def narrow(
        self, kind: str | None = None, depth: int | None = None, k: int = 0, **changes: Any
    ) -> HighwayConfig:
        """The config of one run: the ``kind`` net of ``depth`` (default: the config's)
        with its width and learning rate resolved, seed ``seed + k``, no sweep (``depths``
        its depth, ``seeds`` and ``jobs`` 1); ``changes`` (e.g. ``workdir``) applied.
        Its ``to_dict()`` is the run's ``config.json``."""
        kind = self.kind if kind is None else kind
        depth = self.depth if depth is None else depth
        return self.replace(
            kind=kind,
            depth=depth,
            width=self.net(kind, depth).width,
            lr=self.learning_rate(kind, depth),
            seed=self.seed + k,
            sweep=False,
            depths=(str(depth),),
            seeds=1,
            jobs=1,
            **changes,
        )

    def runs(self) -> list[tuple[str, HighwayConfig]]:
        """``[(name, config)]``: each run of the :meth:`plan` and seed k < ``seeds``,
        named ``<kind>_d<depth>`` (``_s<k>`` for k > 0: :func:`rhnzoo.studies.sweep.seed_name`),
        its config :meth:`narrow`-ed to it, ``workdir`` ``<output_dir()>/<name>`` for a
        sweep (one net: the config's)."""
        out = []
        for kind, depth in self.plan():
            for k in range(self.seeds):
                name = runner.seed_name(f"{kind}_d{depth}", k)
                own = {"workdir": str(pathlib.Path(self.output_dir()) / name)}
                out.append((name, self.narrow(kind, depth, k, **(own if self.sweep else {}))))
        return out

    def output_dir(self) -> str:
        """``workdir``, else the default: ``runs/highway_<dataset>_<preset or full>`` for a
        sweep (its root), ``runs/highway_<dataset>_<kind>_d<depth>`` for one net."""
        if self.workdir:
            return self.workdir
        if self.sweep:
            return f"runs/highway_{self.dataset}_{self.preset or 'full'}"
        return f"runs/highway_{self.dataset}_{self.kind}_d{self.depth}"


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
        raise ValueError(
            f"--valid_size must be in [1, {n - 1}] for {n} training images, got {valid_size!r}"
        )
    flat = lambda a: np.ascontiguousarray(np.asarray(a, np.uint8).reshape(len(a), -1))
    x, y = flat(train_images), np.asarray(train_labels, np.int32)
    return {
        "train": (x[: n - valid_size], y[: n - valid_size]),
        "valid": (x[n - valid_size :], y[n - valid_size :]),
        "test": (flat(test_images), np.asarray(test_labels, np.int32)),
    }


def make_optimizer(
    cfg: HighwayConfig, lr: float
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """SGD with momentum and a staircase exponential decay from ``lr``: ``(tx, schedule)``."""
    schedule = optax.exponential_decay(lr, cfg.lr_decay_steps, cfg.lr_decay_rate, staircase=True)
    return optax.sgd(schedule, momentum=cfg.momentum or None), schedule


def forward(net: FeedForwardNet, params, batch, key):
    """The net on a batch, for :func:`rhnzoo.tasks.classify.xent_loss`: ``batch`` is
    ``(images uint8 [N, m], labels [N], idx int [B])``; returns ``(logits [B, C], labels
    [B], None, {})`` (no dropout: ``key`` unused)."""
    del key
    images, labels, idx = batch
    return net.apply(params, inputs(images[idx])), labels[idx], None, {}


def make_train_step(net: FeedForwardNet, tx: optax.GradientTransformation):
    """The engine's ``train_step``: ``(state, (images, labels, idx), key) -> (state, sums)``.

    ``images uint8 [N, m]`` and ``labels [N]`` are the device-resident training
    split, ``idx int [B]`` the batch; the update is on the batch's mean
    cross-entropy; ``sums`` are :func:`rhnzoo.tasks.classify.xent_sums` before
    the update.
    """
    return step.make_train_step(classify.xent_loss(functools.partial(forward, net)), tx)


@functools.lru_cache(maxsize=16)
def make_sums_fn(net: FeedForwardNet, stacked: bool = False) -> Callable[..., dict[str, Array]]:
    """jit ``(params, images uint8 [B, m], labels [B], weights [B]) -> xent_sums``
    (``stacked``: K stacked seeds' params, the sums ``[K]``).

    The stacked sums are each seed's, one seed after another in the one program
    (``jax.lax.map``), each formed as the unstacked function forms it: on the CPU equal
    bit for bit to a separate run's, so a near-tie picks the same best checkpoint. (A
    ``jax.vmap`` over the seeds rounded differently: validation losses off in the 8th
    digit at some shapes.)
    """
    sums = lambda p, images, labels, w: classify.xent_sums(net.apply(p, inputs(images)), labels, w)
    if not stacked:
        return jax.jit(sums)
    return jax.jit(lambda ps, *batch: jax.lax.map(lambda p: sums(p, *batch), ps))


def evaluate(
    net: FeedForwardNet,
    params: Params,
    split: Split,
    batch_size: int = 1000,
    track=None,
    desc: str = "",
    mesh=None,
) -> dict[str, float]:
    """Mean cross-entropy (nats) and accuracy of ``params`` on ``split``:
    ``{'loss', 'accuracy', 'count'}`` (:func:`rhnzoo.tasks.classify.evaluate`)."""
    return classify.evaluate(make_sums_fn(net), params, split, batch_size, track, desc, mesh)


def init_state(net: FeedForwardNet, tx: optax.GradientTransformation, key: Array) -> dict:
    """A fresh training state ``{'params', 'opt_state'}``: ``net.init(key)`` and ``tx``'s
    state of it."""
    params = net.init(key)
    return {"params": params, "opt_state": tx.init(params)}


def _check_images(net: FeedForwardNet, splits: Mapping[str, Split]) -> None:
    """Raises ValueError (one line) unless every split's images are ``[N, net.input_size]``."""
    for name, (x, _) in splits.items():
        if x.ndim != 2 or x.shape[1] != net.input_size:
            raise ValueError(
                f"{name} images are {x.shape[1:]} per example, the net takes "
                f"{net.input_size} inputs"
            )


def train_and_evaluate(
    cfg: HighwayConfig,
    splits: Mapping[str, Split],
    workdir: str | os.PathLike | None = None,
    *,
    net: FeedForwardNet | None = None,
    devices: list | None = None,
    log: Callable[[str], None] | None = print,
    on_divergence: str = "raise",
    seeds: int | None = None,
) -> engine.RunResult | list[engine.RunResult]:
    """Trains and evaluates one net: the one entry point of a highway / plain net run.

    Builds the net, the optimizer (:func:`make_optimizer` at
    :meth:`HighwayConfig.learning_rate` of the net's kind and depth), the state, the
    batches (:func:`rhnzoo.tasks.classify.batch_indices` of ``cfg.seed``) and the
    evaluation, and runs them on :func:`rhnzoo.engine.run` at ``cfg``, in
    ``workdir`` (None: in memory), whose ``config.json`` is ``cfg.to_dict()`` (a run's
    own config: :meth:`HighwayConfig.narrow`).

    Args:
      cfg: the run's settings; splits: :func:`split_data`'s (images uint8 ``[N, m]``).
      net: the model; default ``cfg.net()`` (the dataset's sizes): pass one only for
        images of other sizes (synthetic data). ``config.json`` records ``cfg``.
      devices: data parallelism over these (default: all): the training split and the
        parameters replicated, each batch's rows split over a ``Mesh(("data",))``.
      log, on_divergence, seeds: :func:`rhnzoo.engine.run`'s (``seeds``: K
        seeds stacked, a list of their results).

    Returns:
      The engine's :class:`~rhnzoo.engine.RunResult`: results ``valid_xent``,
      ``valid_acc``, ``test_xent``, ``test_acc`` (nats, fractions) of the best epoch.

    Raises:
      ValueError: (one line) images not ``[N, net.input_size]``, a training split
        smaller than a batch, devices that do not divide the batch, an incompatible
        workdir; and what :func:`rhnzoo.engine.run` raises.
    """
    net = cfg.net() if net is None else net
    _check_images(net, splits)
    x_train, y_train = splits["train"]
    steps_per_epoch = classify.steps_per_epoch(len(x_train), cfg.batch_size)
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(cfg.batch_size, mesh)
    tx, schedule = make_optimizer(cfg, cfg.learning_rate(net.kind, net.depth))
    replicated = sharding.replicated(mesh)
    images, labels = sharding.put_tree((x_train, y_train), replicated)
    fresh = jax.jit(functools.partial(init_state, net, tx))  # one compilation per run

    def indices(seed: int, epoch: int, index: int):
        idx = classify.batch_indices(seed, epoch, index, len(x_train), cfg.batch_size)
        return idx.astype(np.int32)

    def get_batch(seed: int, epoch: int, index: int):
        return images, labels, sharding.put_rows(indices(seed, epoch, index), mesh)

    def get_batches(seeds, epoch: int, index: int):  # K seeds' indices into one training set
        idx = np.stack([indices(seed, epoch, index) for seed in seeds])
        return images, labels, sharding.put_rows(idx, mesh, stacked=True)

    def metrics(params, split: str, track) -> dict[str, float]:
        r = evaluate(net, params, splits[split], cfg.eval_batch_size, track, split, mesh)
        return {f"{split}_xent": r["loss"], f"{split}_acc": r["accuracy"]}

    def validate(params, track) -> dict[str, float]:
        out = metrics(params, "valid", track)
        return {**out, "valid_loss": out["valid_xent"]}

    seeds_sums = make_sums_fn(net, stacked=True)

    def validate_stacked(params, track) -> list[dict[str, float]]:  # K seeds at once
        rows = classify.evaluate(
            seeds_sums,
            params,
            splits["valid"],
            cfg.eval_batch_size,
            track,
            "valid",
            mesh,
            stacked=True,
        )
        return [
            {"valid_xent": r["loss"], "valid_acc": r["accuracy"], "valid_loss": r["loss"]}
            for r in rows
        ]

    task = engine.Task(
        init_state=lambda key: sharding.put_tree(fresh(key), replicated),
        train_step=make_train_step(net, tx),
        get_batch=get_batch,
        get_batches=get_batches,
        seed_axes=(None, None, 0),
        steps_per_epoch=steps_per_epoch,
        validate=validate,
        validate_stacked=validate_stacked,
        final_evaluate=lambda p, track: {**metrics(p, "valid", track), **metrics(p, "test", track)},
        select="valid_xent",
        train_metrics=classify.train_metrics,
        chance_loss=math.log(net.num_classes),
        unit="img",
        learning_rate=lambda step: float(schedule(step)),
    )
    return engine.run(task, cfg, workdir, seeds=seeds, on_divergence=on_divergence, log=log)


def train_run(
    cfg: HighwayConfig,
    splits: Mapping[str, Split],
    log,
    workdir: pathlib.Path,
    on_divergence: str,
    quiet: bool = False,
    seeds: int | None = None,
) -> dict[str, Any]:
    """A sweep's :attr:`rhnzoo.studies.sweep.Run.train` (bound with
    :func:`functools.partial` to the first three, ``quiet`` and ``seeds``): trains the run
    ``cfg`` (one of :meth:`HighwayConfig.runs`; ``seeds``: K seeds of it stacked) in
    ``workdir``; returns its (first seed's) results. With ``quiet`` (and a ``log``) its
    lines go to ``<workdir>/sweep.log`` (:func:`rhnzoo.studies.sweep.run_log`)."""
    if quiet and log is not None:
        log = runner.run_log(workdir)
    out = train_and_evaluate(
        cfg, splits, workdir, log=log, on_divergence=on_divergence, seeds=seeds
    )
    return out.results if seeds is None else out[0].results


def sweep(
    cfg: HighwayConfig,
    splits: Mapping[str, Split],
    *,
    log: Callable[[str], None] | None = print,
    jobs: runner.Jobs | None = None,
) -> list[dict[str, Any]]:
    """Trains every run of ``cfg`` (:meth:`HighwayConfig.runs`), each in its own workdir
    under ``cfg.output_dir()``, on the multi-run runner (:mod:`rhnzoo.studies.sweep`):
    one after another in this process, or side by side in child processes (``jobs``).
    Either way each run's lines go to its workdir's ``sweep.log`` and ``log`` gets the
    runner's lines: one as each run starts and ends (its final line, the estimated time
    of the runs left, each run's size its epochs x parameters).

    A finished run says ``already finished`` (the engine), an interrupted one resumes
    from its checkpoint. A run that diverges stops there and is reported
    (``results['diverged']``), the sweep goes on (the runner's ``on_divergence='stop'``).
    Every workdir is checked before the first run starts, so an incompatible one fails
    the sweep before any training.

    Returns:
      Per run: ``{'kind', 'depth', 'width', 'params', 'lr', 'seed', 'workdir',
      'results' (results.json), 'history' (epoch records), 'failed' (why its child
      failed, or None)}``.

    Raises:
      ValueError: an incompatible workdir; Interrupted: SIGTERM/SIGINT (the current
      run's state saved); RunError: a file could not be written.
    """
    root = pathlib.Path(cfg.output_dir())
    runs, quiet = cfg.runs(), jobs is None or jobs.here
    plan = runner.seed_runs(
        runs,
        cfg.seeds,
        lambda r, k: functools.partial(train_run, r, splits, log, quiet=quiet, seeds=k),
        stack=jobs is not None and jobs.stack_seeds,
        size=lambda r: r.epochs * r.net().num_params(),
    )
    runner.run_all(plan, root, log=log, jobs=jobs, on_divergence="stop", quiet=quiet)
    done = runner.collect(root, [name for name, _ in runs])
    out = []
    for name, r in runs:
        net, found = r.net(), done[name] or {}
        out.append(
            {
                "kind": net.kind,
                "depth": net.depth,
                "width": net.width,
                "params": net.num_params(),
                "lr": r.lr,
                "seed": r.seed,
                "workdir": root / name,
                **{k: found.get(k) for k in ("results", "history", "failed")},
            }
        )
    return out
