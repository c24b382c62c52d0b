"""Training piano-roll models (JSB Chorales) on the run engine, and the JSB optimisation
study of Zilly et al. (2017, sec. 5.1, Fig. 4).

:func:`train` keeps the random search simple: one call per trial, in memory (no
workdir, no checkpoints) unless a workdir is given, and every trial of the same model
shares one compiled step (the hyperparameters live in the optimizer state). Minibatch k
of epoch e is the k-th slice of a permutation drawn from ``(seed, e)``, padded to the
longest training sequence, so every step has one shape and a resumed run sees the same
batches.

Settings: :class:`PolyphonicConfig` (one model's training), :class:`JSBConfig` (the
study; presets in :mod:`rhnzoo.configs.jsb`), :class:`TrialConfig` (one trial: its
``config.json``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import cells, precision
from rhnzoo.config import Config
from rhnzoo.data.music import NUM_NOTES, pad_batch
from rhnzoo.models import num_params
from rhnzoo.models.piano_roll import PianoRollModel, nll_sums
from rhnzoo.training import engine, step, sweep

Array = jax.Array
Params = Any

__all__ = ["PianoRollModel", "nll_sums", "num_params", "pad_batch", "sgd", "nll_loss",
           "train_step", "evaluate", "PolyphonicConfig", "PianoRollTask", "make_task", "train",
           "TrainResult", "JSBConfig", "TrialConfig", "study"]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PolyphonicConfig(Config):
    """How one piano-roll model trains (:func:`train`, :func:`make_task`).

    Attributes:
      lr, momentum, max_grad_norm: SGD hyperparameters (see :func:`sgd`); lr > 0,
        0 <= momentum < 1, max_grad_norm > 0.
      batch_size: sequences per step (>= 1); epochs: >= 1.
      max_steps: stop after this many steps (>= 1; None: ``epochs`` full epochs).
      matmul_precision: of the float32 matmuls (:mod:`rhnzoo.precision`; None: JAX's
        setting).

    Raises:
      ValueError: (one line) a value out of range or an unknown matmul precision.
    """

    lr: float
    momentum: float = 0.0
    max_grad_norm: float = 10.0
    batch_size: int = 16
    epochs: int = 10
    max_steps: int | None = None
    matmul_precision: str | None = None

    def check(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        if not self.lr > 0 or not 0 <= self.momentum < 1 or not self.max_grad_norm > 0:
            raise ValueError(
                f"need lr > 0, 0 <= momentum < 1, max_grad_norm > 0; got {self.lr}, "
                f"{self.momentum}, {self.max_grad_norm}"
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        precision.check_setting(self.matmul_precision)


# ------------------------------------------------------------------------ the step


def sgd(learning_rate: float, momentum: float, max_grad_norm: float):
    """Global-norm clipping followed by SGD with (heavy-ball) momentum; momentum = 0 is
    plain SGD. The three hyperparameters live in the optimizer state
    (``optax.inject_hyperparams``), so one compiled train step serves every setting."""
    return optax.inject_hyperparams(_clipped_sgd)(
        learning_rate=learning_rate, momentum=momentum, max_grad_norm=max_grad_norm
    )


def _clipped_sgd(learning_rate, momentum, max_grad_norm):
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm), optax.sgd(learning_rate, momentum=momentum)
    )


def nll_loss(model: PianoRollModel, params: Params, batch, key: Array, carry):
    """The loss of :func:`rhnzoo.training.step.make_train_step`: the batch's mean NLL per
    time step (nats). ``batch``: ``(x [T, B, 88], mask [T, B])`` (``pad_batch``); ``key``
    unused (no dropout), ``carry`` passed through (None). Returns ``(mean, ({'loss': Σ
    NLL, 'count': predictions}, carry))``."""
    del key  # no dropout
    total, count = nll_sums(model, params, *batch)
    return total / jnp.maximum(count, 1.0), ({"loss": total, "count": count}, carry)


@functools.lru_cache(maxsize=None)
def _engine_step(model: PianoRollModel):
    """The engine's ``train_step(state, batch, key) -> (state, sums)`` for ``model``: the
    one step (:func:`rhnzoo.training.step.make_train_step`) on :func:`nll_loss` with the
    clipped SGD whose hyperparameters come from the optimizer state. One function object
    per model, so every trial of a random search reuses the compiled step."""
    return step.make_train_step(functools.partial(nll_loss, model), sgd(0.0, 0.0, 1.0))


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def train_step(model: PianoRollModel, params, opt_state, x: Array, mask: Array):
    """One SGD step on a padded minibatch (the engine's step, jitted); the loss is the
    NLL per prediction of the batch.

    Args:
      model: static (hashable); params, opt_state: donated; opt_state from
        ``sgd(...).init(params)``; x ``[T, B, 88]``, mask ``[T, B]`` (``pad_batch``).
    Returns:
      ``(params, opt_state, loss)``; loss is the batch's mean NLL per time step (nats)
      before the update.
    """
    state = {"params": params, "opt_state": opt_state}
    state, sums = _engine_step(model)(state, (x, mask), None)
    return state["params"], state["opt_state"], sums["loss"] / jnp.maximum(sums["count"], 1.0)


_nll_sums_jit = jax.jit(nll_sums, static_argnums=0)


def evaluate(
    model: PianoRollModel,
    params: Params,
    seqs: Sequence[np.ndarray],
    *,
    length: int | None = None,
    batch_size: int | None = None,
) -> float:
    """NLL per time step (nats) of ``seqs`` (rolls ``[T_i, 88]``): the next-step NLL summed
    over all Σ (T_i - 1) predictions, divided by their number.

    Batches of ``batch_size`` sequences (default: all of them) are padded to ``length``
    (default: the longest); fixing both lets several splits share one compiled shape.

    Raises: ValueError if no sequence has two or more frames, or length/batch_size too small.
    """
    length = max(s.shape[0] for s in seqs) if length is None else length
    batch_size = len(seqs) if batch_size is None else batch_size
    total, count = 0.0, 0.0
    for i in range(0, len(seqs), batch_size):
        x, mask = pad_batch(seqs[i : i + batch_size], length, batch_size)
        t, c = _nll_sums_jit(model, params, jnp.asarray(x), jnp.asarray(mask))
        total, count = total + float(t), count + float(c)
    if count == 0:
        raise ValueError("no predictions: every sequence has fewer than two frames")
    return total / count


# ------------------------------------------------------------------------ the task


@functools.lru_cache(maxsize=4)
def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the ``n`` training sequences in ``epoch``: a permutation drawn from
    ``(seed, epoch)`` only, so batch k of epoch e is the same in a resumed run."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def _train_metrics(sums) -> dict[str, float]:
    return {"train_nll": sums["loss"] / max(sums["count"], 1.0)}


class PianoRollTask:
    """The next-step piano-roll task; its bound methods are the engine's callables
    (:meth:`task`). Args as :func:`make_task`."""

    def __init__(self, model: PianoRollModel, data: dict[str, Sequence[np.ndarray]],
                 config: PolyphonicConfig, *, seed: int = 0,
                 params: Params | None = None):  # fmt: skip
        self.model, self.data, self.config = model, data, config
        self.seed, self.params = seed, params
        self.train_seqs = list(data["train"])
        self.length = max(s.shape[0] for s in self.train_seqs)
        # Valid and test padded to one shape: the evaluation compiles once per model.
        self.eval_pad = {
            "length": max(s.shape[0] for split in ("valid", "test") for s in data[split]),
            "batch_size": max(len(data["valid"]), len(data["test"])),
        }

    def init_state(self, key: Array):
        p = self.model.init(key) if self.params is None else self.params
        c = self.config
        return {"params": p, "opt_state": sgd(c.lr, c.momentum, c.max_grad_norm).init(p)}

    def get_batch(self, epoch: int, index: int):
        b = self.config.batch_size
        picked = epoch_order(self.seed, epoch, len(self.train_seqs))[index * b : (index + 1) * b]
        return pad_batch([self.train_seqs[j] for j in picked], self.length, b)

    def validate(self, params: Params, track) -> dict[str, float]:
        nll = evaluate(self.model, params, self.data["valid"], **self.eval_pad)
        return {"valid_nll": nll, "valid_loss": nll}

    def final_evaluate(self, params: Params, track) -> dict[str, float]:
        return {f"{split}_nll": evaluate(self.model, params, self.data[split], **self.eval_pad)
                for split in ("valid", "test")}  # fmt: skip

    def task(self) -> engine.Task:
        """The :class:`rhnzoo.training.engine.Task`."""
        return engine.Task(
            init_state=self.init_state, train_step=_engine_step(self.model),
            get_batch=self.get_batch,
            steps_per_epoch=-(-len(self.train_seqs) // self.config.batch_size),
            validate=self.validate, final_evaluate=self.final_evaluate, select="valid_nll",
            chance_loss=NUM_NOTES * math.log(2), unit="step", train_metrics=_train_metrics,
        )  # fmt: skip


def make_task(model: PianoRollModel, data: dict[str, Sequence[np.ndarray]],
              config: PolyphonicConfig, *, seed: int = 0,
              params: Params | None = None) -> engine.Task:  # fmt: skip
    """The next-step piano-roll task for the run engine (see :func:`train` for the args)."""
    return PianoRollTask(model, data, config, seed=seed, params=params).task()


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train`. NLLs are nats per time step. ``diverged``: training
    stopped at a non-finite or exploding loss; ``best_valid`` / ``test_at_best`` are still
    those of the best epoch before it, or inf (and ``best_epoch`` 0) if there was none."""

    best_valid: float
    test_at_best: float
    best_epoch: int  # 1-based; 0 if none
    diverged: bool
    epochs_run: int
    history: tuple[dict, ...]  # per epoch: epoch, train, valid, seconds
    seconds: float


def train(
    model: PianoRollModel,
    data: dict[str, Sequence[np.ndarray]],
    config: PolyphonicConfig | None = None,
    *,
    key: Array | int = 0,
    params: Params | None = None,
    log: Callable[[str], None] | None = None,
    workdir: str | None = None,
    on_divergence: str = "stop",
    **settings: Any,
) -> TrainResult:
    """Train ``model`` on ``data['train']`` with clipped SGD, keeping the best validation epoch.

    Runs on the run engine: each epoch visits the training sequences in an order drawn
    from ``(seed, epoch)``, in minibatches of ``batch_size`` (the last one padded with
    empty sequences) padded to the longest training sequence. After each epoch the
    validation NLL is computed; the test figure reported is the test NLL of the best
    validation epoch. A non-finite or exploding loss (above twice the chance level,
    88 log 2) stops the trial, which is then reported as diverged.

    Args:
      model: the model; data: ``{'train', 'valid', 'test'}`` -> rolls ``[T_i, 88]``.
      config: the training settings (:class:`PolyphonicConfig`); ``settings``: its
        fields as keywords (``lr=0.1, epochs=3``), replacing those of ``config``.
      key: PRNG key or int seed: initialisation (unless ``params`` given) and batch order.
      params: initial parameters (default ``model.init``); consumed (donated to the step).
      log: called with one line per epoch, if given.
      workdir: a run directory for checkpoints and resume (default: in memory).
      on_divergence: ``'stop'`` (the trial ends, reported as diverged) or ``'raise'``
        (:class:`rhnzoo.training.engine.TrainingDiverged`).
    Returns: TrainResult.
    Raises: ValueError for invalid hyperparameters.
    """
    config = PolyphonicConfig(**settings) if config is None else config.replace(**settings)
    seed = key if isinstance(key, int) else int(jax.random.randint(key, (), 0, 2**31 - 1))
    task = make_task(model, data, config, seed=seed, params=params)
    run = engine.RunConfig(epochs=config.epochs, seed=seed, max_steps=config.max_steps,
                           progress=False, log_every=10**9,
                           matmul_precision=config.matmul_precision)  # fmt: skip
    epoch_lines = None if log is None else functools.partial(_epoch_lines, log)
    start = time.perf_counter()
    out = engine.run(task, run, workdir, on_divergence=on_divergence, log=epoch_lines)
    spe = task.steps_per_epoch
    best_step = out.results["best_step"]
    return TrainResult(
        best_valid=out.results.get("valid_nll", math.inf) if best_step > 0 else math.inf,
        test_at_best=out.results.get("test_nll", math.inf) if best_step > 0 else math.inf,
        best_epoch=-(-best_step // spe) if best_step > 0 else 0,
        diverged=out.diverged,
        epochs_run=-(-out.results["step"] // spe),
        history=tuple({"epoch": r["epoch"], "train": r["train_nll"], "valid": r["valid_nll"],
                       "seconds": r["elapsed_s"]} for r in out.history),  # fmt: skip
        seconds=time.perf_counter() - start,
    )


def _epoch_lines(log: Callable[[str], None], line: str) -> None:
    """Passes the engine's epoch lines on to ``log``."""
    if line.startswith("epoch"):
        log(line)


# ----------------------------------------------- the JSB optimisation study (Zilly et al.)

# Random search (one draw per trial index, shared by every architecture and depth, so the
# comparison is paired): learning rate log-uniform in [10^-2.5, 10^0]; momentum 0 (plain
# SGD) with probability 1/2, else 1 - 10^U(-2, -1); global-norm clip log-uniform in
# [1, 100]; uniform init half-width log-uniform in [0.01, 0.3]; RHN T bias U[-4, 0].
SEARCH_SPACE = {
    "log10_lr": (-2.5, 0.0),
    "p_momentum": 0.5,
    "log10_one_minus_momentum": (-2.0, -1.0),
    "log10_max_grad_norm": (0.0, 2.0),
    "log10_init_scale": (-2.0, math.log10(0.3)),
    "init_bias": (-4.0, 0.0),
}
# Settings that must match for a rerun to extend a study (the study root's config.json).
STUDY_KEYS = ("width", "epochs", "batch_size", "seed", "max_steps", "matmul_precision")
# A trial's results.json (and its row's keys beside its config).
RESULT_KEYS = ("valid_nll", "test_nll", "best_epoch", "epochs_run", "diverged", "seconds")
# The init settings of the compiled model of every trial: one compiled step per (arch,
# depth); a trial's own init_scale / init_bias only shape its initial parameters.
STATIC_INIT = {"init_scale": 0.04, "init_bias": -2.0}


@dataclasses.dataclass(frozen=True)
class JSBConfig(Config):
    """The JSB Chorales optimisation study (``experiments/jsb.py``; defaults: the full
    study, presets in :mod:`rhnzoo.configs.jsb`).

    Attributes:
      archs: registered cells (:data:`rhnzoo.cells.ALL_NAMES`); Zilly et al. Fig. 4
        compares RHN, DT-RNN and DT(S)-RNN.
      depths: recurrence (transition) depths (>= 1); Fig. 4: 1, 2, 4 and 6.
      trials: random-search trials per (architecture, depth) (>= 1).
      width: RHN width defining the target parameter count at each depth (>= 1).
      epochs, batch_size, max_steps, matmul_precision: every trial's
        (:class:`PolyphonicConfig`).
      seed: of the hyperparameter draws, the initialisation and the shuffling.

    Once checked, repeated architectures and depths are dropped (the first kept).

    Raises:
      ValueError: (one line, as ``experiments/jsb.py`` reports it) an unknown or no
        architecture, a depth that is not an integer, a size below 1.
    """

    archs: tuple[str, ...] = ("rhn", "dtrnn", "dtsrnn")
    depths: tuple[int, ...] = (1, 2, 4, 6)
    trials: int = 20
    width: int = 64
    epochs: int = 40
    batch_size: int = 16
    seed: int = 0
    max_steps: int | None = None
    matmul_precision: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "archs", tuple(self.archs))
        object.__setattr__(self, "depths", tuple(self.depths))
        super().__post_init__()
        object.__setattr__(self, "archs", tuple(dict.fromkeys(self.archs)))
        object.__setattr__(self, "depths", tuple(dict.fromkeys(self.depths)))

    def check(self) -> None:
        unknown = [a for a in self.archs if a not in cells.ALL_NAMES]
        if unknown or not self.archs:
            raise ValueError(f"--archs must be a non-empty subset of {list(cells.ALL_NAMES)}, "
                             f"got {unknown}")  # fmt: skip
        if not all(isinstance(d, int) for d in self.depths):
            raise ValueError(f"--depths must be integers, got {list(self.depths)}")
        sizes = [(k, getattr(self, k)) for k in ("width", "epochs", "batch_size", "max_steps")
                 if getattr(self, k) is not None]  # fmt: skip
        for name, value in sizes + [("trials", self.trials), *(("depth", d) for d in self.depths)]:
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        precision.check_setting(self.matmul_precision)

    def settings(self) -> dict[str, Any]:
        """The settings every trial shares (:data:`STUDY_KEYS`; the precision resolved):
        the study root's ``config.json``."""
        values = {k: getattr(self, k) for k in STUDY_KEYS}
        return {**values, "matmul_precision": precision.resolve(self.matmul_precision)}


@dataclasses.dataclass(frozen=True)
class TrialConfig(Config):
    """One trial of the study: an (architecture, depth, trial index), its width and
    parameter count (:func:`plan`), its hyperparameters (:func:`sample_hparams`) and the
    study's settings; :meth:`to_dict` is its workdir's ``config.json`` (keys in this order).

    Raises:
      ValueError: (one line) hyperparameters out of range (:class:`PolyphonicConfig`).
    """

    arch: str
    depth: int
    trial: int
    hidden: int
    params: int
    lr: float
    momentum: float
    max_grad_norm: float
    init_scale: float
    init_bias: float
    width: int
    epochs: int
    batch_size: int
    seed: int
    max_steps: int | None
    matmul_precision: str | None

    def check(self) -> None:
        self.training()

    @property
    def name(self) -> str:
        """Its workdir's name: ``<arch>_d<depth>_t<trial>``."""
        return f"{self.arch}_d{self.depth}_t{self.trial}"

    def training(self) -> PolyphonicConfig:
        """How its model trains."""
        return PolyphonicConfig(lr=self.lr, momentum=self.momentum,
                                max_grad_norm=self.max_grad_norm, batch_size=self.batch_size,
                                epochs=self.epochs, max_steps=self.max_steps,
                                matmul_precision=self.matmul_precision)  # fmt: skip


def sample_hparams(seed: int, trial: int) -> dict:
    """The hyperparameters of trial ``trial``: a function of (seed, trial) only."""
    rng = np.random.default_rng([seed, trial])
    s = SEARCH_SPACE
    plain = rng.uniform() < s["p_momentum"]
    one_minus = 10 ** rng.uniform(*s["log10_one_minus_momentum"])
    return {
        "lr": float(10 ** rng.uniform(*s["log10_lr"])),
        "momentum": 0.0 if plain else float(1.0 - one_minus),
        "max_grad_norm": float(10 ** rng.uniform(*s["log10_max_grad_norm"])),
        "init_scale": float(10 ** rng.uniform(*s["log10_init_scale"])),
        "init_bias": float(rng.uniform(*s["init_bias"])),
    }


def study_model(arch: str, n: int, depth: int, **init: float) -> PianoRollModel:
    """The study's model: registered cell ``arch`` (:func:`rhnzoo.cells.make`) of width
    ``n`` and recurrence depth ``depth`` with those settings it takes, ``init``
    (``init_scale``, ``init_bias``) over :data:`STATIC_INIT`."""
    settings = {"depth": depth, **STATIC_INIT, **init}
    return PianoRollModel(cells.make(arch, n, **cells.applicable(arch, settings)))


@functools.cache  # plan() asks again for the same widths (abstract shapes: no FLOPs)
def count(arch: str, n: int, depth: int) -> int:
    """Parameters of the whole model (cell + 88-way output layer)."""
    return num_params(study_model(arch, n, depth))


def matched_width(arch: str, depth: int, target: int) -> int:
    """Width n >= 1 whose model parameter count is closest to ``target`` (counts grow with n)."""
    lo, hi = 1, 1
    while count(arch, hi, depth) < target:
        hi *= 2
    while lo < hi:  # smallest n with count >= target
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(arch, mid, depth) < target else (lo, mid)
    below = max(lo - 1, 1)
    return min((below, lo), key=lambda n: (abs(count(arch, n, depth) - target), n))


def plan(archs, depths, width) -> dict:
    """{(arch, depth): dict(hidden, params, target)}: the target count at depth L is that
    of an RHN of ``width``; the RHN gets ``width``, the others the closest count."""
    out = {}
    for depth in depths:
        target = count("rhn", width, depth)
        for arch in archs:
            n = width if arch == "rhn" else matched_width(arch, depth, target)
            out[arch, depth] = {"hidden": n, "params": count(arch, n, depth), "target": target}
    return out


def trial_configs(config: JSBConfig, sizes: dict) -> list[TrialConfig]:
    """Every trial of the study, trials outermost (a study cut short has every (arch,
    depth) with some trials); ``sizes``: :func:`plan`'s."""
    out, settings = [], config.settings()
    for trial in range(config.trials):
        hp = sample_hparams(config.seed, trial)
        for depth in config.depths:
            for arch in config.archs:
                s = sizes[arch, depth]
                out.append(TrialConfig(arch=arch, depth=depth, trial=trial, hidden=s["hidden"],
                                       params=s["params"], **hp, **settings))  # fmt: skip
    return out


def run_trial(trial: TrialConfig, data: dict, *, on_divergence: str = "stop") -> TrainResult:
    """Trains one trial in memory: its key is ``fold_in(PRNGKey(seed), trial)`` (the batch
    order), its initial parameters those of ``fold_in(key, 1)`` under its init settings."""
    model = study_model(trial.arch, trial.hidden, trial.depth)
    init_model = study_model(trial.arch, trial.hidden, trial.depth,
                             init_scale=trial.init_scale, init_bias=trial.init_bias)  # fmt: skip
    key = jax.random.fold_in(jax.random.PRNGKey(trial.seed), trial.trial)
    return train(model, data, trial.training(), key=key,
                 params=init_model.init(jax.random.fold_in(key, 1)),
                 on_divergence=on_divergence)  # fmt: skip


@dataclasses.dataclass(frozen=True, eq=False)
class _Progress:
    """The study's trial lines: ``[done/total]`` counted from the trials' workdirs."""

    trials_dir: pathlib.Path
    names: tuple[str, ...]
    start: float
    log: Callable[[str], None]

    def finished(self) -> int:
        """The trials with a ``results.json``."""
        return sum((self.trials_dir / name / "results.json").is_file() for name in self.names)

    def report(self, t: TrialConfig, r: TrainResult) -> None:
        """One line for trial ``t`` just finished (its results.json not yet written)."""
        bias = f" bias {t.init_bias:.2f}" if "init_bias" in cells.options(t.arch) else ""
        self.log(f"[{self.finished() + 1:4d}/{len(self.names)}] {cells.label(t.arch):>9} "
                 f"d{t.depth} t{t.trial}: lr {t.lr:.3g} mom {t.momentum:.3f} clip "
                 f"{t.max_grad_norm:.3g} scale {t.init_scale:.3g}{bias} -> valid "
                 f"{r.best_valid:.3f} test {r.test_at_best:.3f} (epoch {r.best_epoch}"
                 f"{', diverged' if r.diverged else ''}) {r.seconds:.1f} s | "
                 f"{time.perf_counter() - self.start:.0f} s")  # fmt: skip


def _study_trial(trial: TrialConfig, data: dict, progress: _Progress, on_divergence: str) -> dict:
    """A study run's ``compute`` (:func:`rhnzoo.training.sweep.in_memory`): the trial
    trained, its line printed, its results."""
    r = run_trial(trial, data, on_divergence=on_divergence)
    progress.report(trial, r)
    return {"valid_nll": r.best_valid, "test_nll": r.test_at_best, "best_epoch": r.best_epoch,
            "epochs_run": r.epochs_run, "diverged": r.diverged,
            "seconds": round(r.seconds, 2)}  # fmt: skip


def _study_run(trial: TrialConfig, data: dict, progress: _Progress) -> sweep.Run:
    """The runner's :class:`~rhnzoo.training.sweep.Run` of a trial (trained in memory)."""
    config = trial.to_dict()
    compute = functools.partial(_study_trial, trial, data, progress)
    return sweep.Run(trial.name, config, sweep.in_memory(compute, config))


def study(data: dict, root, config: JSBConfig, *, log: Callable[[str], None] = print,
          jobs: sweep.Jobs | None = None) -> list[dict]:  # fmt: skip
    """The JSB random search on the multi-run runner: one trial = one (arch, depth, trial)
    workdir ``root/trials/<arch>_d<depth>_t<trial>`` holding its config.json
    (:class:`TrialConfig`) and results.json (trials train in memory: no checkpoints; a
    finished trial is not run again, an interrupted study goes on from the finished
    ones). A trial that diverges stops there (the runner's policy). Every trial runs at
    ``config.matmul_precision`` (None: JAX's setting), recorded in its config. ``jobs``
    (:class:`rhnzoo.training.sweep.Jobs`): trials side by side in child processes (a
    trial that fails there is left out of the rows). Returns every finished trial's row
    (also ``root/results.jsonl``)."""
    root = pathlib.Path(root)
    sizes = plan(config.archs, config.depths, config.width)
    _import_results_jsonl(root, config.settings())
    trials = trial_configs(config, sizes)
    progress = _Progress(root / "trials", tuple(t.name for t in trials), time.perf_counter(), log)
    runs = [_study_run(t, data, progress) for t in trials]
    finished = progress.finished()
    if finished:
        log(f"{finished} of {len(runs)} trials already finished")
    parallel = jobs is not None and jobs.n > 1
    sweep.run_all(runs, root / "trials", log=log if parallel else None, jobs=jobs)
    done = sweep.collect(root / "trials", progress.names)
    rows = [_finite({**d["config"], **d["results"]}) for d in done.values() if d and d["results"]]
    with open(root / "results.jsonl", "w") as f:
        f.writelines(json.dumps(engine.strict(row)) + "\n" for row in rows)
    return rows


def _finite(row: dict) -> dict:
    """Strict JSON stores a non-finite NLL as null: back to inf."""
    return {**row, **{k: math.inf if row.get(k) is None else row[k]
                      for k in ("valid_nll", "test_nll")}}  # fmt: skip


def study_table(rows: list[dict], config: JSBConfig, sizes: dict) -> str:
    """Markdown table (:func:`rhnzoo.training.sweep.markdown`): per (arch, depth) the test
    NLL of the best-validation trial and the median over trials (failed trials count as
    +inf)."""
    header = ["architecture", "depth", "hidden", "params", "target", "trials", "failed",
              "test NLL (best valid trial)", "median test NLL", "best valid NLL"]  # fmt: skip
    table = []
    for depth in config.depths:
        for arch in config.archs:
            mine = [r for r in rows if r["arch"] == arch and r["depth"] == depth]
            tests = [r["test_nll"] if math.isfinite(r["valid_nll"]) else math.inf for r in mine]
            best = min(mine, key=lambda r: r["valid_nll"]) if mine else None
            s = sizes[arch, depth]
            table.append([
                cells.label(arch), depth, s["hidden"], f"{s['params']:,}", f"{s['target']:,}",
                len(mine), sum(not math.isfinite(t) for t in tests),
                _nll(best["test_nll"]) if best else None,
                _nll(float(np.median(tests))) if tests else None,
                _nll(best["valid_nll"]) if best else None,
            ])  # fmt: skip
    return sweep.markdown(header, table, blank="-")


def _nll(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "inf"


def _import_results_jsonl(root: pathlib.Path, settings: dict) -> None:
    """A study from before the runner kept its trials in ``root/results.jsonl``: each row
    becomes its trial's workdir (once), so those trials are not run again."""
    path = root / "results.jsonl"
    if not path.is_file() or (root / "trials").is_dir():
        return
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        config = {k: v for k, v in row.items() if k not in RESULT_KEYS} | settings
        workdir = root / "trials" / f"{row['arch']}_d{row['depth']}_t{row['trial']}"
        engine.prepare_workdir(workdir, config)
        engine.write_json(workdir / "results.json",
                          {k: row[k] for k in RESULT_KEYS if k in row})  # fmt: skip
