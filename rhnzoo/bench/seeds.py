r"""K seeds as a batch dimension of one train step (issue 47): what a second seed costs.

  python -m rhnzoo.bench.seeds                                  # pmnist, imdb, ptb_sota
  python -m rhnzoo.bench.seeds --configs=pmnist --seeds=1,2,4,8 --rounds=5

Each configuration's real train step (the classifier's of ``rhnzoo.tasks.rrl`` at Wang &
Tian's Table 2 sizes, the language model's of ``rhnzoo.tasks.lm``, the highway net's of
``rhnzoo.tasks.highway``; parameters, optimizer state, dropout key and batch all per seed)
is compiled once as it is (K = 1) and once per K as ``jax.vmap`` over a leading seed axis
of K stacked states, batches and keys, its state donated, and timed in interleaved rounds
(:func:`rhnzoo.bench.alternate`, min of N). One JSON line per configuration: per K the
step's ms (min, median), the ms per seed, ``k{K}_steps_ratio`` (K seeds in one step over K
separate steps: below 1, the stacked step is cheaper), compile seconds and the memory
estimate (:func:`rhnzoo.bench.memory_estimate`). Each seed gets what its own step gives
(``tests/test_bench.py``); figures: docs/speed.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from rhnzoo import data, precision
from rhnzoo.apps import cli
from rhnzoo.bench import alternate, compile_donated, host_info, memory_estimate, stepper
from rhnzoo.bench import lm as bench_lm
from rhnzoo.configs import highway as highway_configs
from rhnzoo.configs import rrl as rrl_presets
from rhnzoo.tasks import highway, rrl
from rhnzoo.tasks import lm as lm_training

# name -> (task, its settings): classifiers at Table 2 sizes (classes and input width the
# data set's unless named), rhnzoo.bench.lm's language models, highway nets, tiny ones.
CONFIG_PMNIST = dict(dataset="pmnist", **rrl_presets.PAPER_SIZES["pmnist"], batch_size=100)
CONFIG_IMDB = dict(
    dataset="imdb", **rrl_presets.PAPER_SIZES["imdb"], max_len=400, batch_size=32, vocab=20000
)
CONFIGS: dict[str, tuple[str, Any]] = {
    "pmnist": ("classifier", CONFIG_PMNIST),
    "imdb": ("classifier", CONFIG_IMDB),
    "ptb_sota": ("lm", "ptb_sota"),
    "tiny_classifier": (
        "classifier",
        dict(
            CONFIG_IMDB, embed_size=4, hidden_size=8, max_len=6, batch_size=4, vocab=30, classes=3
        ),
    ),
    "tiny_lm": ("lm", "tiny"),
    # P-MNIST at Table 2's size and batch (32 per seed): the harvest's P-MNIST runs.
    "pmnist_b32": ("classifier", dict(CONFIG_PMNIST, batch_size=32)),
    # The highway report's nets on MNIST (batch 128): the harvest's CPU chunks.
    **{
        f"highway_{kind}_d{depth}": ("highway", dict(kind=kind, depth=depth))
        for kind in ("plain", "highway")
        for depth in (10, 100)
    },
    "tiny_highway": ("highway", dict(kind="highway", depth=3)),
}

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The script's flags, defined only when run (each benchmark names its own ``--configs``)."""
    flags.DEFINE_list("configs", ["pmnist", "imdb", "ptb_sota"], f"From {list(CONFIGS)}.")
    flags.DEFINE_list("seeds", ["1", "2", "4", "8"], "K: seeds per step.")
    flags.DEFINE_integer("rounds", 3, "Timed rounds (min of N).")
    cli.define_precision_flag()
    flags.adopt_module_key_flags(cli)


Step = Callable[[Any, Any, jax.Array], tuple[Any, dict]]


def classifier_problem(c: dict) -> tuple[Step, Callable[[int], tuple[Any, Any]]]:
    """``(step, make)``: rrl's train step of the LSTM classifier of ``c`` and
    ``make(seed) -> (state, batch)``, the seed's initial state and random batch (tokens
    below ``c['vocab']``, or with no vocab the data set's features)."""
    keys = ("embed_size", "hidden_size", "max_len", "batch_size")
    config = rrl_presets.RRLConfig(
        model="lstm", dataset=c["dataset"], embeddings="random", **{k: c[k] for k in keys}
    )
    vocab, source = c.get("vocab"), data.DATASETS[c["dataset"]]
    classes, features = c.get("classes", source.num_classes), source.input_size
    model = config.classifier(classes, features, vocab)
    tx = config.optimizer()
    B, T = c["batch_size"], c["max_len"]

    def make(seed: int):
        rng = np.random.default_rng(seed)
        params = model.init(jax.random.PRNGKey(seed))
        inputs = (
            rng.normal(size=(B, T, features)).astype(np.float32)
            if vocab is None
            else rng.integers(1, vocab, (B, T)).astype(np.int32)
        )
        batch = (
            inputs,
            np.full(B, T, np.int32),
            rng.integers(0, classes, B).astype(np.int32),
            np.ones(B, np.float32),
        )
        return {"params": params, "opt_state": tx.init(params)}, jax.tree.map(jnp.asarray, batch)

    return rrl.make_train_step(model, tx), make


def lm_problem(name: str) -> tuple[Step, Callable[[int], tuple[Any, Any]]]:
    """``(step, make)`` as :func:`classifier_problem`, of :func:`rhnzoo.bench.lm.config`
    ``name`` with the reference scan (the state holds the carry)."""
    cfg, vocab = bench_lm.config(name, scan_impl="reference")
    model = cfg.model(vocab)
    tx = lm_training.make_optimizer(cfg, 100)

    def make(seed: int):
        state = lm_training.init_state(model, cfg, tx, jax.random.PRNGKey(seed))
        return state, bench_lm.random_batch(cfg, vocab, windows=2, seed=seed)

    return lm_training.make_train_step(model, cfg, tx), make


def highway_problem(c: dict) -> tuple[Step, Callable[[int], tuple[Any, Any]]]:
    """``(step, make)`` as :func:`classifier_problem`, of the highway report's net
    (``kind``, ``depth``) on MNIST's shapes: the batch is 8 batches' random uint8 images
    ``[N, 784]``, their labels and the step's indices."""
    cfg = highway_configs.get_config(kind=c["kind"], depth=c["depth"]).narrow()
    net = cfg.net()
    tx, _ = highway.make_optimizer(cfg, cfg.lr)
    B, n = cfg.batch_size, 8 * cfg.batch_size

    def make(seed: int):
        rng = np.random.default_rng(seed)
        images = rng.integers(0, 256, (n, net.input_size), dtype=np.uint8)
        labels = rng.integers(0, net.num_classes, n).astype(np.int32)
        idx = rng.permutation(n)[:B].astype(np.int32)
        state = highway.init_state(net, tx, jax.random.PRNGKey(seed))
        return state, jax.tree.map(jnp.asarray, (images, labels, idx))

    return highway.make_train_step(net, tx), make


PROBLEMS = {"classifier": classifier_problem, "lm": lm_problem, "highway": highway_problem}


def stacked(make: Callable[[int], tuple[Any, Any]], k: int) -> tuple[Any, Any, jax.Array]:
    """K seeds' states, batches and step keys, stacked on a leading axis."""
    states, batches = zip(*(make(s) for s in range(k)))
    stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)
    return stack(states), stack(batches), jax.random.split(jax.random.PRNGKey(7), k)


def bench(name: str, ks: list[int], rounds: int) -> dict:
    """Compiles and times configuration ``name`` at every K of ``ks`` (one JSON record)."""
    task, c = CONFIGS[name]
    step, make = PROBLEMS[task](c)
    result: dict[str, Any] = {
        "config": name,
        "task": task,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "matmul_precision": precision.current(),
        **host_info(),
    }
    candidates: dict[str, Callable[[], Any]] = {}
    for k in [None, *ks]:
        label = "single" if k is None else f"k{k}"
        if k is None:
            state, batch = make(0)
            key = jax.random.PRNGKey(7)
        else:
            state, batch, key = stacked(make, k)
        fn = step if k is None else jax.vmap(step)
        compiled, result[f"{label}_compile_s"] = compile_donated(fn, state, batch, key)
        result.update(memory_estimate(compiled, f"{label}_"))
        call, _ = stepper(compiled, state, batch, key)
        jax.block_until_ready(call())  # the warm-up
        candidates[label] = call
    secs = alternate(candidates, rounds=rounds, peak_dtype=None, warmup=False)["seconds"]
    single = secs["single"]["min"]
    result["single_step_ms_min"] = 1e3 * single
    for k in ks:
        s = secs[f"k{k}"]
        result[f"k{k}_step_ms_min"] = 1e3 * s["min"]
        result[f"k{k}_step_ms_median"] = 1e3 * s["median"]
        result[f"k{k}_ms_per_seed"] = 1e3 * s["min"] / k
        result[f"k{k}_steps_ratio"] = s["min"] / (k * single)
    return result


def main(argv):
    del argv
    ks = [int(k) for k in FLAGS.seeds]
    if not ks or min(ks) < 1:
        raise SystemExit(f"error: --seeds must be integers >= 1, got {','.join(FLAGS.seeds)}")
    with precision.context(FLAGS.matmul_precision):
        for name in FLAGS.configs:
            if name not in CONFIGS:
                raise SystemExit(f"error: no configuration {name!r}; known: {list(CONFIGS)}")
            print(json.dumps(bench(name, ks, FLAGS.rounds)), flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
