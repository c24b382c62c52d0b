"""Training piano-roll models (JSB Chorales) on the run engine, and the JSB optimisation
study of Zilly et al. (2017, sec. 5.1, Fig. 4).

:func:`train` is the task's one entry point (its train_and_evaluate): it builds the
optimizer state, the batches and the evaluation and runs the engine's loop. It keeps the
random search simple: one call per trial, in memory (no workdir, no checkpoints) unless a
workdir is given, and every trial of the same model shares one compiled step (the
hyperparameters live in the optimizer state). Minibatch k of epoch e is the k-th slice of
a permutation drawn from ``(seed, e)``, padded to the longest training sequence, so every
step has one shape and a resumed run sees the same batches.

Settings, each declared once (:func:`rhnzoo.config.setting`): :class:`TrainSettings`
(the engine's :class:`~rhnzoo.config.RunSettings`, ``epochs``, ``batch_size``),
:class:`PolyphonicConfig` (one model's training: those and the SGD hyperparameters),
:class:`StudySettings` (what every trial of a study shares), :class:`JSBConfig` (the
study: its flags, its root's ``config.json``; presets in :mod:`rhnzoo.configs.jsb`) and
:class:`TrialConfig` (one trial: its workdir's ``config.json``).
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

from rhnzoo import cells
from rhnzoo.cells import scan
from rhnzoo.config import SEED_HIGH, DataSettings, RunSettings, setting
from rhnzoo.data.music import NUM_NOTES, pad_batch
from rhnzoo.models import num_params
from rhnzoo.models.piano_roll import PianoRollModel, nll_sums
from rhnzoo import engine
from rhnzoo.engine import step
from rhnzoo.studies import sweep, tables

Array = jax.Array
Params = Any

# The init settings of the compiled model of every trial: one compiled step per (arch,
# depth); a trial's own init_scale / init_bias only shape its initial parameters.
STATIC_INIT = {"init_scale": 0.04, "init_bias": -2.0}


@dataclasses.dataclass(frozen=True)
class TrainSettings(RunSettings):
    """How long, and on what batches, a piano-roll model trains: the engine's
    :class:`~rhnzoo.config.RunSettings` (seed, run limits, reporting, the
    divergence check, patience, matmul precision), ``epochs`` and ``batch_size``.
    Defaults: the full JSB study's.

    Raises:
      ValueError: (one line naming the flag) a value out of range.
    """

    epochs: int = setting(
        40, "Epochs of SGD at a constant learning rate (the best validation epoch is kept).", low=1
    )
    batch_size: int = setting(
        16,
        "Sequences per SGD step (whole-sequence BPTT, padded to the longest training sequence).",
        low=1,
    )


@dataclasses.dataclass(frozen=True)
class PolyphonicConfig(TrainSettings):
    """How one piano-roll model trains (:func:`train`): the
    :class:`TrainSettings` and the clipped-SGD hyperparameters (:func:`sgd`).

    Raises:
      ValueError: (one line naming the flag) lr <= 0, momentum outside [0, 1),
        max_grad_norm <= 0, or any :class:`TrainSettings` value out of range.
    """

    lr: float = setting(0.1, "SGD learning rate (> 0).")
    momentum: float = setting(0.0, "Heavy-ball momentum in [0, 1) (0: plain SGD).", low=0)
    max_grad_norm: float = setting(10.0, "Global-norm gradient clipping threshold (> 0).")

    def check(self) -> None:
        super().check()
        for name in ("lr", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name} must be > 0, got {getattr(self, name)}")
        if not self.momentum < 1:
            raise ValueError(f"--momentum must be < 1, got {self.momentum}")


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
    """The loss of :func:`rhnzoo.engine.step.make_train_step`: the batch's mean NLL per
    time step (nats). ``batch``: ``(x [T, B, 88], mask [T, B])`` (``pad_batch``); ``key``
    unused (no dropout), ``carry`` passed through (None). Returns ``(mean, ({'loss': Σ
    NLL, 'count': predictions}, carry))``."""
    del key  # no dropout
    total, count = nll_sums(model, params, *batch)
    return total / jnp.maximum(count, 1.0), ({"loss": total, "count": count}, carry)


@functools.cache
def _engine_step(model: PianoRollModel):
    """The engine's ``train_step(state, batch, key) -> (state, sums)`` for ``model``: the
    one step (:func:`rhnzoo.engine.step.make_train_step`) on :func:`nll_loss` with the
    clipped SGD whose hyperparameters come from the optimizer state. One function object
    per model, so every trial of a random search reuses the compiled step."""
    return step.make_train_step(functools.partial(nll_loss, model), sgd(0.0, 0.0, 1.0))


_nll_sums_jit = jax.jit(nll_sums, static_argnums=0)
_seeds_nll_sums_jit = jax.jit(  # K stacked seeds' parameters
    lambda model, params, x, mask: jax.vmap(lambda p: nll_sums(model, p, x, mask))(params),
    static_argnums=0,
)


def evaluate(
    model: PianoRollModel,
    params: Params,
    seqs: Sequence[np.ndarray],
    *,
    length: int | None = None,
    batch_size: int | None = None,
    stacked: bool = False,
) -> float | list[float]:
    """NLL per time step (nats) of ``seqs`` (rolls ``[T_i, 88]``): the next-step NLL summed
    over all Σ (T_i - 1) predictions, divided by their number.

    Batches of ``batch_size`` sequences (default: all of them) are padded to ``length``
    (default: the longest); fixing both lets several splits share one compiled shape.
    ``stacked``: ``params`` are K seeds' stacked on a leading axis, evaluated at once
    (``jax.vmap``); a list of their K NLLs.

    Raises: ValueError if no sequence has two or more frames, or length/batch_size too small.
    """
    length = max(s.shape[0] for s in seqs) if length is None else length
    batch_size = len(seqs) if batch_size is None else batch_size
    sums = _seeds_nll_sums_jit if stacked else _nll_sums_jit
    total, count = 0.0, 0.0
    for i in range(0, len(seqs), batch_size):
        x, mask = pad_batch(seqs[i : i + batch_size], length, batch_size)
        t, c = sums(model, params, jnp.asarray(x), jnp.asarray(mask))
        total, count = total + np.asarray(t, np.float64), count + float(np.ravel(c)[0])
    if count == 0:
        raise ValueError("no predictions: every sequence has fewer than two frames")
    return (total / count).tolist() if stacked else float(total / count)


# ------------------------------------------------------------------------ the task


@functools.lru_cache(maxsize=4)
def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the ``n`` training sequences in ``epoch``: a permutation drawn from
    ``(seed, epoch)`` only, so batch k of epoch e is the same in a resumed run."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def _train_metrics(sums) -> dict[str, float]:
    return {"train_nll": sums["loss"] / max(sums["count"], 1.0)}


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`train`. NLLs are nats per time step. ``diverged``: training
    stopped at a non-finite or exploding loss; ``best_valid`` / ``test_at_best`` are still
    those of the best epoch before it, or inf (and ``best_epoch`` 0) if there was none.
    ``best_params``: the best-validation parameters (host arrays)."""

    best_valid: float
    test_at_best: float
    best_epoch: int  # 1-based; 0 if none
    diverged: bool
    epochs_run: int
    history: tuple[dict, ...]  # per epoch: epoch, train, valid, seconds
    seconds: float
    best_params: Params = dataclasses.field(default=None, repr=False, compare=False)


def train(
    model: PianoRollModel,
    data: dict[str, Sequence[np.ndarray]],
    config: PolyphonicConfig | None = None,
    *,
    key: Array | int | None = None,
    params: Params | None = None,
    log: Callable[[str], None] | None = None,
    workdir: str | None = None,
    on_divergence: str = "stop",
    seeds: int | None = None,
    **settings: Any,
) -> TrainResult | list[TrainResult]:
    """Train ``model`` on ``data['train']`` with clipped SGD, keeping the best validation epoch.

    Runs on the run engine: each epoch visits the training sequences in an order drawn
    from ``(seed, epoch)`` (:func:`epoch_order`), in minibatches of ``batch_size`` (the
    last one padded with empty sequences) padded to the longest training sequence. After
    each epoch the validation NLL is computed; the test figure reported is the test NLL of
    the best validation epoch. A non-finite or exploding loss (``divergence_factor``,
    judged against the chance level 88 log 2) stops the run, reported as diverged.

    Args:
      model: the model; data: ``{'train', 'valid', 'test'}`` -> rolls ``[T_i, 88]``.
      config: the settings (:class:`PolyphonicConfig`, or a subclass such as
        :class:`TrialConfig`; default: its defaults); ``settings``: its fields as
        keywords (``lr=0.1, epochs=3``), replacing those of ``config``.
      key: PRNG key or int seed replacing ``config.seed``: initialisation (unless
        ``params`` given) and batch order.
      params: initial parameters (default ``model.init``); consumed (donated to the step).
      log: receives the engine's lines (one per epoch, the training loss every
        ``log_every`` steps, the final line); None: silent.
      workdir: a run directory for ``config.json``, checkpoints and resume (default: in
        memory).
      on_divergence: ``'stop'`` (the run ends, reported as diverged) or ``'raise'``
        (:class:`rhnzoo.engine.TrainingDiverged`).
      seeds: K seeds stacked (:func:`rhnzoo.engine.run`; ``workdir`` the
        first's): a list of their results.
    Returns: TrainResult.
    Raises:
      ValueError: (one line) an invalid setting. TypeError: a keyword that is no setting.
    """
    config = (config or PolyphonicConfig()).replace(**settings)
    if key is not None:
        seed = key if isinstance(key, int) else int(jax.random.randint(key, (), 0, 2**31 - 1))
        config = config.replace(seed=seed)
    train_seqs, size = list(data["train"]), config.batch_size
    length = max(s.shape[0] for s in train_seqs)
    # Valid and test padded to one shape: the evaluation compiles once per model.
    pad = {
        "length": max(s.shape[0] for split in ("valid", "test") for s in data[split]),
        "batch_size": max(len(data["valid"]), len(data["test"])),
    }

    def init_state(key: Array):
        p = model.init(key) if params is None else params
        return {
            "params": p,
            "opt_state": sgd(config.lr, config.momentum, config.max_grad_norm).init(p),
        }

    def get_batch(seed: int, epoch: int, index: int):
        order = epoch_order(seed, epoch, len(train_seqs))
        picked = order[index * size : (index + 1) * size]
        return pad_batch([train_seqs[j] for j in picked], length, size)

    def nlls(p: Params, splits: tuple[str, ...]) -> dict[str, float]:
        return {f"{split}_nll": evaluate(model, p, data[split], **pad) for split in splits}

    def validate(p: Params, track) -> dict[str, float]:
        nll = nlls(p, ("valid",))["valid_nll"]
        return {"valid_nll": nll, "valid_loss": nll}

    def validate_stacked(p: Params, track) -> list[dict[str, float]]:  # K seeds at once
        return [
            {"valid_nll": nll, "valid_loss": nll}
            for nll in evaluate(model, p, data["valid"], **pad, stacked=True)
        ]

    steps_per_epoch = -(-len(train_seqs) // size)
    task = engine.Task(
        init_state=init_state,
        train_step=_engine_step(model),
        get_batch=get_batch,
        steps_per_epoch=steps_per_epoch,
        validate=validate,
        validate_stacked=validate_stacked,
        final_evaluate=lambda p, track: nlls(p, ("valid", "test")),
        select="valid_nll",
        chance_loss=NUM_NOTES * math.log(2),
        unit="step",
        train_metrics=_train_metrics,
    )
    start = time.perf_counter()
    out = engine.run(task, config, workdir, seeds=seeds, on_divergence=on_divergence, log=log)
    seconds = time.perf_counter() - start
    if seeds is None:
        return _result(out, steps_per_epoch, seconds)
    return [_result(o, steps_per_epoch, seconds) for o in out]


def _result(out: engine.RunResult, steps_per_epoch: int, seconds: float) -> TrainResult:
    """:func:`train`'s :class:`TrainResult` of the engine's ``out``: steps counted in
    epochs, the NLLs inf when no epoch was kept."""
    best_step = out.results["best_step"]
    kept = best_step > 0
    return TrainResult(
        best_valid=out.results.get("valid_nll", math.inf) if kept else math.inf,
        test_at_best=out.results.get("test_nll", math.inf) if kept else math.inf,
        best_epoch=-(-best_step // steps_per_epoch) if kept else 0,
        diverged=out.diverged,
        epochs_run=-(-out.results["step"] // steps_per_epoch),
        history=tuple(
            {
                "epoch": r["epoch"],
                "train": r["train_nll"],
                "valid": r["valid_nll"],
                "seconds": r["elapsed_s"],
            }
            for r in out.history
        ),
        seconds=seconds,
        best_params=out.best_params,
    )


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


@dataclasses.dataclass(frozen=True)
class StudySettings(TrainSettings):
    """What every trial of a study shares: the :class:`TrainSettings`, ``width`` and the
    time scan ``scan_impl`` (resumable: every scan computes the same function).

    A study's finished trials are never trained again (they keep their results only),
    so here the run settings that shape a trial's result are structural, though a
    checkpointed run may change them on resume: ``max_steps``, ``max_epochs``,
    ``patience`` and ``divergence_factor`` (like ``epochs``, ``batch_size``, ``seed``
    and ``matmul_precision`` everywhere); a rerun with another value is refused. Their
    help, and ``seed``'s (it also draws the hyperparameters), is the study's.

    Raises:
      ValueError: (one line naming the flag) a value out of range.
    """

    seed: int = setting(
        0,
        "Seed of the hyperparameter draws, the initialisation and the "
        f"batch order: 0 to {SEED_HIGH}.",
        low=0,
        high=SEED_HIGH,
    )
    width: int = setting(
        64,
        "RHN width defining the target parameter count at each depth "
        "(the other cells get the width with the nearest count).",
        low=1,
    )
    max_steps: int | None = setting(None, "Stop every trial after this many steps.", low=1)
    max_epochs: int | None = setting(None, "Stop every trial after this many epochs.", low=1)
    patience: int | None = setting(
        None,
        "Early stopping: a trial ends after this many epochs "
        "without a lower validation NLL (default: never).",
        low=1,
    )
    divergence_factor: float = setting(
        3.0,
        "F: a trial stops as diverged (its result: its best epoch before) at a NaN/inf "
        "loss, or when a mean training loss over 50 steps (from step 70 on) or a validation "
        "loss is more than ln F nats above chance (88 ln 2) or the trial's best such mean. "
        "0: only NaN/inf stop a trial.",
    )
    scan_impl: str = scan.scan_impl_setting()


@dataclasses.dataclass(frozen=True)
class JSBConfig(StudySettings, DataSettings):
    """The JSB Chorales optimisation study (``experiments/jsb.py``, whose flags are these
    fields); defaults: the full study, presets in :mod:`rhnzoo.configs.jsb`.
    :meth:`to_dict` is the study root's ``config.json``; a rerun in the same root is
    refused when a structural setting differs (:meth:`~rhnzoo.config.Config.conflicts`).

    Its extent, ``archs``, ``depths`` and ``trials``, is resumable: a rerun with more
    trains only the new trials. The engine's ``checkpoint_every_steps``, ``tensorboard``,
    ``log_every`` and ``progress`` do not apply: a trial trains in memory (no workdir,
    so no checkpoints or event files) and silently (one line when it is done).

    Once checked, repeated architectures and depths are dropped (the first kept).

    Raises:
      ValueError: (one line naming the flag) an unknown or no architecture, a depth that
        is not an integer >= 1, any other value out of range.
    """

    archs: tuple[str, ...] = setting(
        ("rhn", "dtrnn", "dtsrnn"),
        f"Architectures: any registered cell ({', '.join(cells.ALL_NAMES)}).",
        resumable=True,
    )
    depths: tuple[int, ...] = setting(
        (1, 2, 4, 6), "Recurrence (transition) depths.", resumable=True
    )
    trials: int = setting(
        20,
        "Random-search trials per (architecture, depth); a rerun with "
        "more trains only the new ones.",
        low=1,
        resumable=True,
    )
    preset: str | None = setting(None, "The preset's name, recorded.", resumable=True, flag=False)
    workdir: str | None = setting(
        None,
        "Output directory (default: runs/jsb_<preset or "
        "full>); rerunning with it skips the finished trials.",
        resumable=True,
    )

    def __post_init__(self):
        object.__setattr__(self, "archs", tuple(self.archs))
        object.__setattr__(self, "depths", tuple(self.depths))
        super().__post_init__()
        object.__setattr__(self, "archs", tuple(dict.fromkeys(self.archs)))
        object.__setattr__(self, "depths", tuple(dict.fromkeys(self.depths)))

    def check(self) -> None:
        super().check()
        unknown = [a for a in self.archs if a not in cells.ALL_NAMES]
        if unknown or not self.archs:
            raise ValueError(
                f"--archs must be a non-empty subset of {list(cells.ALL_NAMES)}, got {unknown}"
            )
        if not all(isinstance(d, int) for d in self.depths):
            raise ValueError(f"--depths must be integers, got {list(self.depths)}")
        if not self.depths or min(self.depths) < 1:
            raise ValueError(f"--depths: every depth must be >= 1, got {list(self.depths)}")
        for arch in self.archs:  # a scan an architecture does not have: one line, up front
            study_model(arch, 1, 1, scan_impl=self.scan_impl)


@dataclasses.dataclass(frozen=True)
class TrialConfig(StudySettings, PolyphonicConfig):
    """One trial of the study: an (architecture, depth, trial index), its width and
    parameter count (:func:`plan`), its hyperparameters (:func:`sample_hparams`) and
    the study's :class:`StudySettings`; :meth:`to_dict` is its workdir's
    ``config.json``. Being a :class:`PolyphonicConfig`, it is how its model trains.

    Raises:
      ValueError: (one line) a value out of range (e.g. :class:`PolyphonicConfig`'s).
    """

    arch: str = setting("rhn", "Registered cell (rhnzoo.cells).", choices=cells.ALL_NAMES)
    depth: int = setting(1, "Recurrence (transition) depth.", low=1)
    trial: int = setting(
        0,
        "Index of the random-search draw: the hyperparameters are sample_hparams(seed, trial).",
        low=0,
    )
    hidden: int = setting(
        64,
        "Cell width (plan: the study's width for the RHN, else the "
        "width with the nearest parameter count).",
        low=1,
    )
    params: int = setting(0, "Parameters of the whole model, cell and output layer (plan).", low=0)
    init_scale: float = setting(
        STATIC_INIT["init_scale"], "Uniform half-width of the trial's initial parameters.", low=0
    )
    init_bias: float = setting(
        STATIC_INIT["init_bias"],
        "Initial transform-gate bias of the trial's initial parameters (cells with one).",
    )

    @property
    def name(self) -> str:
        """Its workdir's name: ``<arch>_d<depth>_t<trial>``."""
        return f"{self.arch}_d{self.depth}_t{self.trial}"


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


def study_model(
    arch: str, n: int, depth: int, *, scan_impl: str = "reference", **init: float
) -> PianoRollModel:
    """The study's model: registered cell ``arch`` (:func:`rhnzoo.cells.make`) of width
    ``n`` and recurrence depth ``depth`` with those settings it takes, ``init``
    (``init_scale``, ``init_bias``) over :data:`STATIC_INIT`, its time scan
    ``scan_impl``."""
    settings = {"depth": depth, **STATIC_INIT, **init}
    return PianoRollModel(
        cells.make(arch, n, **cells.applicable(arch, settings)), scan_impl=scan_impl
    )


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


def plan_lines(sizes: dict, width: int) -> list[str]:
    """The lines saying :func:`plan`'s ``sizes``: per (arch, depth) its width and count."""
    lines = [f"parameter counts (target: RHN of width {width} at each depth):"]
    for (arch, depth), s in sizes.items():
        lines.append(
            f"  {cells.label(arch):>9} depth {depth}: hidden {s['hidden']:4d}, "
            f"{s['params']:8,d} params (target {s['target']:,}, "
            f"{100 * (s['params'] / s['target'] - 1):+.2f}%)"
        )
    return lines


def trial_configs(config: JSBConfig, sizes: dict) -> list[TrialConfig]:
    """Every trial of the study, trials outermost (a study cut short has every (arch,
    depth) with some trials); ``sizes``: :func:`plan`'s. Each trial takes the study's
    :class:`StudySettings`, ``progress`` off (it trains silently)."""
    shared = {f.name: getattr(config, f.name) for f in dataclasses.fields(StudySettings)}
    shared["progress"] = False
    out = []
    for trial in range(config.trials):
        hp = sample_hparams(config.seed, trial)
        for depth in config.depths:
            for arch in config.archs:
                s = sizes[arch, depth]
                out.append(
                    TrialConfig(
                        arch=arch,
                        depth=depth,
                        trial=trial,
                        hidden=s["hidden"],
                        params=s["params"],
                        **hp,
                        **shared,
                    )
                )
    return out


def run_trial(trial: TrialConfig, data: dict, *, on_divergence: str = "stop") -> TrainResult:
    """Trains one trial in memory, silently: its key is ``fold_in(PRNGKey(seed), trial)``
    (the batch order), its initial parameters those of ``fold_in(key, 1)`` under its init
    settings."""
    model = study_model(trial.arch, trial.hidden, trial.depth, scan_impl=trial.scan_impl)
    init_model = study_model(
        trial.arch,
        trial.hidden,
        trial.depth,
        init_scale=trial.init_scale,
        init_bias=trial.init_bias,
    )
    key = jax.random.fold_in(jax.random.PRNGKey(trial.seed), trial.trial)
    return train(
        model,
        data,
        trial,
        key=key,
        params=init_model.init(jax.random.fold_in(key, 1)),
        on_divergence=on_divergence,
    )


@dataclasses.dataclass(eq=False)
class _Progress:
    """The study's trial lines: ``[done/total]`` counted from the trials' workdirs; with
    ``estimate`` (a study in this process), the time the trials left take, as the other
    multi-run scripts say it (:class:`rhnzoo.studies.sweep._Estimate`)."""

    trials_dir: pathlib.Path
    names: tuple[str, ...]
    start: float
    log: Callable[[str], None]
    estimate: Any = None

    def finished(self) -> int:
        """The trials with a ``results.json``."""
        return sum((self.trials_dir / name / "results.json").is_file() for name in self.names)

    def report(self, t: TrialConfig, r: TrainResult) -> None:
        """One line for trial ``t`` just finished (its results.json not yet written)."""
        bias = f" bias {t.init_bias:.2f}" if "init_bias" in cells.options(t.arch) else ""
        left = "" if self.estimate is None else self.estimate.done(t.name, r.seconds)
        left = left.replace(" runs left", " trials left").replace(" run left", " trial left")
        self.log(
            f"[{self.finished() + 1:4d}/{len(self.names)}] {cells.label(t.arch):>9} "
            f"d{t.depth} t{t.trial}: lr {t.lr:.3g} mom {t.momentum:.3f} clip "
            f"{t.max_grad_norm:.3g} scale {t.init_scale:.3g}{bias} -> valid "
            f"{r.best_valid:.3f} test {r.test_at_best:.3f} (epoch {r.best_epoch}"
            f"{', diverged' if r.diverged else ''}) {r.seconds:.1f} s | "
            f"{time.perf_counter() - self.start:.0f} s{left}"
        )


def _study_trial(trial: TrialConfig, data: dict, progress: _Progress, on_divergence: str) -> dict:
    """A study run's ``compute`` (:func:`rhnzoo.studies.sweep.in_memory`): the trial
    trained, its line printed, its results."""
    r = run_trial(trial, data, on_divergence=on_divergence)
    progress.report(trial, r)
    return {
        "valid_nll": r.best_valid,
        "test_nll": r.test_at_best,
        "best_epoch": r.best_epoch,
        "epochs_run": r.epochs_run,
        "diverged": r.diverged,
        "seconds": round(r.seconds, 2),
    }


def _study_run(trial: TrialConfig, data: dict, progress: _Progress) -> sweep.Run:
    """The runner's :class:`~rhnzoo.studies.sweep.Run` of a trial (trained in memory)."""
    compute = functools.partial(_study_trial, trial, data, progress)
    return sweep.Run(trial.name, trial, sweep.in_memory(compute, trial))


def study(
    data: dict,
    root,
    config: JSBConfig,
    *,
    log: Callable[[str], None] = print,
    jobs: sweep.Jobs | None = None,
) -> list[dict]:
    """The JSB random search on the multi-run runner.

    ``root`` holds the study's ``config.json`` (``config.to_dict()``; a rerun in it is
    refused when a structural setting differs, a setting its config.json lacks counting
    as the default) and one workdir per trial, ``root/trials/<arch>_d<depth>_t<trial>``,
    with its config.json (:class:`TrialConfig`) and results.json. Trials train in
    memory (no checkpoints): a finished trial is not run again, an interrupted study
    goes on from the finished ones, a rerun with more trials (archs, depths) trains
    the new ones only. A trial that diverges stops there (the runner's policy). ``jobs``
    (:class:`rhnzoo.studies.sweep.Jobs`): trials side by side in child processes (a
    trial that fails there is left out of the rows). ``log`` gets the planned sizes,
    one line per trial (in this process: ending with the time the trials left take) and
    the runner's lines.

    Returns:
      Every finished trial's row, its config and results (also ``root/results.jsonl``);
      a non-finite NLL is inf.
    Raises:
      ValueError: (one line) ``root`` holds a study with other structural settings, or
        cannot be written.
    """
    root = engine.prepare_workdir(root, config, log=log)
    sizes = plan(config.archs, config.depths, config.width)
    for line in plan_lines(sizes, config.width):
        log(line)
    trials = trial_configs(config, sizes)
    progress = _Progress(root / "trials", tuple(t.name for t in trials), time.perf_counter(), log)
    runs = [_study_run(t, data, progress) for t in trials]
    finished = progress.finished()
    if finished:
        log(f"{finished} of {len(runs)} trials already finished")
    parallel = jobs is not None and jobs.n > 1
    if not parallel and (jobs is None or jobs.only is None):  # the runner's lines say it
        progress.estimate = sweep._Estimate(runs, root / "trials")
    sweep.run_all(runs, root / "trials", log=log if parallel else None, jobs=jobs)
    done = sweep.collect(root / "trials", progress.names)
    rows = [_finite({**d["config"], **d["results"]}) for d in done.values() if d and d["results"]]
    with open(root / "results.jsonl", "w") as f:
        f.writelines(json.dumps(engine.strict(row)) + "\n" for row in rows)
    return rows


def _finite(row: dict) -> dict:
    """Strict JSON stores a non-finite NLL as null: back to inf."""
    return {
        **row,
        **{k: math.inf if row.get(k) is None else row[k] for k in ("valid_nll", "test_nll")},
    }


def study_table(rows: list[dict], config: JSBConfig, sizes: dict) -> str:
    """Markdown table (:func:`rhnzoo.studies.tables.markdown`): per (arch, depth) the test
    NLL of the best-validation trial and the median over trials (failed trials count as
    +inf)."""
    header = [
        "architecture",
        "depth",
        "hidden",
        "params",
        "target",
        "trials",
        "failed",
        "test NLL (best valid trial)",
        "median test NLL",
        "best valid NLL",
    ]
    table = []
    for depth in config.depths:
        for arch in config.archs:
            mine = [r for r in rows if r["arch"] == arch and r["depth"] == depth]
            tests = [r["test_nll"] if math.isfinite(r["valid_nll"]) else math.inf for r in mine]
            best = min(mine, key=lambda r: r["valid_nll"]) if mine else None
            s = sizes[arch, depth]
            table.append(
                [
                    cells.label(arch),
                    depth,
                    s["hidden"],
                    f"{s['params']:,}",
                    f"{s['target']:,}",
                    len(mine),
                    sum(not math.isfinite(t) for t in tests),
                    _nll(best["test_nll"]) if best else None,
                    _nll(float(np.median(tests))) if tests else None,
                    _nll(best["valid_nll"]) if best else None,
                ]
            )
    return tables.markdown(header, table, blank="-")


def _nll(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "inf"
