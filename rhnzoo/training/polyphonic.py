"""Training piano-roll models (JSB Chorales) on the run engine.

:func:`train` keeps the random search of ``experiments/jsb.py`` simple: one call per
trial, in memory (no workdir, no checkpoints) unless a workdir is given, and every
trial of the same model shares one compiled step (the hyperparameters live in the
optimizer state). Minibatch k of epoch e is the k-th slice of a permutation drawn
from ``(seed, e)``, padded to the longest training sequence, so every step has one
shape and a resumed run sees the same batches.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import precision
from rhnzoo.data.music import NUM_NOTES, pad_batch
from rhnzoo.models import num_params
from rhnzoo.models.piano_roll import PianoRollModel, nll_sums
from rhnzoo.training import engine

Array = jax.Array
Params = Any

__all__ = ["PianoRollModel", "nll_sums", "num_params", "pad_batch", "sgd", "train_step",
           "evaluate", "make_task", "train", "TrainResult"]  # fmt: skip


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


def _update(model: PianoRollModel, params, opt_state, x: Array, mask: Array):
    """One clipped-SGD update on the batch's mean NLL per time step; returns the new
    params and optimizer state and the batch's ``(total, count)`` before the update."""

    def loss_fn(p):
        total, count = nll_sums(model, p, x, mask)
        return total / jnp.maximum(count, 1.0), (total, count)

    grads, sums = jax.grad(loss_fn, has_aux=True)(params)
    updates, opt_state = sgd(0.0, 0.0, 1.0).update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, sums


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def train_step(model: PianoRollModel, params, opt_state, x: Array, mask: Array):
    """One SGD step on a padded minibatch; the loss is the NLL per prediction of the batch.

    Args:
      model: static (hashable); params, opt_state: donated; opt_state from
        ``sgd(...).init(params)``; x ``[T, B, 88]``, mask ``[T, B]`` (``pad_batch``).
    Returns:
      ``(params, opt_state, loss)``; loss is the batch's mean NLL per time step (nats)
      before the update.
    """
    params, opt_state, (total, count) = _update(model, params, opt_state, x, mask)
    return params, opt_state, total / jnp.maximum(count, 1.0)


@functools.lru_cache(maxsize=None)
def _engine_step(model: PianoRollModel):
    """The engine's ``train_step`` for ``model``; one function object per model, so
    every trial of a random search reuses the compiled step."""

    def step(state, batch, key):
        del key  # no dropout
        params, opt_state, (total, count) = _update(model, state["params"], state["opt_state"],
                                                    *batch)  # fmt: skip
        return {"params": params, "opt_state": opt_state}, {"loss": total, "count": count}

    return step


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


def make_task(
    model: PianoRollModel,
    data: dict[str, Sequence[np.ndarray]],
    *,
    lr: float,
    momentum: float = 0.0,
    max_grad_norm: float = 10.0,
    batch_size: int = 16,
    seed: int = 0,
    params: Params | None = None,
) -> engine.Task:
    """The next-step piano-roll task for the run engine (see :func:`train` for the args)."""
    if not lr > 0 or not 0 <= momentum < 1 or not max_grad_norm > 0:
        raise ValueError(
            f"need lr > 0, 0 <= momentum < 1, max_grad_norm > 0; got {lr}, {momentum}, "
            f"{max_grad_norm}"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    train_seqs = list(data["train"])
    length = max(s.shape[0] for s in train_seqs)
    steps_per_epoch = -(-len(train_seqs) // batch_size)
    # Valid and test padded to one shape: the evaluation compiles once per model.
    eval_pad = {
        "length": max(s.shape[0] for split in ("valid", "test") for s in data[split]),
        "batch_size": max(len(data["valid"]), len(data["test"])),
    }

    def init_state(key):
        p = model.init(key) if params is None else params
        return {"params": p, "opt_state": sgd(lr, momentum, max_grad_norm).init(p)}

    @functools.lru_cache(maxsize=2)
    def order(epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(len(train_seqs))

    def get_batch(epoch: int, index: int):
        picked = order(epoch)[index * batch_size : (index + 1) * batch_size]
        return pad_batch([train_seqs[j] for j in picked], length, batch_size)

    def validate(p, track):
        nll = evaluate(model, p, data["valid"], **eval_pad)
        return {"valid_nll": nll, "valid_loss": nll}

    def final_evaluate(p, track):
        return {s: evaluate(model, p, data[s.split("_")[0]], **eval_pad)
                for s in ("valid_nll", "test_nll")}  # fmt: skip

    return engine.Task(
        init_state=init_state, train_step=_engine_step(model), get_batch=get_batch,
        steps_per_epoch=steps_per_epoch, validate=validate, final_evaluate=final_evaluate,
        select="valid_nll", chance_loss=NUM_NOTES * math.log(2), unit="step",
        train_metrics=lambda s: {"train_nll": s["loss"] / max(s["count"], 1.0)},
    )  # fmt: skip


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
    *,
    lr: float,
    momentum: float = 0.0,
    max_grad_norm: float = 10.0,
    batch_size: int = 16,
    epochs: int = 10,
    key: Array | int = 0,
    params: Params | None = None,
    log: Callable[[str], None] | None = None,
    max_steps: int | None = None,
    workdir: str | None = None,
    matmul_precision: str | None = None,
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
      lr, momentum, max_grad_norm: SGD hyperparameters (see :func:`sgd`); lr > 0,
        0 <= momentum < 1, max_grad_norm > 0.
      batch_size: sequences per step (>= 1); epochs: >= 1.
      key: PRNG key or int seed: initialisation (unless ``params`` given) and batch order.
      params: initial parameters (default ``model.init``); consumed (donated to the step).
      log: called with one line per epoch, if given.
      max_steps: stop after this many steps (None: ``epochs`` full epochs).
      workdir: a run directory for checkpoints and resume (default: in memory).
      matmul_precision: of the float32 matmuls (:mod:`rhnzoo.precision`; None: JAX's
        setting).
    Returns: TrainResult.
    Raises: ValueError for invalid hyperparameters.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    seed = key if isinstance(key, int) else int(jax.random.randint(key, (), 0, 2**31 - 1))
    task = make_task(model, data, lr=lr, momentum=momentum, max_grad_norm=max_grad_norm,
                     batch_size=batch_size, seed=seed, params=params)  # fmt: skip
    run = engine.RunConfig(epochs=epochs, seed=seed, max_steps=max_steps, progress=False,
                           log_every=10**9, matmul_precision=matmul_precision)  # fmt: skip
    epoch_lines = None if log is None else (lambda line: log(line) if line.startswith("epoch") else None)
    start = time.perf_counter()
    out = engine.run(task, run, workdir, on_divergence="stop", log=epoch_lines)
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
# Settings that must match for a rerun to extend a study.
STUDY_KEYS = ("width", "epochs", "batch_size", "seed", "max_steps", "matmul_precision")


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


def make_cell(arch: str, n: int, depth: int, init_scale: float = 0.04, init_bias: float = -2.0):
    """Any registered cell (:func:`rhnzoo.cells.make`) with those of these settings it takes."""
    from rhnzoo import cells

    settings = dict(depth=depth, init_scale=init_scale, init_bias=init_bias)
    return cells.make(arch, n, **cells.applicable(arch, settings))


def count(arch: str, n: int, depth: int) -> int:
    """Parameters of the whole model (cell + 88-way output layer)."""
    return num_params(PianoRollModel(make_cell(arch, n, depth)))


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


def study_table(rows: list[dict], archs, depths, sizes) -> str:
    """Markdown table: per (arch, depth) the test NLL of the best-validation trial and the
    median over trials (failed trials count as +inf)."""
    from rhnzoo import cells

    lines = [
        "| architecture | depth | hidden | params | target | trials | failed | "
        "test NLL (best valid trial) | median test NLL | best valid NLL |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: f"{v:.3f}" if math.isfinite(v) else "inf"
    for depth in depths:
        for arch in archs:
            mine = [r for r in rows if r["arch"] == arch and r["depth"] == depth]
            tests = [r["test_nll"] if math.isfinite(r["valid_nll"]) else math.inf for r in mine]
            failed = sum(not math.isfinite(t) for t in tests)
            best = min(mine, key=lambda r: r["valid_nll"]) if mine else None
            s = sizes[arch, depth]
            lines.append(
                f"| {cells.label(arch)} | {depth} | {s['hidden']} | {s['params']:,} | "
                f"{s['target']:,} | {len(mine)} | {failed} | "
                f"{fmt(best['test_nll']) if best else '-'} | "
                f"{fmt(float(np.median(tests))) if tests else '-'} | "
                f"{fmt(best['valid_nll']) if best else '-'} |"
            )
    return "\n".join(lines)


def _finite(row: dict) -> dict:
    """Strict JSON stores a non-finite NLL as null: back to inf."""
    return {**row, **{k: math.inf if row.get(k) is None else row[k]
                      for k in ("valid_nll", "test_nll")}}  # fmt: skip


def study(data: dict, root, archs, depths, *, trials: int, width: int, epochs: int,
          batch_size: int, seed: int, max_steps: int | None = None,
          matmul_precision: str | None = None, log=print, jobs=None) -> list[dict]:  # fmt: skip
    """The JSB random search on the multi-run runner: one trial = one (arch, depth, trial)
    workdir ``root/trials/<arch>_d<depth>_t<trial>`` holding its config.json and
    results.json (trials train in memory: no checkpoints; a finished trial is not run
    again, an interrupted study goes on from the finished ones). Trials outermost, so a
    study cut short has every (arch, depth) with some trials. Every trial runs at
    ``matmul_precision`` (None: JAX's setting), recorded in its config. ``jobs``
    (:class:`rhnzoo.training.sweep.Jobs`): trials side by side in child processes (a
    trial that fails there is left out of the rows). Returns every finished trial's row
    (also ``root/results.jsonl``)."""
    import pathlib

    from rhnzoo import cells
    from rhnzoo.training import sweep

    root = pathlib.Path(root)
    settings = dict(width=width, epochs=epochs, batch_size=batch_size, seed=seed,
                    max_steps=max_steps,
                    matmul_precision=precision.resolve(matmul_precision))  # fmt: skip
    sizes = plan(archs, depths, width)
    _import_results_jsonl(root, settings)
    runs, total, start = [], len(archs) * len(depths) * trials, time.perf_counter()
    finished = [0]

    def trial_fn(arch, depth, trial, hp):
        def compute(on_divergence):
            del on_divergence  # a trial always stops on divergence (the runner's default)
            n = sizes[arch, depth]["hidden"]
            # The static model uses fixed init settings so that every trial reuses one
            # compiled step; the trial's init_scale / init_bias only shape the params.
            model = PianoRollModel(make_cell(arch, n, depth))
            init_model = PianoRollModel(make_cell(arch, n, depth, hp["init_scale"], hp["init_bias"]))
            key = jax.random.fold_in(jax.random.PRNGKey(seed), trial)
            r = train(model, data, lr=hp["lr"], momentum=hp["momentum"],
                      max_grad_norm=hp["max_grad_norm"], batch_size=batch_size, epochs=epochs,
                      key=key, params=init_model.init(jax.random.fold_in(key, 1)),
                      max_steps=max_steps,
                      matmul_precision=settings["matmul_precision"])  # fmt: skip
            finished[0] += 1
            log(f"[{finished[0]:4d}/{total}] {cells.label(arch):>9} d{depth} t{trial}: lr {hp['lr']:.3g} "
                f"mom {hp['momentum']:.3f} clip {hp['max_grad_norm']:.3g} scale "
                f"{hp['init_scale']:.3g}"
                + (f" bias {hp['init_bias']:.2f}" if "init_bias" in cells.options(arch) else "")
                + f" -> valid {r.best_valid:.3f} test {r.test_at_best:.3f} (epoch "
                f"{r.best_epoch}{', diverged' if r.diverged else ''}) {r.seconds:.1f} s | "
                f"{time.perf_counter() - start:.0f} s")  # fmt: skip
            return {"valid_nll": r.best_valid, "test_nll": r.test_at_best,
                    "best_epoch": r.best_epoch, "epochs_run": r.epochs_run,
                    "diverged": r.diverged, "seconds": round(r.seconds, 2)}  # fmt: skip

        return compute

    for trial in range(trials):
        hp = sample_hparams(seed, trial)
        for depth in depths:
            for arch in archs:
                s = sizes[arch, depth]
                config = {"arch": arch, "depth": depth, "trial": trial, "hidden": s["hidden"],
                          "params": s["params"], **hp, **settings}  # fmt: skip
                compute = trial_fn(arch, depth, trial, hp)
                runs.append(sweep.Run(f"{arch}_d{depth}_t{trial}", config,
                                      sweep.in_memory(compute, config)))  # fmt: skip
    finished[0] = sum((root / "trials" / r.name / "results.json").is_file() for r in runs)
    if finished[0]:
        log(f"{finished[0]} of {total} trials already finished")
    parallel = jobs is not None and jobs.n > 1
    sweep.run_all(runs, root / "trials", log=log if parallel else None, jobs=jobs)
    done = sweep.collect(root / "trials", [r.name for r in runs])
    rows = [_finite({**d["config"], **d["results"]}) for d in done.values() if d and d["results"]]
    with open(root / "results.jsonl", "w") as f:
        f.writelines(json.dumps(engine.strict(row)) + "\n" for row in rows)
    return rows


def _import_results_jsonl(root, settings) -> None:
    """A study from before the runner kept its trials in ``root/results.jsonl``: each row
    becomes its trial's workdir (once), so those trials are not run again."""
    path = root / "results.jsonl"
    if not path.is_file() or (root / "trials").is_dir():
        return
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        keys = ("valid_nll", "test_nll", "best_epoch", "epochs_run", "diverged", "seconds")
        config = {k: v for k, v in row.items() if k not in keys} | settings
        workdir = root / "trials" / f"{row['arch']}_d{row['depth']}_t{row['trial']}"
        engine.prepare_workdir(workdir, config)
        engine.write_json(workdir / "results.json", {k: row[k] for k in keys if k in row})
