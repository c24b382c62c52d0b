"""Truncated-BPTT trainer for recurrent language models (word- or character-level).

The protocol of the reference RHN code (Zilly et al. 2017, ``rhn_train.py``):

* the training stream is cut into B rows and windows of ``num_steps`` tokens; the
  final carry of a window feeds the next one and is zeroed at each epoch start;
* loss = summed cross-entropy over the window / B, plus ``weight_decay`` times
  half the squared L2 norm of every parameter; global-norm clipping; plain SGD
  with lr = lr0 / lr_decay ** max(epoch - max_epoch + 1, 0) (epochs from 0);
* validation perplexity (batched, no dropout) after every epoch; the best one is
  kept, and the final validation and test perplexity are recomputed from it,
  with batch size 1 over the whole sequence by default.

Everything runs on the device: the training rows live there, the jit-compiled
train step slices its window, draws its dropout masks from
``fold_in(key, step)`` and donates the state, so a resumed run sees the same
data position, RNG stream and optimizer state as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm import tqdm

from rhnzoo import data, dropout
from rhnzoo.lm import LanguageModel

Array = jax.Array
State = dict[str, Any]

# Flags that only change how long or how a run is reported; a workdir may be
# resumed with different values of these (every other setting must match).
RESUMABLE_KEYS = frozenset(
    {"max_steps", "max_epochs", "checkpoint_every_steps", "log_every", "eval_batch_size",
     "eval_num_steps", "data_dir", "download", "workdir", "preset", "progress",
     # Same function, other implementation: a run may switch these on resume.
     "scan_impl", "remat", "unroll", "distributed"}
)  # fmt: skip


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation and run-length settings (defaults: reference ``ptb_sota``).

    Attributes:
      lr: initial SGD learning rate lr0 (for a loss summed over time / B).
      lr_decay: divisor applied to the learning rate every epoch after ``max_epoch``.
      max_epoch: epochs at constant learning rate.
      max_max_epoch: total number of epochs.
      weight_decay: L2 coefficient on 0.5 * sum(p ** 2) over all parameters.
      max_grad_norm: global-norm clipping threshold.
      batch_size: B, rows of the training stream.
      num_steps: truncated-BPTT window length T.
      rates: dropout probabilities.
      seed: seeds the initialisation and the dropout stream.
      max_steps: stop after this many train steps (None: no limit).
      max_epochs: stop after this many epochs (None: ``max_max_epoch``).
      checkpoint_every_steps: also checkpoint every this many steps (0: epochs only).
      eval_batch_size: batch size of the final evaluation (1: reference protocol).
      eval_num_steps: window length of evaluation scans (any value gives the same
        numbers up to float rounding; longer is faster).
      log_every: steps between loss readouts (each one a host sync).
      progress: show a tqdm progress bar.
    """

    lr: float = 0.2
    lr_decay: float = 1.02
    max_epoch: int = 20
    max_max_epoch: int = 500
    weight_decay: float = 1e-7
    max_grad_norm: float = 10.0
    batch_size: int = 20
    num_steps: int = 35
    rates: dropout.Rates = dropout.Rates()
    seed: int = 0
    max_steps: int | None = None
    max_epochs: int | None = None
    checkpoint_every_steps: int = 0
    eval_batch_size: int = 1
    eval_num_steps: int = 100
    log_every: int = 100
    progress: bool = True

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.lr_decay >= 1:
            raise ValueError(f"lr_decay must be >= 1, got {self.lr_decay}")
        for name in (
            "batch_size",
            "num_steps",
            "max_max_epoch",
            "eval_batch_size",
            "eval_num_steps",
            "log_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.weight_decay < 0 or self.max_grad_norm <= 0:
            raise ValueError("weight_decay must be >= 0 and max_grad_norm > 0")

    def schedule(self, steps_per_epoch: int) -> optax.Schedule:
        """The reference learning-rate schedule as a function of the step count."""

        def lr(count):
            epoch = count // steps_per_epoch
            return self.lr / self.lr_decay ** jnp.maximum(epoch - self.max_epoch + 1, 0)

        return lr


def l2_penalty(params: Any) -> Array:
    """0.5 * sum of squares of every parameter (TensorFlow's ``l2_loss``)."""
    return 0.5 * sum(jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params))


def make_optimizer(cfg: TrainConfig, steps_per_epoch: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.max_grad_norm), optax.sgd(cfg.schedule(steps_per_epoch))
    )


def init_state(
    model: LanguageModel, cfg: TrainConfig, tx: optax.GradientTransformation, key: Array
) -> State:
    """The training state: step, params, optimizer state, truncated-BPTT carry,
    the epoch's summed training NLL and the best validation metric so far."""
    params = model.init(key)
    return {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt_state": tx.init(params),
        "carry": model.initial_carry(cfg.batch_size),
        "epoch_nll": jnp.zeros((), jnp.float32),
        "best_valid": jnp.full((), jnp.inf, jnp.float32),
    }


def make_train_step(
    model: LanguageModel,
    cfg: TrainConfig,
    tx: optax.GradientTransformation,
    steps_per_epoch: int,
    state_sharding: Any = None,
):
    """Returns ``train_step(state, rows, key) -> (state, nll)``, jit-compiled, state donated.

    ``rows [B, N] int32`` is the batchified training stream on the device; the step
    trains on window ``state['step'] % steps_per_epoch`` with dropout masks drawn
    from ``fold_in(key, state['step'])``; ``nll`` is the window's summed
    cross-entropy (nats, before weight decay). ``state_sharding`` (from
    :func:`shard_state`) pins the new state's layout for data-parallel runs; the
    gradient all-reduce is inserted by XLA's SPMD partitioner.
    """
    T, B = cfg.num_steps, cfg.batch_size
    m, n = model.embed_size, model.cell.hidden_size

    def loss_fn(params, carry, x, y, masks):
        nll, carry = model.nll(params, carry, x, y, masks)
        return nll / B + cfg.weight_decay * l2_penalty(params), (nll, carry)

    def train_step(state: State, rows: Array, key: Array) -> tuple[State, Array]:
        step = state["step"]
        window = step % steps_per_epoch
        xy = jax.lax.dynamic_slice_in_dim(rows, window * T, T + 1, axis=1)
        x, y = xy[:, :-1], xy[:, 1:]
        masks = dropout.lm_masks(
            jax.random.fold_in(key, step), x, model.vocab_size, m, n, cfg.rates
        )
        new_epoch = window == 0
        carry = jax.tree.map(lambda c: jnp.where(new_epoch, jnp.zeros_like(c), c), state["carry"])
        grads, (nll, carry) = jax.grad(loss_fn, has_aux=True)(state["params"], carry, x, y, masks)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        state = dict(
            state,
            step=step + 1,
            params=optax.apply_updates(state["params"], updates),
            opt_state=opt_state,
            carry=carry,
            epoch_nll=jnp.where(new_epoch, 0.0, state["epoch_nll"]) + nll,
        )
        return state, nll

    out = None if state_sharding is None else (state_sharding, None)
    return jax.jit(train_step, donate_argnums=0, out_shardings=out)


def data_mesh(devices=None) -> jax.sharding.Mesh:
    """A 1-D ``Mesh(("data",))`` over ``devices`` (default: every device of every host)."""
    return jax.sharding.Mesh(np.asarray(devices or jax.devices()), ("data",))


def shard_state(state: State, mesh: jax.sharding.Mesh) -> tuple[State, Any]:
    """Places the state for data parallelism: the truncated-BPTT carry is sharded
    by batch rows like the data, everything else is replicated.

    Returns ``(state, shardings)``. Works across hosts: each process supplies its
    addressable shards from its own (identical) host copy.
    """
    rows_sharding = NamedSharding(mesh, P("data"))
    shardings = {k: jax.tree.map(lambda _: NamedSharding(mesh, P()), v) for k, v in state.items()}
    shardings["carry"] = jax.tree.map(lambda _: rows_sharding, state["carry"])
    return jax.tree.map(put, state, shardings), shardings


def put(x: Any, sharding: NamedSharding) -> Array:
    """``x`` (host or device array) as a global array with ``sharding``, multi-host safe."""
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def eval_windows(tokens: np.ndarray, batch_size: int, num_steps: int):
    """Cuts ``tokens [N]`` into evaluation windows covering every prediction.

    Returns ``(x, y, w)``, each ``[W, B, num_steps]``: inputs, targets and 0/1
    weights (the last window is zero-padded); B rows of the batchified stream,
    so B = 1 evaluates all N - 1 predictions as one sequence.
    """
    rows = data.batchify(tokens, batch_size)
    x, y = rows[:, :-1], rows[:, 1:]
    pad = -x.shape[1] % num_steps
    w = np.pad(np.ones_like(x, np.float32), ((0, 0), (0, pad)))
    x, y = (np.pad(a, ((0, 0), (0, pad))) for a in (x, y))
    split = lambda a: a.reshape(batch_size, -1, num_steps).transpose(1, 0, 2)
    return split(x), split(y), split(w)


def make_evaluate(model: LanguageModel):
    """Returns ``evaluate(params, tokens, batch_size, num_steps) -> (nll_sum, count)``.

    One jit-compiled scan over all windows, carrying the state across them; no
    dropout. Perplexity is ``exp(nll_sum / count)``; nats per symbol ``nll_sum / count``.
    """

    @jax.jit
    def scan_windows(params, x, y, w):
        def body(acc, xyw):
            carry, total = acc
            nll, carry = model.nll(params, carry, *xyw[:2], None, xyw[2])
            return (carry, total + nll), None

        (_, total), _ = jax.lax.scan(body, (model.initial_carry(x.shape[1]), 0.0), (x, y, w))
        return total

    def evaluate(params, tokens, batch_size, num_steps):
        x, y, w = eval_windows(tokens, batch_size, num_steps)
        return float(scan_windows(params, x, y, w)), float(w.sum())

    return evaluate


def perplexity(nll_sum: float, count: float) -> float:
    return math.exp(nll_sum / count) if nll_sum / count < 700 else math.inf


def _check_finite(state: State, what: str, last_saved: int | None) -> float:
    value = float(state["epoch_nll"])
    if not math.isfinite(value):
        saved = (
            f"the last good checkpoint (step {last_saved}) is intact"
            if last_saved
            else "no checkpoint was written"
        )
        raise TrainingDiverged(f"non-finite training loss {what}; {saved}; try a lower --lr")
    return value


class _Checkpoints:
    """orbax managers for the latest state (resume) and the best-validation params."""

    def __init__(self, workdir: pathlib.Path):
        opts = lambda keep: ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self.latest = ocp.CheckpointManager(workdir / "checkpoints", options=opts(2))
        self.best = ocp.CheckpointManager(workdir / "best", options=opts(1))

    def save(self, state: State) -> int:
        step = int(state["step"])
        if step not in self.latest.all_steps():
            self.latest.save(step, args=ocp.args.StandardSave(state))
        return step

    def restore_latest(self, like: State) -> State | None:
        step = self.latest.latest_step()
        if step is None:
            return None
        return self.latest.restore(step, args=ocp.args.StandardRestore(like))

    def save_best(self, params: Any, step: int) -> None:
        self.best.save(step, args=ocp.args.StandardSave(params), force=True)

    def restore_best(self, like: Any) -> Any | None:
        step = self.best.latest_step()
        return (
            None if step is None else self.best.restore(step, args=ocp.args.StandardRestore(like))
        )

    def close(self):
        self.latest.wait_until_finished()
        self.best.wait_until_finished()
        self.latest.close()
        self.best.close()


def check_workdir(workdir: pathlib.Path, run_config: dict[str, Any]) -> None:
    """Writes ``config.json``, or checks a resumed run's config against it.

    Raises:
      ValueError: if the workdir holds a run whose settings differ in anything but
        the run-length/report keys of ``RESUMABLE_KEYS``.
    """
    path = workdir / "config.json"
    if path.exists():
        old = json.loads(path.read_text())
        keys = (set(old) | set(run_config)) - RESUMABLE_KEYS
        diff = sorted(k for k in keys if old.get(k) != run_config.get(k))
        if diff:
            shown = ", ".join(
                f"{k}={old.get(k)!r} there vs {run_config.get(k)!r}" for k in diff[:4]
            )
            raise ValueError(
                f"workdir {workdir} holds an incompatible run ({shown}); "
                "use another --workdir or the same settings"
            )
    else:
        workdir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(run_config, indent=1, sort_keys=True))


def train(
    model: LanguageModel,
    corpus: data.Corpus,
    cfg: TrainConfig,
    workdir: str | os.PathLike,
    run_config: dict[str, Any] | None = None,
    metric_name: str = "ppl",
    devices: list | None = None,
) -> dict[str, Any]:
    """Trains ``model`` on ``corpus`` and evaluates the best-validation params.

    Args:
      model: the language model.
      corpus: token id streams (``train``, ``valid``, ``test``).
      cfg: optimisation settings.
      workdir: run directory: ``config.json``, ``metrics.jsonl`` (one line per
        epoch), ``checkpoints/`` (latest, for resuming), ``best/`` (best valid),
        ``results.json``. Rerunning with the same workdir resumes exactly.
      run_config: every setting of the run, checked on resume (``check_workdir``).
      metric_name: ``'ppl'`` (perplexity) or ``'bpc'`` (bits per character).
      devices: devices for data-parallel training (default: all); batch rows are
        sharded over a ``Mesh(("data",))``, parameters replicated.

    Returns:
      The final results dict (also written to ``results.json``).

    Raises:
      ValueError: bad settings for this corpus, or an incompatible workdir.
      TrainingDiverged: if the loss becomes non-finite.
    """
    workdir = pathlib.Path(workdir)
    mesh = data_mesh(devices)
    if cfg.batch_size % mesh.size:
        raise ValueError(f"batch_size {cfg.batch_size} is not divisible by the {mesh.size} devices")
    rows_np = data.batchify(corpus.train, cfg.batch_size)
    steps_per_epoch = data.num_windows(rows_np.shape[1], cfg.num_steps)
    data.batchify(corpus.valid, cfg.batch_size)  # fail early if valid is too short
    check_workdir(workdir, run_config or {})

    tx = make_optimizer(cfg, steps_per_epoch)
    init_key, run_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    state, shardings = shard_state(init_state(model, cfg, tx, init_key), mesh)
    ckpt = _Checkpoints(workdir)
    restored = ckpt.restore_latest(state)
    if restored is not None:
        state = restored
        logging.info("resumed %s at step %d", workdir, int(state["step"]))
    n_params = sum(p.size for p in jax.tree.leaves(state["params"]))
    logging.info("%d parameters, %d steps per epoch", n_params, steps_per_epoch)

    train_step = make_train_step(model, cfg, tx, steps_per_epoch, shardings)
    evaluate = make_evaluate(model)
    rows = put(rows_np, NamedSharding(mesh, P("data", None)))
    to_metric = (
        (lambda nll, cnt: perplexity(nll, cnt))
        if metric_name == "ppl"
        else (lambda nll, cnt: nll / cnt / math.log(2))
    )

    stop = {"signal": None}

    def on_sigterm(signum, frame):
        stop["signal"] = signum

    old_handler = signal.signal(signal.SIGTERM, on_sigterm)

    max_epochs = min(cfg.max_epochs or cfg.max_max_epoch, cfg.max_max_epoch)
    total_steps = max_epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    step = int(state["step"])
    last_saved = step if restored is not None else None
    t_start = time.time()
    try:
        while step < total_steps and stop["signal"] is None:
            epoch, window = divmod(step, steps_per_epoch)
            lr = float(cfg.schedule(steps_per_epoch)(step))
            t_epoch, first_step = time.time(), step
            end = min((epoch + 1) * steps_per_epoch, total_steps)
            bar = tqdm(
                total=steps_per_epoch,
                initial=window,
                desc=f"epoch {epoch + 1}",
                disable=not cfg.progress,
                leave=False,
            )
            while step < end and stop["signal"] is None:
                state, _ = train_step(state, rows, run_key)
                step += 1
                bar.update(1)
                if step % cfg.log_every == 0 or step == end:
                    nll = _check_finite(state, f"at step {step}", last_saved)
                    done = step - epoch * steps_per_epoch
                    bar.set_postfix(loss=f"{nll / (done * cfg.batch_size * cfg.num_steps):.3f}")
                    logging.info(
                        "step %d: train loss %.4f nats/token",
                        step,
                        nll / (done * cfg.batch_size * cfg.num_steps),
                    )
                if cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0:
                    _check_finite(state, f"at step {step}", last_saved)
                    last_saved = ckpt.save(state)
            bar.close()
            if stop["signal"] is not None:
                break
            done = step - epoch * steps_per_epoch
            train_nll = _check_finite(state, f"in epoch {epoch + 1}", last_saved)
            train_s = time.time() - t_epoch  # training only (compilation included in epoch 1)
            valid = to_metric(
                *evaluate(state["params"], corpus.valid, cfg.batch_size, cfg.num_steps)
            )
            record = {
                "epoch": epoch + 1,
                "step": step,
                "lr": lr,
                f"train_{metric_name}": to_metric(train_nll, done * cfg.batch_size * cfg.num_steps),
                f"valid_{metric_name}": valid,
                "tokens_per_s": (step - first_step) * cfg.batch_size * cfg.num_steps / train_s,
                "elapsed_s": time.time() - t_start,
                "epoch_complete": done == steps_per_epoch,
            }
            print(
                f"epoch {epoch + 1:3d} | step {step:7d} | lr {lr:.4f} | "
                f"train {metric_name} {record[f'train_{metric_name}']:9.3f} | "
                f"valid {metric_name} {valid:9.3f} | {record['tokens_per_s']:8.0f} tok/s | "
                f"{record['elapsed_s']:7.1f} s",
                flush=True,
            )
            with open(workdir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
            if valid < float(state["best_valid"]):
                state["best_valid"] = put(np.float32(valid), shardings["best_valid"])
                ckpt.save_best(state["params"], step)
            last_saved = ckpt.save(state)
        if stop["signal"] is not None:
            last_saved = ckpt.save(state)
            print(
                f"stopped by signal {stop['signal']} at step {step}; checkpoint saved, "
                f"rerun with the same --workdir to resume",
                flush=True,
            )
            raise SystemExit(128 + stop["signal"])

        best = ckpt.restore_best(state["params"])
        best = state["params"] if best is None else best
        results = {
            "step": step,
            "best_batched_valid": float(state["best_valid"]),
            "parameters": int(n_params),
            "eval_batch_size": cfg.eval_batch_size,
        }
        for split in ("valid", "test"):
            t0 = time.time()
            nll, cnt = evaluate(
                best, getattr(corpus, split), cfg.eval_batch_size, cfg.eval_num_steps
            )
            results[f"{split}_{metric_name}"] = to_metric(nll, cnt)
            results[f"{split}_eval_s"] = time.time() - t0
        print(
            f"final (best checkpoint, eval batch {cfg.eval_batch_size}): "
            f"valid {metric_name} {results[f'valid_{metric_name}']:.3f} | "
            f"test {metric_name} {results[f'test_{metric_name}']:.3f}",
            flush=True,
        )
        (workdir / "results.json").write_text(json.dumps(results, indent=1))
        return results
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        ckpt.close()
