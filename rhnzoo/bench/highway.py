r"""One MNIST epoch of a deep highway net: rhnzoo vs a straightforward Flax NNX net.

  python -m rhnzoo.bench.highway                      # depth 100, compile at 10 and 100
  python -m rhnzoo.bench.highway --depth=50 --rounds=5

Both train the same net and math (the fully connected highway net of Srivastava et
al.: tanh, width 50, Glorot-uniform weights, T bias -4, softmax cross-entropy, SGD
with momentum 0.9, batches of 128 gathered on the device from the uint8 training
split, pixel / 255):

* **rhnzoo**: :class:`rhnzoo.models.highway.FeedForwardNet` (layers stacked, the depth
  loop a ``lax.scan``, H and T in one matmul), the train step of
  :mod:`rhnzoo.tasks.highway` under ``jax.jit`` (state donated);
* **nnx**: what a Flax user would write: a Python loop over ``nnx.Linear`` layers (one
  for H, one for T), ``nnx.Optimizer``, an ``nnx.jit`` step; **nnx_cached**: the same
  step through ``nnx.cached_partial`` (no module-graph traversal per call), which
  separates Flax's per-call Python cost from the compiled program's speed;
* **nnx_scan**: what a competent Flax user writes for a deep stack: one block module,
  ``depth - 1`` copies made by ``nnx.vmap`` and applied by ``nnx.scan`` (compile time
  flat in depth); **nnx_scan_cached** through ``nnx.cached_partial``.

An epoch is the 390 steps of the 50,000-image training split (real MNIST when found,
else random images, said in the output), timed alternately (:func:`rhnzoo.bench.alternate`
over ``--rounds``, after a warm-up epoch). The JSON object holds each epoch's min and
median seconds, each peer's ratios to rhnzoo (minima, medians, paired median), and the
compile time at each of ``--compile_depths`` (first step minus the median step time),
with ``matmul_precision``. On a 2-core CPU at depth 100 the whole run takes about 8
minutes, most of it the NNX net (its compilation of 99 unrolled layers, and its epochs).
"""

from __future__ import annotations

import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import nnx

from rhnzoo import precision
from rhnzoo.apps import cli
from rhnzoo.bench import alternate, ratios
from rhnzoo.tasks import classify
from rhnzoo import evaluation
from rhnzoo.tasks import highway as hw
from rhnzoo.configs import highway as highway_configs

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The script's flags, defined only when run (the nets import beside other flags)."""
    flags.DEFINE_integer("depth", 100, "Depth of the timed epoch.")
    flags.DEFINE_list("compile_depths", ["10", "100"], "Depths whose compile time is measured.")
    flags.DEFINE_integer("rounds", 2, "Timed rounds (one epoch of each per round).")
    flags.DEFINE_integer("steps", None, "Steps per timed epoch (default: a full epoch, 390).")
    flags.DEFINE_list(
        "peers",
        ["nnx", "nnx_scan"],
        "Flax NNX peers: nnx (Python loop over layers), nnx_scan (nnx.vmap init + nnx.scan apply).",
    )
    cli.define_precision_flag()
    flags.adopt_module_key_flags(cli)


WIDTH, BATCH, LR, MOMENTUM, T_BIAS = 50, 128, 0.1, 0.9, -4.0


class _NNXNet(nnx.Module):
    """Input layer (tanh), ``depth - 1`` highway layers (the subclass's
    :meth:`highway_layers` and :meth:`highway`), linear output; Glorot-uniform weights
    created in that order from ``rngs``."""

    def __init__(
        self,
        depth: int,
        width: int,
        input_size: int,
        num_classes: int,
        transform_bias: float,
        *,
        rngs: nnx.Rngs,
    ):
        glorot = nnx.initializers.glorot_uniform()
        self.first = nnx.Linear(input_size, width, kernel_init=glorot, rngs=rngs)
        self.highway_layers(depth - 1, width, transform_bias, rngs)
        self.out = nnx.Linear(width, num_classes, kernel_init=glorot, rngs=rngs)

    def __call__(self, x):
        return self.out(self.highway(jnp.tanh(self.first(x))))


class NNXHighwayNet(_NNXNet):
    """The fully connected highway net written the plain Flax NNX way (Python loop)."""

    def highway_layers(self, n: int, width: int, transform_bias: float, rngs: nnx.Rngs):
        glorot = nnx.initializers.glorot_uniform()
        linear = lambda **kw: nnx.Linear(width, width, kernel_init=glorot, rngs=rngs, **kw)
        self.h = nnx.List([linear() for _ in range(n)])
        t_bias = nnx.initializers.constant(transform_bias)
        self.t = nnx.List([linear(bias_init=t_bias) for _ in range(n)])

    def highway(self, h):
        for H, T in zip(self.h, self.t):
            t = jax.nn.sigmoid(T(h))
            h = jnp.tanh(H(h)) * t + h * (1.0 - t)  # y = H T + x (1 - T)
        return h


class NNXHighwayBlock(nnx.Module):
    """One highway layer, y = H T + x (1 - T) (H and T one ``nnx.Linear`` each)."""

    def __init__(self, width: int, transform_bias: float, *, rngs: nnx.Rngs):
        glorot = nnx.initializers.glorot_uniform()
        self.h = nnx.Linear(width, width, kernel_init=glorot, rngs=rngs)
        self.t = nnx.Linear(
            width,
            width,
            kernel_init=glorot,
            rngs=rngs,
            bias_init=nnx.initializers.constant(transform_bias),
        )

    def __call__(self, x):
        t = jax.nn.sigmoid(self.t(x))
        return jnp.tanh(self.h(x)) * t + x * (1.0 - t)


class NNXScanHighwayNet(_NNXNet):
    """The same net the way the Flax guides write deep stacks: ``nnx.vmap`` creates the
    blocks (one RNG stream per layer), ``nnx.scan`` applies them."""

    def highway_layers(self, n: int, width: int, transform_bias: float, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=n)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def blocks(rngs):
            return NNXHighwayBlock(width, transform_bias, rngs=rngs)

        self.blocks = blocks(rngs)

    def highway(self, h):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def apply(h, block):
            return block(h)

        return apply(h, self.blocks)


def data() -> tuple[dict, str]:
    """The 50,000 / 10,000 split of real MNIST if found, else random uint8 images."""
    try:
        from rhnzoo.data import load_mnist

        d = load_mnist(download=False)
        return evaluation.split_data(
            d.train_images, d.train_labels, d.test_images, d.test_labels, 10000
        ), "MNIST"
    except Exception as e:  # noqa: BLE001 - any reason: fall back to random images
        rng = np.random.default_rng(0)
        x, y = rng.integers(0, 256, (60000, 28, 28), np.uint8), rng.integers(0, 10, 60000)
        return evaluation.split_data(x, y, x[:10000], y[:10000], 10000), f"random ({e})"


def batch_indices(splits, steps: int) -> list[np.ndarray]:
    """int32 ``[BATCH]`` indices of the first ``steps`` batches of epoch 0 (seed 0), the
    batches every net trains on."""
    n = len(splits["train"][0])
    return [classify.batch_indices(0, 0, i, n, BATCH).astype(np.int32) for i in range(steps)]


def rhnzoo_epoch(depth: int, splits, steps: int) -> dict:
    """``{'rhnzoo': epoch, 'one': step}``: zero-argument callables running ``steps`` (one)
    train steps of the rhnzoo net, returning the last loss sums."""
    cfg = highway_configs.HighwayConfig(
        depth=depth, width=WIDTH, transform_bias=T_BIAS, lr=LR, momentum=MOMENTUM, batch_size=BATCH
    )
    net, (tx, _) = cfg.net(), hw.make_optimizer(cfg, LR)
    step = jax.jit(hw.make_train_step(net, tx), donate_argnums=0)
    state = {"s": jax.jit(functools.partial(hw.init_state, net, tx))(jax.random.key(0))}
    images, labels = jnp.asarray(splits["train"][0]), jnp.asarray(splits["train"][1])
    batches = [(images, labels, jnp.asarray(idx)) for idx in batch_indices(splits, steps)]
    key = jax.random.key(1)

    def run(n):
        sums = None
        for batch in batches[:n]:
            state["s"], sums = step(state["s"], batch, key)
        return sums

    return {"rhnzoo": lambda: run(steps), "one": lambda: run(1)}


def nnx_epoch(depth: int, splits, steps: int, scan: bool = False) -> dict:
    """The same for the Flax NNX net: ``{'nnx': epoch, 'nnx_cached': epoch, 'one': step}``
    (``nnx_cached`` through ``nnx.cached_partial``; both train the same model). ``scan``:
    :class:`NNXScanHighwayNet`, keys ``nnx_scan`` and ``nnx_scan_cached``."""
    x_train, y_train = splits["train"]
    net = NNXScanHighwayNet if scan else NNXHighwayNet
    model = net(depth, WIDTH, 784, 10, T_BIAS, rngs=nnx.Rngs(0))
    schedule = optax.exponential_decay(LR, 100_000, 0.96, staircase=True)
    optimizer = nnx.Optimizer(model, optax.sgd(schedule, momentum=MOMENTUM), wrt=nnx.Param)
    images, labels = jnp.asarray(x_train), jnp.asarray(y_train)

    @nnx.jit
    def train_step(model, optimizer, images, labels, idx):
        x, y = evaluation.inputs(images[idx]), labels[idx]

        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    idx = batch_indices(splits, steps)
    cached = nnx.cached_partial(train_step, model, optimizer)

    def run(n, call):
        loss = None
        for i in idx[:n]:
            loss = call(i)
        return loss

    plain = lambda i: train_step(model, optimizer, images, labels, i)
    fast = lambda i: cached(images, labels, i)
    name = "nnx_scan" if scan else "nnx"
    return {
        name: lambda: run(steps, plain),
        f"{name}_cached": lambda: run(steps, fast),
        "one": lambda: run(1, plain),
    }


def compile_seconds(one) -> float:
    """Time of the first call of ``one`` (trace + compile + a step) minus the median of
    5 later calls."""
    t = time.perf_counter()
    jax.block_until_ready(one())
    first = time.perf_counter() - t
    later = []
    for _ in range(5):
        t = time.perf_counter()
        jax.block_until_ready(one())
        later.append(time.perf_counter() - t)
    return first - statistics.median(later)


def main(argv):
    del argv
    with precision.context(FLAGS.matmul_precision):
        bench(*data())


def bench(splits, source) -> None:
    """Compiles and times the epochs; prints the JSON record."""
    steps = FLAGS.steps or classify.steps_per_epoch(len(splits["train"][0]), BATCH)
    out = {
        "bench": "highway_mnist_epoch",
        "device": jax.devices()[0].device_kind,
        "backend": jax.default_backend(),
        "data": source,
        "depth": FLAGS.depth,
        "width": WIDTH,
        "batch": BATCH,
        "steps": steps,
        "matmul_precision": precision.current(),
    }
    depths = sorted({int(d) for d in FLAGS.compile_depths} | {FLAGS.depth})
    # Every net compiles once, on its first step (timed); the timed depth's are reused.
    makers = {
        "rhnzoo": rhnzoo_epoch,
        "nnx": nnx_epoch,
        "nnx_scan": lambda *a: nnx_epoch(*a, scan=True),
    }
    unknown = set(FLAGS.peers) - {"nnx", "nnx_scan"}
    if unknown:
        raise SystemExit(f"error: unknown peers {sorted(unknown)}; choose from nnx, nnx_scan")
    candidates, compile_s = {}, {name: {} for name in ["rhnzoo", *FLAGS.peers]}
    for name in compile_s:
        make = makers[name]
        for depth in depths:
            fns = make(depth, splits, steps)
            compile_s[name][depth] = compile_seconds(fns.pop("one"))
            if depth == FLAGS.depth:
                candidates.update(fns)
    out["compile_s"] = {
        name: {d: c for d, c in v.items() if str(d) in FLAGS.compile_depths}
        for name, v in compile_s.items()
    }
    timed = alternate(candidates, rounds=FLAGS.rounds)
    sec = timed["seconds"]
    out["epoch_s"] = {k: {"min": v["min"], "median": v["median"]} for k, v in sec.items()}
    for peer in FLAGS.peers:
        for name in (peer, f"{peer}_cached"):
            r = ratios(sec, name, "rhnzoo")
            out[f"{name}_over_rhnzoo"] = r["min"]
            out[f"{name}_over_rhnzoo_median"] = r["median"]
            out[f"{name}_over_rhnzoo_paired_median"] = r["paired_median"]
    out["rhnzoo_img_per_s"] = steps * BATCH / sec["rhnzoo"]["min"]
    if "peak_flops_per_s" in timed:
        out["matmul_peak_flops_per_s"] = timed["peak_flops_per_s"]["max"]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
