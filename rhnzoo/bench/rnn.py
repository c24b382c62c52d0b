r"""Gated-cell classifier train-step benchmarks: rhnzoo's fused scan against Flax and
against its own reference path.

  python -m rhnzoo.bench.rnn                                   # every cell and shape
  python -m rhnzoo.bench.rnn --cells=lstm --configs=imdb_cpu,pmnist --rounds=7
  python -m rhnzoo.bench.rnn --cells=lstm --bfloat16           # adds rhnzoo in bfloat16

Every candidate computes the forward and backward pass of a sequence classifier: a
recurrent layer over ``xs [T, B, m]`` float32 (time-major), its last output through a
linear softmax layer, mean cross-entropy, ``jax.value_and_grad`` under ``jax.jit``:

* **rhnzoo**: :func:`rhnzoo.cells.gated_fused.unroll` (the classifier's default, the
  hand-written backward pass), as the classifier calls it: with ``lengths`` (here all
  T), the output read from the final carry, ``gated_fused.unroll``'s defaults (the
  input projected inside the scan, the weight gradients formed per chunk of up to 16
  steps);
  **rhnzoo_bf16** (``--bfloat16``) the same with bfloat16 matmul inputs;
* **reference**: :func:`rhnzoo.cells.unroll` (``lax.scan`` + autodiff, every step under
  ``save_matmuls_only``: the classifier's ``scan_impl='reference'``);
* **flax** (LSTM and GRU): ``nn.RNN(nn.OptimizedLSTMCell(n))`` with rhnzoo's LSTM
  weights copied in (the losses are checked to agree before anything is timed), and
  ``nn.RNN(nn.GRUCell(n))`` with its own initialisation: Flax's GRU applies the reset
  gate after its recurrent matmul (cuDNN's variant), ours before (Cho et al. 2014), the
  same FLOPs but not the same function, so the GRU losses are reported, not compared;
* **jax_cudnn** (LSTM, GPU only): ``jax.experimental.rnn.lstm``, cuDNN's LSTM called
  from JAX, with rhnzoo's weights packed into cuDNN's flat layout (:func:`cudnn_weights`,
  checked on any backend against ``jax.experimental.rnn.lstm_ref`` in the tests);
* **rhnzoo_u{k}** (``--unroll=k,...``): rhnzoo's fused scan with ``unroll=k`` time steps
  per scan iteration, forward and backward (the default is chosen per backend and cell:
  :func:`rhnzoo.cells.gated_fused.default_unroll`).

Cells: ``lstm``, ``gru``, ``sc_lstm`` (SC-LSTM-P, L = 20), ``rrn`` (K = 2, σ). The
steps are timed with :func:`rhnzoo.bench.alternate` (interleaved rounds, min and median,
matmul peak between rounds); one JSON line per (cell, shape) gives the times and the
ratios peer / rhnzoo (> 1: rhnzoo is faster) of the minima, of the medians, and the
median of the per-round ratios (``paired_median``: each round's pair ran back to back,
so it is the estimator least moved by load that drifts between rounds), the peer being
Flax for LSTM and GRU and the reference path for SC-LSTM and RRN.
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

from rhnzoo import cells, precision
from rhnzoo.apps import cli
from rhnzoo.bench import alternate, ratios
from rhnzoo.cells import gated_fused

from jax.experimental import rnn as jax_rnn

CONFIGS = {
    # Wang & Tian's IMDB shape (embedding 256 -> LSTM 512, reviews cut to 400 words),
    # the same with T = 100 (CPU-sized), and permuted pixel MNIST (1 -> 100, T = 784).
    "imdb": {"input": 256, "hidden": 512, "batch": 32, "steps": 400, "classes": 2},
    "imdb_cpu": {"input": 256, "hidden": 512, "batch": 32, "steps": 100, "classes": 2},
    "pmnist": {"input": 1, "hidden": 100, "batch": 100, "steps": 784, "classes": 10},
    "tiny": {"input": 3, "hidden": 8, "batch": 4, "steps": 6, "classes": 3},  # for tests
}  # fmt: skip
CELLS = {
    "lstm": lambda n: cells.LSTM(n),
    "gru": lambda n: cells.GRU(n),
    "sc_lstm": lambda n: cells.SCLSTM(n, skip=20, learn_alpha=True),
    "rrn": lambda n: cells.RRN(n, 2),
}

flags.DEFINE_list("configs", ["imdb_cpu", "pmnist"], f"Shapes, of {list(CONFIGS)}.")
flags.DEFINE_list("cells", list(CELLS), "Cells.")
flags.DEFINE_boolean("bfloat16", False, "Also time rhnzoo with bfloat16 matmul inputs.")
flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds.")
flags.DEFINE_integer("repeats", 1, "Timings per candidate per round.")
flags.DEFINE_list("unroll", [], "Also time rhnzoo's fused scan with these unroll=k (time steps "
                  "per scan iteration, forward and backward), e.g. 2,4,8.")
cli.define_precision_flag()
flags.adopt_module_key_flags(cli)
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


class FlaxGRUClassifier(nn.Module):
    """Flax's GRU (``nn.RNN(nn.GRUCell)``) -> final h -> ``nn.Dense``."""

    hidden: int
    classes: int

    @nn.compact
    def __call__(self, xs):
        h, _ = nn.RNN(nn.GRUCell(self.hidden), time_major=True, return_carry=True)(xs)
        return nn.Dense(self.classes)(h)


def rhnzoo_logits(cell, params, xs, *, scan_impl: str = "fused", dtype=None, unroll=None):
    """rhnzoo's cell over ``xs [T, B, m]`` -> last output -> linear layer ``[B, classes]``,
    as the classifier computes it (the reference scan projects inside the scan when m <= 8)."""
    T, B = xs.shape[:2]
    carry = cell.initial_carry(B)
    if scan_impl == "fused":  # the final carry holds the last output (every row has T steps)
        carry, _ = gated_fused.unroll(cell, params["cell"], carry, xs, lengths=jnp.full((B,), T),
                                      dtype=dtype, outputs=False, unroll=unroll)  # fmt: skip
        last = gated_fused.output_of(cell, carry)
    else:
        _, ys = cells.unroll(cell, params["cell"], carry, xs, project_per_step=xs.shape[-1] <= 8,
                             save_matmuls=True)  # fmt: skip
        last = ys[-1]
    return last @ params["out"]["kernel"] + params["out"]["bias"]


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


def cudnn_weights(params, m: int, n: int) -> jax.Array:
    """rhnzoo LSTM params -> the flat weight vector of ``jax.experimental.rnn.lstm``.

    cuDNN's layout for one layer, one direction: ``W_ih [4n, m]``, ``W_hh [4n, n]``,
    ``b_ih [4n]``, ``b_hh [4n]``, flattened in that order, gates i | f | g | o (g is
    rhnzoo's c̃); rhnzoo's blocks are i | f | o | c̃ with one bias (``b_hh`` is zero).

    Returns:
      ``[4n (m + n + 2)]`` float32.
    """
    p = params["cell"]
    order = [0, 1, 3, 2]  # cuDNN's i, f, g, o as rhnzoo's block indices
    blocks = lambda a: jnp.concatenate([a[..., k * n:(k + 1) * n] for k in order], -1)
    return jnp.concatenate([blocks(p["W"]).T.ravel(), blocks(p["U"]).T.ravel(), blocks(p["b"]),
                            jnp.zeros((4 * n,), p["b"].dtype)])  # fmt: skip


def cudnn_logits(m: int, n: int, params, xs):
    """cuDNN's LSTM (``jax.experimental.rnn.lstm``, GPU only) over ``xs [T, B, m]`` ->
    final h -> the linear layer; ``params = {"lstm": cudnn_weights(...), "out": ...}``;
    TensorFloat-32 allowed or not as the precision in effect says
    (:func:`rhnzoo.precision.cudnn_rnn`)."""
    B = xs.shape[1]
    zeros = jnp.zeros((1, B, n), xs.dtype)
    _, h, _ = jax_rnn.lstm(jnp.swapaxes(xs, 0, 1), zeros, zeros, params["lstm"],
                           jnp.full((B,), xs.shape[0], jnp.int32), input_size=m, hidden_size=n,
                           num_layers=1, dropout=0.0, bidirectional=False,
                           precision=precision.cudnn_rnn())  # fmt: skip
    return h[0] @ params["out"]["kernel"] + params["out"]["bias"]


def problem(cell_name: str, c: dict):
    """``(cell, params, xs [T, B, m], labels [B])`` of shape ``c``, from a fixed key:
    the cell's initialisation and a random ``[n, classes]`` output layer."""
    m, n, B, T, C = c["input"], c["hidden"], c["batch"], c["steps"], c["classes"]
    cell = CELLS[cell_name](n)
    k_cell, k_out, k_x, k_y = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {
        "cell": cell.init(k_cell, m),
        "out": {"kernel": 0.1 * jax.random.normal(k_out, (n, C)), "bias": jnp.zeros((C,))},
    }
    xs = jax.random.normal(k_x, (T, B, m), jnp.float32)
    return cell, params, xs, jax.random.randint(k_y, (B,), 0, C)


def loss_of(logits_fn):
    """``jit(value_and_grad)`` of the mean cross-entropy of ``logits_fn(params, xs)``,
    as ``f(params, xs, labels)``."""
    xent = optax.softmax_cross_entropy_with_integer_labels
    return jax.jit(jax.value_and_grad(lambda p, xs, y: xent(logits_fn(p, xs), y).mean()))


def bench(cell_name: str, name: str, c: dict, *, rounds: int, repeats: int,
          bfloat16: bool = False, unrolls=()) -> dict:  # fmt: skip
    """Times rhnzoo's train step (value and grad) against its peers on shape ``c``
    (``unrolls``: extra fused candidates ``rhnzoo_u{k}``)."""
    m, n, C = c["input"], c["hidden"], c["classes"]
    cell, params, xs, labels = problem(cell_name, c)
    steps = {
        "rhnzoo": (loss_of(functools.partial(rhnzoo_logits, cell)), params),
        "reference": (loss_of(functools.partial(rhnzoo_logits, cell, scan_impl="reference")),
                      params),  # fmt: skip
    }
    if bfloat16:
        steps["rhnzoo_bf16"] = (loss_of(functools.partial(rhnzoo_logits, cell,
                                                          dtype=jnp.bfloat16)), params)  # fmt: skip
    for k in unrolls:
        steps[f"rhnzoo_u{k}"] = (loss_of(functools.partial(rhnzoo_logits, cell, unroll=k)), params)
    peer = "reference"
    if cell_name == "lstm":
        model = FlaxLSTMClassifier(n, C)
        steps["flax"] = (loss_of(model.apply), flax_params(params, n))
        peer = "flax"
        if jax.default_backend() == "gpu":
            steps["jax_cudnn"] = (loss_of(functools.partial(cudnn_logits, m, n)),
                                  {"lstm": cudnn_weights(params, m, n), "out": params["out"]})
    elif cell_name == "gru":
        model = FlaxGRUClassifier(n, C)
        steps["flax"] = (loss_of(model.apply), model.init(jax.random.PRNGKey(1), xs))
        peer = "flax"
    losses = {k: float(f(p, xs, labels)[0]) for k, (f, p) in steps.items()}
    same = [k for k in losses if k not in ("rhnzoo_bf16", "jax_cudnn")
            and not (k == "flax" and cell_name == "gru")]  # fmt: skip
    near = [losses.get("jax_cudnn", losses["rhnzoo"])]  # cuDNN's own reduction order, and
    # with TensorFloat-32 its own rounding: 2.4 % off XLA's TF32 loss at the IMDB shape's
    # 400 steps on an H100, where XLA's paths agreed to 2e-6
    near_rtol = 1e-3 if precision.cudnn_rnn() == jax.lax.Precision.HIGHEST else 5e-2
    if not (np.allclose([losses[k] for k in same], losses["rhnzoo"], rtol=1e-4)
            and np.allclose(near, losses["rhnzoo"], rtol=near_rtol)):  # fmt: skip
        raise AssertionError(f"{cell_name} {name}: the losses differ: {losses}")

    timed = alternate(
        {k: functools.partial(f, p, xs, labels) for k, (f, p) in steps.items()},
        rounds=rounds,
        repeats=repeats,
        warmup=False,  # the loss check above compiled and ran every step once
    )
    s = {k: {"min": v["min"], "median": v["median"]} for k, v in timed["seconds"].items()}
    ratio = functools.partial(ratios, timed["seconds"])
    out = {
        "cell": cell_name, "config": name, "device": str(jax.devices()[0].device_kind),
        "backend": jax.default_backend(), "matmul_precision": precision.current(), **c,
        "losses": losses, "seconds": s, "peer": peer,
        f"ratio_{peer}_over_rhnzoo": ratio(peer, "rhnzoo"),
        "peak_flops_per_s": {k: timed["peak_flops_per_s"][k] for k in ("max", "min")},
        "rounds": rounds, "repeats": repeats,
    }  # fmt: skip
    if peer != "reference":
        out["ratio_reference_over_rhnzoo"] = ratio("reference", "rhnzoo")
    if bfloat16:
        out[f"ratio_{peer}_over_rhnzoo_bf16"] = ratio(peer, "rhnzoo_bf16")
    if "jax_cudnn" in steps:
        out["ratio_jax_cudnn_over_rhnzoo"] = ratio("jax_cudnn", "rhnzoo")
    for k in unrolls:
        out[f"ratio_rhnzoo_u{k}_over_rhnzoo"] = ratio(f"rhnzoo_u{k}", "rhnzoo")
    return out


def main(argv):
    del argv
    for what, chosen, known in (("configs", FLAGS.configs, CONFIGS), ("cells", FLAGS.cells, CELLS)):
        unknown = set(chosen) - set(known)
        if unknown:
            raise SystemExit(f"error: unknown {what} {sorted(unknown)}; choose from {list(known)}")
    try:
        unrolls = [int(k) for k in FLAGS.unroll]
    except ValueError:
        unrolls = [0]
    if any(k < 1 for k in unrolls):
        raise SystemExit(f"error: --unroll takes integers >= 1, got {','.join(FLAGS.unroll)}")
    for cell_name in FLAGS.cells:
        for name in FLAGS.configs:
            with precision.context(FLAGS.matmul_precision):
                result = bench(cell_name, name, CONFIGS[name], rounds=FLAGS.rounds,
                               repeats=FLAGS.repeats, bfloat16=FLAGS.bfloat16,
                               unrolls=unrolls)  # fmt: skip
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    app.run(main)
