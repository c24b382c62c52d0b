"""Language modelling with truncated BPTT, as a task of the run engine.

The protocol of the reference RHN code (Zilly et al. 2017, ``rhn_train.py``):

* the training stream is cut into B rows and windows of ``num_steps`` tokens; the
  final carry of a window feeds the next one and is zeroed at each epoch start;
* loss = summed cross-entropy over the window / B, plus ``weight_decay`` times
  half the squared L2 norm of every parameter; global-norm clipping; plain SGD
  with lr = lr0 / lr_decay ** max(epoch - max_epoch + 1, 0) (epochs from 0);
* validation perplexity (batched, no dropout) after every epoch; the best one is
  kept, and the final validation and test perplexity are recomputed from it,
  with batch size 1 over the whole sequence (the reference protocol) for a full
  run, batched for a run cut short by ``--max_steps`` / ``--max_epochs``.

The training rows live on the device; the step slices its window, draws its
dropout masks from the engine's per-step key and carries the truncated-BPTT state
in the training state, so the engine's checkpoints resume it exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import data, dropout
from rhnzoo.models.lm import LanguageModel
from rhnzoo.training import engine, sharding

Array = jax.Array
State = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation and evaluation settings (defaults: reference ``ptb_sota``).

    Attributes:
      lr: initial SGD learning rate lr0 (for a loss summed over time / B).
      lr_decay: divisor applied to the learning rate every epoch after ``max_epoch``.
      max_epoch: epochs at constant learning rate.
      max_max_epoch: total number of epochs of the schedule.
      weight_decay: L2 coefficient on 0.5 * sum(p ** 2) over all parameters.
      max_grad_norm: global-norm clipping threshold.
      batch_size: B, rows of the training stream.
      num_steps: truncated-BPTT window length T.
      rates: dropout probabilities.
      eval_batch_size: batch size of the final evaluation; None: 1 (the reference
        protocol) for a full run, ``batch_size`` for a run cut short.
      eval_num_steps: window length of evaluation scans (any value gives the same
        numbers up to float rounding; longer is faster).

    Raises:
      ValueError: for a setting outside its range (one line naming it).
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
    eval_batch_size: int | None = None
    eval_num_steps: int = 100

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not self.lr_decay >= 1:
            raise ValueError(f"lr_decay must be >= 1, got {self.lr_decay}")
        for name in ("batch_size", "num_steps", "max_max_epoch", "eval_num_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_batch_size is not None and self.eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
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
    """The task's training state: params, optimizer state and the truncated-BPTT carry."""
    params = model.init(key)
    return {"params": params, "opt_state": tx.init(params),
            "carry": model.initial_carry(cfg.batch_size)}  # fmt: skip


def make_train_step(model: LanguageModel, cfg: TrainConfig, tx: optax.GradientTransformation):
    """Returns the pure ``train_step(state, (rows, window), key) -> (state, sums)``.

    ``rows [B, N] int32`` is the batchified training stream (on the device); the
    step trains on window ``window`` (0-based; the carry is zeroed at window 0)
    with dropout masks drawn from ``key``. ``sums = {'loss': summed cross-entropy
    of the window (nats, before weight decay), 'count': B T}``. The engine
    jit-compiles it with the state donated; to call it yourself, wrap it in
    ``jax.jit(..., donate_argnums=0)``.
    """
    T, B = cfg.num_steps, cfg.batch_size

    def loss_fn(params, carry, x, y, masks):
        nll, carry = model.nll(params, carry, x, y, masks)
        return nll / B + cfg.weight_decay * l2_penalty(params), (nll, carry)

    def train_step(state: State, batch, key: Array) -> tuple[State, dict[str, Array]]:
        rows, window = batch
        xy = jax.lax.dynamic_slice_in_dim(rows, window * T, T + 1, axis=1)
        x, y = xy[:, :-1], xy[:, 1:]
        masks = model.dropout_masks(key, x, cfg.rates)
        carry = jax.tree.map(lambda c: jnp.where(window == 0, jnp.zeros_like(c), c), state["carry"])
        grads, (nll, carry) = jax.grad(loss_fn, has_aux=True)(state["params"], carry, x, y, masks)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        state = {"params": optax.apply_updates(state["params"], updates),
                 "opt_state": opt_state, "carry": carry}  # fmt: skip
        return state, {"loss": nll, "count": jnp.float32(B * T)}

    return train_step


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


def eval_time_chunk(num_steps: int, batch_size: int, vocab_size: int,
                    max_logits: int = 1 << 21) -> int:  # fmt: skip
    """The largest divisor c of ``num_steps`` with ``c * batch_size * vocab_size <=
    max_logits`` (at least 1): the ``time_chunk`` of :meth:`LanguageModel.nll` that keeps
    an evaluation window's logits at most ``max_logits`` floats (8 MB by default).

    Why: a window's whole ``[T, B, V]`` logits (80 MB at T 100, B 20 and PTB's 10,000
    words) made ``ptb.py`` on CPU spend most of its evaluation in the kernel, paging in
    fresh memory on every call: a 10-step ``--preset=small`` run with ``--eval_batch_size=20``
    took 37 s (17 s system time) with whole windows, 32 s (2 s) in 8 MB chunks (BUILD_NOTES).
    """
    steps = max(1, max_logits // (batch_size * vocab_size))
    return max(c for c in range(1, min(steps, num_steps) + 1) if num_steps % c == 0)


def make_evaluate(model: LanguageModel, mesh: jax.sharding.Mesh | None = None):
    """Returns ``evaluate(params, tokens, batch_size, num_steps, track=None) -> (nll_sum, count)``.

    One jit-compiled call per window of ``num_steps`` (the state carried across
    windows, at most two in flight), so a long evaluation shows progress and stops
    promptly on a signal when given the engine's ``track``; no dropout.
    Perplexity is ``exp(nll_sum / count)``; nats per symbol ``nll_sum / count``.

    With a ``mesh`` (the params' devices, possibly spread over processes) the
    windows' rows are sharded over its ``"data"`` axis, zero-weight rows appended when
    the devices do not divide ``batch_size`` (the batch-1 protocol on 8 devices runs
    as 8 rows, one per device, 7 of them weighing nothing); every process passes the
    same tokens.
    """

    @jax.jit
    def window(params, carry, total, x, y, w):
        chunk = eval_time_chunk(x.shape[1], x.shape[0], model.vocab_size)
        nll, carry = model.nll(params, carry, x, y, None, w, time_chunk=chunk)
        return carry, total + nll

    def evaluate(params, tokens, batch_size, num_steps, track=None):
        x, y, w = eval_windows(tokens, batch_size, num_steps)
        carry, total = model.initial_carry(batch_size), np.zeros((), np.float32)
        rows = lambda a: a
        if mesh is not None:
            rows = lambda a: sharding.put_rows(a, mesh, pad=True)
            carry, total = rows(carry), sharding.put(total, sharding.replicated(mesh))
        indices = range(len(x)) if track is None else track(range(len(x)), total=len(x))
        for i in indices:
            previous = total
            carry, total = window(params, carry, total, *rows((x[i], y[i], w[i])))
            jax.block_until_ready(previous)
        return float(total), float(w.sum())

    return evaluate


def perplexity(nll_sum: float, count: float) -> float:
    return math.exp(nll_sum / count) if nll_sum / count < 700 else math.inf


METRICS = {
    # name -> nats per symbol to the metric
    "ppl": lambda nats: math.exp(nats) if nats < 700 else math.inf,
    "bpc": lambda nats: nats / math.log(2),
}


def make_task(
    model: LanguageModel,
    corpus: data.Corpus,
    cfg: TrainConfig,
    run: engine.RunConfig,
    metric_name: str = "ppl",
    devices: list | None = None,
) -> engine.Task:
    """The language-modelling task of ``model`` on ``corpus`` for the run engine.

    Raises:
      ValueError: bad settings for this corpus (batch too large, windows too long,
        batch not divisible by the devices) or an unknown ``metric_name``.
    """
    if metric_name not in METRICS:
        raise ValueError(f"metric_name must be one of {list(METRICS)}, got {metric_name!r}")
    to_metric = METRICS[metric_name]
    if run.epochs != cfg.max_max_epoch:
        raise ValueError(f"run.epochs={run.epochs} differs from max_max_epoch={cfg.max_max_epoch}")
    mesh = sharding.data_mesh(devices)
    sharding.check_divisible(cfg.batch_size, mesh)
    rows_np = data.batchify(corpus.train, cfg.batch_size)
    spe = data.num_windows(rows_np.shape[1], cfg.num_steps)
    data.batchify(corpus.valid, cfg.batch_size)  # fail early if valid is too short
    tx = make_optimizer(cfg, spe)
    rows = sharding.put(rows_np, sharding.by_rows(mesh))
    evaluate = make_evaluate(model, mesh)
    cut = run.cut_short(spe)
    eval_batch = cfg.eval_batch_size or (cfg.batch_size if cut else 1)
    protocol = "reference batch-1" if eval_batch == 1 else "batched"

    def init(key):
        state = init_state(model, cfg, tx, key)
        placed = sharding.put_tree(state, sharding.replicated(mesh))
        placed["carry"] = sharding.put_tree(state["carry"], sharding.by_rows(mesh))
        return placed

    def result(nll, count, split):
        return {f"{split}_{metric_name}": to_metric(nll / count), f"{split}_loss": nll / count}

    def validate(params, track):
        nll, count = evaluate(params, corpus.valid, cfg.batch_size, cfg.num_steps, track)
        return result(nll, count, "valid")

    def final_evaluate(params, track):
        out = {"eval_batch_size": eval_batch, "eval_protocol": protocol}
        for split in ("valid", "test"):
            t0 = time.perf_counter()
            split_track = functools.partial(track, desc=f"final {split} (batch {eval_batch})")
            nll, count = evaluate(params, getattr(corpus, split), eval_batch,
                                  cfg.eval_num_steps, split_track)  # fmt: skip
            out[f"{split}_{metric_name}"] = to_metric(nll / count)
            out[f"{split}_eval_s"] = time.perf_counter() - t0
        return out

    return engine.Task(
        init_state=init,
        train_step=make_train_step(model, cfg, tx),
        get_batch=lambda epoch, index: (rows, np.int32(index)),
        steps_per_epoch=spe,
        validate=validate,
        final_evaluate=final_evaluate,
        select=f"valid_{metric_name}",
        train_metrics=lambda s: {f"train_{metric_name}": to_metric(s["loss"] / max(s["count"], 1))},
        chance_loss=math.log(model.vocab_size),
        unit="tok",
        learning_rate=lambda step: float(cfg.schedule(spe)(step)),
        final_label=f"eval batch {eval_batch}"
        + (", batched because the run was cut short" if cut and cfg.eval_batch_size is None else ""),
    )


def train(
    model: LanguageModel,
    corpus: data.Corpus,
    cfg: TrainConfig,
    workdir: str | os.PathLike | None,
    run: engine.RunConfig | None = None,
    run_config: dict[str, Any] | None = None,
    metric_name: str = "ppl",
    devices: list | None = None,
    log=print,
) -> dict[str, Any]:
    """Trains ``model`` on ``corpus`` on the run engine and evaluates the best params.

    Args:
      model: the language model.
      corpus: token id streams (``train``, ``valid``, ``test``).
      cfg: optimisation and evaluation settings.
      workdir: run directory (see :func:`rhnzoo.training.engine.run`); rerunning
        with the same workdir resumes exactly.
      run: run length and reporting (default: the whole ``cfg.max_max_epoch`` schedule).
      run_config: every setting of the run, checked on resume.
      metric_name: ``'ppl'`` (perplexity) or ``'bpc'`` (bits per character).
      devices: devices for data-parallel training (default: all); batch rows are
        sharded over a ``Mesh(("data",))``, parameters replicated.

    Returns:
      The final results dict (also written to ``results.json``).

    Raises:
      ValueError: bad settings for this corpus, or an incompatible workdir.
      engine.TrainingDiverged: the loss became non-finite or exploded.
      engine.Interrupted: a signal arrived (the state was saved).
    """
    run = run or engine.RunConfig(epochs=cfg.max_max_epoch)
    task = make_task(model, corpus, cfg, run, metric_name, devices)
    return engine.run(task, run, workdir, run_config, log=log).results


# ------------------------------------------------------------ the experiments' body

_RUN_KEYS = ("seed", "max_steps", "max_epochs", "checkpoint_every_steps", "log_every", "progress",
             "tensorboard", "divergence_factor", "patience", "matmul_precision")  # fmt: skip
_CELL_KEYS = ("depth", "coupled", "init_bias")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A language-model run from its settings: ``experiments/ptb.py`` / ``char.py``'s
    flags as one dict (the run's ``config.json``). :func:`experiment` checks them before
    any data is read; :meth:`train` runs it on a corpus.

    Config keys: ``dataset`` (a registered LM data set), ``cell`` (default ``'rhn'``),
    ``hsg``, ``hidden_size``, ``depth``, ``coupled``, ``init_bias`` (those the cell
    takes), ``init_scale``, ``hsg_init_bias``, ``tied``, ``unroll``, ``scan_impl``
    (``'auto'``: fused for a coupled RHN), ``remat``, ``dtype``, the optimisation
    settings of :class:`TrainConfig` and ``drop_{x,i,h,o}``, the engine's run settings,
    ``workdir`` (None: ``runs/<dataset>_<preset>[_<cell>][_d<depth>]_n<size>[_hsg]``).
    """

    config: dict[str, Any]
    cfg: TrainConfig
    run: engine.RunConfig
    metric: str
    workdir: str

    def model(self, vocab_size: int) -> LanguageModel:
        from rhnzoo import cells
        from rhnzoo.models import lm

        c = self.config
        cell = c.get("cell", "rhn")
        scan_impl = c.get("scan_impl", "auto")
        if scan_impl == "auto":
            scan_impl = "fused" if cell == "rhn" and c.get("coupled", True) else "reference"
        return lm.language_model(
            cell, vocab_size, c["hidden_size"], hsg=c.get("hsg", False), tied=c["tied"],
            init_scale=c["init_scale"], hsg_init_bias=c.get("hsg_init_bias", -2.5),
            unroll=c.get("unroll", 1), scan_impl=scan_impl, remat=c.get("remat", False),
            dtype=c.get("dtype", "float32"),
            **cells.applicable(cell, {k: c[k] for k in _CELL_KEYS if k in c}),
        )  # fmt: skip

    def train(self, corpus: data.Corpus, *, devices: list | None = None, log=print) -> dict:
        return train(self.model(corpus.vocab_size), corpus, self.cfg, self.workdir, self.run,
                     run_config=self.config, metric_name=self.metric, devices=devices, log=log)  # fmt: skip


def experiment(config: dict[str, Any]) -> Experiment:
    """The :class:`Experiment` of ``config``, every setting checked (one-line ValueError)."""
    from rhnzoo import cells

    c = config
    d = data.registry.get(c["dataset"], task="lm")
    rates = dropout.Rates(c["drop_x"], c["drop_i"], c["drop_h"], c["drop_o"])
    cfg = TrainConfig(
        lr=c["lr"], lr_decay=c["lr_decay"], max_epoch=c["max_epoch"],
        max_max_epoch=c["max_max_epoch"], weight_decay=c["weight_decay"],
        max_grad_norm=c["max_grad_norm"], batch_size=c["batch_size"], num_steps=c["num_steps"],
        rates=rates, eval_batch_size=c.get("eval_batch_size"),
        eval_num_steps=c.get("eval_num_steps", 100),
    )  # fmt: skip
    run = engine.RunConfig(epochs=c["max_max_epoch"], **{k: c[k] for k in _RUN_KEYS if k in c})
    cell = c.get("cell", "rhn")
    options = cells.applicable(cell, {k: c[k] for k in _CELL_KEYS if k in c})
    workdir = c.get("workdir") or (
        f"runs/{c['dataset']}_{c.get('preset') or 'default'}{'' if cell == 'rhn' else '_' + cell}"
        f"{'_d' + str(c['depth']) if 'depth' in options else ''}_n{c['hidden_size']}"
        f"{'_hsg' if c.get('hsg') else ''}"
    )
    exp = Experiment(dict(config), cfg, run, d.metric, workdir)
    exp.model(2)  # validates the model settings
    return exp
