r"""LSTM classifier train-step benchmark: rhnzoo's LSTM against Flax's.

  python -m rhnzoo.bench.rnn                          # every configuration
  python -m rhnzoo.bench.rnn --configs=imdb_cpu,pmnist --rounds=7

Both sides compute the same function, the forward and backward pass of a sequence
classifier: an LSTM over ``xs [T, B, m]`` float32 (time-major), its final h through a
linear softmax layer, mean cross-entropy, ``jax.value_and_grad`` under ``jax.jit``:

* rhnzoo: :class:`rhnzoo.cells.LSTM` through :func:`rhnzoo.cells.unroll` (input
  projection W x for all steps in one matmul before the scan; per step one fused
  ``[B, n] x [n, 4n]`` matmul, the bias and the gates);
* rhnzoo, projecting per step: the same cell in a plain ``lax.scan`` whose body calls
  ``cell.project_inputs`` on x_t (the protocol allows it: ``project_inputs`` takes any
  leading axes). It never materialises the ``[T, B, 4n]`` projection and its gradient,
  which on a CPU pays off when m is much smaller than 4n (P-MNIST: m = 1);
* Flax: ``nn.RNN(nn.OptimizedLSTMCell(n), time_major=True)`` (linen), which does its
  input matmul inside the scan, one step at a time.

Flax's parameters are set from rhnzoo's, and the two losses are checked to agree before
anything is timed. The steps are timed with :func:`rhnzoo.bench.alternate` (interleaved
rounds, min and median, matmul peak between rounds), and one JSON line per
configuration gives the times and the ratios flax / rhnzoo (> 1: rhnzoo is faster).
"""

from __future__ import annotations

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from rhnzoo import cells
from rhnzoo.bench import alternate

CONFIGS = {
    # Wang & Tian's IMDB shape (embedding 256 -> LSTM 512, reviews cut to 400 words),
    # the same with T = 100 (CPU-sized), and permuted pixel MNIST (1 -> 100, T = 784).
    "imdb": {"input": 256, "hidden": 512, "batch": 32, "steps": 400, "classes": 2},
    "imdb_cpu": {"input": 256, "hidden": 512, "batch": 32, "steps": 100, "classes": 2},
    "pmnist": {"input": 1, "hidden": 100, "batch": 100, "steps": 784, "classes": 10},
}  # fmt: skip

flags.DEFINE_list("configs", list(CONFIGS), "Configurations to run.")
flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds.")
flags.DEFINE_integer("repeats", 1, "Timings per candidate per round.")
FLAGS = flags.FLAGS


class FlaxLSTMClassifier(nn.Module):
    """Flax's LSTM (``nn.RNN(nn.OptimizedLSTMCell)``) -> final h -> ``nn.Dense``."""

    hidden: int
    classes: int

    @nn.compact
    def __call__(self, xs):  # [T, B, m] -> logits [B, classes]
        (_, h), _ = nn.RNN(nn.OptimizedLSTMCell(self.hidden), time_major=True, return_carry=True)(
            xs
        )
        return nn.Dense(self.classes)(h)


def rhnzoo_logits(cell: cells.LSTM, params, xs):
    """rhnzoo's LSTM over ``xs [T, B, m]`` -> final h -> linear layer ``[B, classes]``."""
    (h, _), _ = cells.unroll(cell, params["cell"], cell.initial_carry(xs.shape[1]), xs)
    return h @ params["out"]["kernel"] + params["out"]["bias"]


def rhnzoo_logits_per_step(cell: cells.LSTM, params, xs):
    """As :func:`rhnzoo_logits`, with the input projection done inside the scan."""
    p = params["cell"]

    def step(carry, x_t):
        return cell.step(p, carry, cell.project_inputs(p, x_t))

    (h, _), _ = jax.lax.scan(step, cell.initial_carry(xs.shape[1]), xs)
    return h @ params["out"]["kernel"] + params["out"]["bias"]


def flax_params(params, n: int):
    """rhnzoo LSTM + output params -> the same function as FlaxLSTMClassifier params.

    rhnzoo's blocks are i | f | o | c̃ (c̃ is Flax's g); Flax keeps the bias on the
    recurrent kernels ``h*`` and none on the input kernels ``i*``.
    """
    p = params["cell"]
    cols = {g: slice(k * n, (k + 1) * n) for k, g in enumerate("ifog")}
    cell = {}
    for g, s in cols.items():
        cell[f"i{g}"] = {"kernel": p["W"][:, s]}
        cell[f"h{g}"] = {"kernel": p["U"][:, s], "bias": p["b"][s]}
    return {"params": {"OptimizedLSTMCell_0": cell, "Dense_0": dict(params["out"])}}


def bench(name: str, c: dict, *, rounds: int, repeats: int) -> dict:
    """Times rhnzoo's and Flax's train step (value and grad) on configuration ``c``."""
    m, n, B, T, C = c["input"], c["hidden"], c["batch"], c["steps"], c["classes"]
    cell = cells.LSTM(n)
    k_cell, k_out, k_x, k_y = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "cell": cell.init(k_cell, m),
        "out": {"kernel": 0.1 * jax.random.normal(k_out, (n, C)), "bias": jnp.zeros((C,))},
    }
    xs = jax.random.normal(k_x, (T, B, m), jnp.float32)
    labels = jax.random.randint(k_y, (B,), 0, C)
    xent = optax.softmax_cross_entropy_with_integer_labels
    model = FlaxLSTMClassifier(n, C)

    def rhnzoo_loss(params, xs, labels):
        return xent(rhnzoo_logits(cell, params, xs), labels).mean()

    def per_step_loss(params, xs, labels):
        return xent(rhnzoo_logits_per_step(cell, params, xs), labels).mean()

    def flax_loss(variables, xs, labels):
        return xent(model.apply(variables, xs), labels).mean()

    variables = flax_params(params, n)
    steps = {
        "rhnzoo": (jax.jit(jax.value_and_grad(rhnzoo_loss)), params),
        "rhnzoo_per_step": (jax.jit(jax.value_and_grad(per_step_loss)), params),
        "flax": (jax.jit(jax.value_and_grad(flax_loss)), variables),
    }
    losses = {k: float(f(p, xs, labels)[0]) for k, (f, p) in steps.items()}
    if not np.allclose(list(losses.values()), losses["rhnzoo"], rtol=1e-4):
        raise AssertionError(f"{name}: the losses differ: {losses}")

    timed = alternate(
        {k: functools.partial(f, p, xs, labels) for k, (f, p) in steps.items()},
        rounds=rounds,
        repeats=repeats,
    )
    s = {k: {"min": v["min"], "median": v["median"]} for k, v in timed["seconds"].items()}
    ratio = lambda k: {q: s["flax"][q] / s[k][q] for q in ("min", "median")}
    return {
        "config": name, "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(), **c, "loss": losses["rhnzoo"], "seconds": s,
        "ratio_flax_over_rhnzoo": ratio("rhnzoo"),
        "ratio_flax_over_rhnzoo_per_step": ratio("rhnzoo_per_step"),
        "peak_flops_per_s": {k: timed["peak_flops_per_s"][k] for k in ("max", "min")},
        "rounds": rounds, "repeats": repeats,
    }  # fmt: skip


def main(argv):
    del argv
    unknown = set(FLAGS.configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"error: unknown configs {sorted(unknown)}; choose from {list(CONFIGS)}")
    for name in FLAGS.configs:
        result = bench(name, CONFIGS[name], rounds=FLAGS.rounds, repeats=FLAGS.repeats)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    app.run(main)
