r"""Train-step benchmark of the RHN / HSG language model, against a plain-JAX peer.

  python -m rhnzoo.bench.lm                                  # the configurations of record
  python -m rhnzoo.bench.lm --configs=ptb_sota --dtype=bfloat16 --steps=8
  python -m rhnzoo.bench.lm --configs=ptb_d40_hsg --nopeer --remat --num_steps=200 --steps=0

Times the full jit-compiled train step (window slicing, dropout masks, forward, backward,
weight decay, clipping, SGD update; state donated) of :func:`rhnzoo.tasks.lm.make_train_step`
and, with ``--peer`` (the default), of :func:`make_peer_step` (the same
:func:`rhnzoo.engine.step.make_train_step` of another loss), on random tokens, after
compilation. A configuration (``--configs``, :data:`CONFIGS`) is a preset of
:mod:`rhnzoo.configs.lm` (:func:`config`); the flags set its scan, dtype and window only.

Method (:mod:`rhnzoo.bench`; docs/runs/cpu/bench.md#cpu-benchmark-method): one untimed call
of each step sizes the rounds (``--steps`` at most, no fewer than 3, about ``--budget_s``
seconds), then :func:`rhnzoo.bench.alternate` with the matmul peak in the run's dtype.
One JSON object per configuration: ``*_step_ms_min`` / ``_median`` / ``_all``; ``speedup``
= peer min / rhnzoo min (> 1: rhnzoo is faster), ``speedup_median``,
``speedup_paired_median``; tokens/s and achieved FLOP/s at the minimum step time; ``mfu``
over the best peak read in the run (``peak_flops_per_s_max``; ``_min`` shows how far the
peak moved); compile seconds, memory estimates, evaluation tokens/s, ``matmul_precision``
and the machine.

Model FLOPs per token (matmuls only; a multiply-add counts 2; training = 3 x forward):

    forward = 2 m k n              input projection (k = 2: fused H|T)
            + L 2 n k n            recurrent micro-layers
            + [HSG] 2 (2 n n)      HSG gate (W_R, W_F)
            + 2 n V                softmax

The peer (:func:`peer_loss`) is the RHN / HSG-RHN language model as a competent JAX user
writes it from the papers (Zilly et al. 2017, eqs. 6-9, coupled C = 1 - T; Shoham &
Permuter, eqs. 5-6), without rhnzoo's cells or models: the input projection of all steps
as one matmul outside a ``jax.lax.scan`` over time, the L micro-layers a Python ``for``
loop (as the reference TensorFlow code; ``--peer_layers=scan``: an inner ``lax.scan``),
each one fused ``[n, 2n]`` matmul; the same masks (:func:`rhnzoo.dropout.lm_masks`, same
key), loss and weight decay (:func:`rhnzoo.tasks.lm.l2_penalty`), optax chain; gradients
by ``jax.grad``. It reads rhnzoo's parameters and state as they are, so both steps compute
the same function (``tests/test_bench.py``). With ``--dtype=bfloat16`` it casts every
matmul's inputs to bfloat16 (float32 accumulation) as rhnzoo's forward does; its backward
is what ``jax.grad`` makes of that (float32 matmuls), whereas rhnzoo's hand-written
recurrent backward runs its matmuls in bfloat16 too.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

from rhnzoo import data, dropout, precision
from rhnzoo.analysis import lm as lm_analysis
from rhnzoo.apps import cli
from rhnzoo.bench import alternate, compile_donated, host_info, matmul_peak, memory_estimate
from rhnzoo.bench import ratios, stepper
from rhnzoo.cells import rhn_fused
from rhnzoo.configs import lm as lm_configs
from rhnzoo.engine import step
from rhnzoo.tasks import lm as train

Array = jax.Array

# The language models benchmarked (also rhnzoo.bench.seeds'), by name: keywords of
# rhnzoo.configs.lm.get_config (:func:`config`); ``vocab``, a bench-only size of the random
# tokens, stands in for the data set's.
CONFIGS: dict[str, dict[str, Any]] = {
    "ptb_sota": dict(dataset="ptb"),  # the reference code's ptb_sota (LMConfig's defaults)
    "ptb_d40_hsg": dict(dataset="ptb", depth=40, hsg=True),  # the HSG paper's deepest
    "enwik8_sota": dict(dataset="enwik8"),  # the reference code's enwik8_sota
    "cpu_small": dict(dataset="ptb", preset="small"),  # experiments/ptb.py --preset=small
    # A tiny HSG model for tests and smoke runs: the small preset's rates, tiny sizes.
    "tiny": dict(
        dataset="ptb",
        preset="small",
        hsg=True,
        hidden_size=16,
        depth=2,
        batch_size=4,
        num_steps=6,
        vocab=50,
    ),
}
# The data sets' vocabulary sizes (PTB words, enwik8 bytes), read from no files.
VOCAB = {"ptb": 10000, "enwik8": 205}
RECORD = ["ptb_sota", "ptb_d40_hsg", "cpu_small"]


def define_flags() -> None:
    """The script's flags, defined only when run (each benchmark names its own ``--configs``)."""
    flags.DEFINE_list("configs", RECORD, f"Configurations to run, from {list(CONFIGS)}.")
    flags.DEFINE_enum(
        "scan_impl",
        "fused",
        ["fused", "reference", "pallas"],
        "rhnzoo's time scan (pallas: the RHN micro-layer kernel, with --dtype=bfloat16).",
    )
    flags.DEFINE_enum(
        "dtype",
        "float32",
        ["float32", "bfloat16"],
        "Matmul input dtype (float32: at --matmul_precision).",
    )
    flags.DEFINE_boolean("remat", False, "Rematerialise time steps in rhnzoo's backward pass.")
    flags.DEFINE_integer("num_steps", None, "Override the BPTT window length.")
    flags.DEFINE_integer("unroll", 1, "Time steps per scan iteration (rhnzoo).")
    flags.DEFINE_enum(
        "layer_loop",
        "auto",
        ["auto", "python", "scan"],
        "rhnzoo's RHN micro-layers in the fused train step (rhn_fused.unroll's "
        "layer_loop): 'python', per-layer weights sliced once outside the time scan; "
        "'scan', a lax.scan over the stacked weights (XLA:CPU copies R_l out of the "
        "stack per micro-layer and step); 'auto', python up to depth "
        "rhn_fused.LOOP_LAYERS_UP_TO, scan above. Recorded as resolved.",
    )
    flags.DEFINE_boolean("peer", True, "Also time the plain-JAX peer step, alternating.")
    flags.DEFINE_enum(
        "peer_layers",
        "python",
        ["python", "scan"],
        "The peer's loop over micro-layers: Python for loop or lax.scan.",
    )
    flags.DEFINE_integer("steps", 10, "Most timed rounds (one step each); 0: compile only.")
    flags.DEFINE_float(
        "budget_s", 120.0, "Seconds of timed rounds per configuration (>= 3 rounds)."
    )
    flags.DEFINE_integer(
        "eval_tokens", 2000, "Tokens for the evaluation-speed measurement; 0: skip."
    )
    cli.define_precision_flag()
    flags.adopt_module_key_flags(cli)


FLAGS = flags.FLAGS
# The flags that are :func:`bench`'s keywords of the same names.
OPTIONS = (
    "num_steps scan_impl dtype remat unroll peer peer_layers steps budget_s eval_tokens layer_loop"
).split()


def config(name: str, **settings: Any) -> tuple[lm_configs.LMConfig, int]:
    """``(cfg, vocab)`` of configuration ``name`` of :data:`CONFIGS`:
    :func:`rhnzoo.configs.lm.get_config` of the entry updated by ``settings``, and the
    entry's ``vocab``, else the data set's (:data:`VOCAB`).

    Raises:
      KeyError: for a name not in :data:`CONFIGS`.
      ValueError: for a bad setting (one line).
    """
    spec = {**CONFIGS[name], **settings}
    vocab = spec.pop("vocab", None) or VOCAB[spec["dataset"]]
    return lm_configs.get_config(**spec), vocab


def shape(cfg: lm_configs.LMConfig, vocab: int) -> dict[str, Any]:
    """The model's shape as a record names it: ``hidden``, ``depth``, ``hsg``, ``batch``,
    ``num_steps``, ``vocab``, ``tied``."""
    return {
        "hidden": cfg.hidden_size,
        "depth": cfg.depth,
        "hsg": cfg.hsg,
        "batch": cfg.batch_size,
        "num_steps": cfg.num_steps,
        "vocab": vocab,
        "tied": cfg.tied,
    }


def random_batch(
    cfg: lm_configs.LMConfig, vocab: int, *, windows: int, seed: int
) -> tuple[Array, Array]:
    """A train step's batch ``(rows, 1)``: ``rows [B, windows T + 1]`` int32 random ids
    below ``vocab`` (NumPy ``seed``), window index 1 (the carry kept)."""
    B = cfg.batch_size
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, B * (cfg.num_steps * windows + 1), dtype=np.int32)
    return jnp.asarray(data.batchify(tokens, B)), jnp.int32(1)


def flops_per_token(c: dict) -> float:
    """Training model FLOPs per token (see the module docstring) of :func:`shape` ``c``."""
    n, L, V = c["hidden"], c["depth"], c["vocab"]
    m = n if c["tied"] else min(V, n)
    forward = 2 * m * 2 * n + L * 2 * n * 2 * n + (4 * n * n if c["hsg"] else 0) + 2 * n * V
    return 3.0 * forward


# ---------------------------------------------------------------------------- the peer


def peer_loss(
    params: dict,
    carry: Array,
    x: Array,
    y: Array,
    masks: dict[str, Array],
    *,
    hsg: bool,
    tied: bool,
    batch_size: int,
    weight_decay: float,
    dtype: str = "float32",
    layers: str = "python",
) -> tuple[Array, tuple[Array, Array]]:
    """The plain-JAX RHN / HSG-RHN language-model loss (see the module docstring).

    Args:
      params: rhnzoo's LM parameters (float32; ``cell``: ``{'W' [m, 2n], 'R' [L, n, 2n],
        'b' [L, 2n]}``, H | T fused, or for HSG ``{'cell': that, 'W_R', 'W_F', 'b_G'}``).
      carry: ``[B, n]`` float32 state entering the window.
      x, y: ``[B, T]`` int32 inputs and targets.
      masks: :func:`rhnzoo.dropout.lm_masks`.
      dtype: matmul input dtype, accumulation float32.
      layers: the loop over micro-layers 2..L: ``'python'`` (a ``for`` loop) or ``'scan'``.

    Returns:
      ``(loss, (nll, carry))``: loss = nll / B + weight_decay * 0.5 ||params||^2,
      nll the summed cross-entropy (nats) over the window, carry ``[B, n]``.

    Raises:
      ValueError: for an unknown ``layers``.
    """
    if layers not in ("python", "scan"):
        raise ValueError(f"layers must be 'python' or 'scan', got {layers!r}")

    def mm(a, b):
        return jnp.dot(a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)

    rhn = params["cell"]["cell"] if hsg else params["cell"]
    n = rhn["R"].shape[1]
    # The weights are split per micro-layer once, outside the time scan (as separate
    # per-layer variables would be): indexing the [L, n, 2n] stack inside the scan
    # body would make autodiff add a padded [L, n, 2n] cotangent per micro-layer
    # and time step. 'scan' keeps layers 2..L stacked: R = (R_1, R_2..L).
    if layers == "python":
        R, b = list(rhn["R"]), list(rhn["b"])
    else:
        R, b = (rhn["R"][0], rhn["R"][1:]), (rhn["b"][0], rhn["b"][1:])
    emb = params["embed"]
    xs = emb[x.T] * masks["x"].T[..., None] * masks["i"]  # [T, B, m]
    xw = mm(xs, rhn["W"])  # [T, B, 2n]: W_H x | W_T x for every time step at once
    m_h = masks["h"]

    def micro_layer(s, R_l, b_l):  # eqs. 6-8 with C = 1 - T, H|T fused
        z = mm(s * m_h, R_l) + b_l
        h, t = jnp.tanh(z[:, :n]), jax.nn.sigmoid(z[:, n:])
        return h * t + s * (1.0 - t)

    def time_step(s_prev, xw_t):
        s = micro_layer(s_prev, R[0], b[0] + xw_t)  # the input enters micro-layer 1 only
        if layers == "python":
            for R_l, b_l in zip(R[1:], b[1:]):
                s = micro_layer(s, R_l, b_l)
        else:
            s, _ = jax.lax.scan(lambda s, Rb: (micro_layer(s, *Rb), None), s, (R[1], b[1]))
        if hsg:
            cp = params["cell"]
            g = jax.nn.sigmoid(mm(s_prev, cp["W_R"]) + mm(s, cp["W_F"]) + cp["b_G"])  # eq. 6
            s = g * s_prev + (1.0 - g) * s  # eq. 5
        return s, s

    carry, ys = jax.lax.scan(time_step, carry, xw)  # ys [T, B, n]
    ys = ys * masks["o"]
    w_out = emb.T if tied else params["softmax_w"]
    logits = mm(ys, w_out) + params["softmax_b"]
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, y.T).sum()
    return nll / batch_size + weight_decay * train.l2_penalty(params), (nll, carry)


def peer_window_loss(
    params: dict,
    batch: tuple[Array, Array],
    key: Array,
    carry: Array,
    *,
    cfg: lm_configs.LMConfig,
    vocab_size: int,
    **options: Any,
):
    """:func:`peer_loss` on window ``batch = (rows, index)`` in the loss contract of
    :func:`rhnzoo.engine.step.make_train_step`, as :func:`rhnzoo.tasks.lm.window_loss`:
    ``(loss, ({'loss': nll, 'count': B T}, carry))``; ``options``: :func:`peer_loss`'s."""
    rows, index = batch
    x, y = train.window(rows, index, cfg.num_steps)
    m, n = params["embed"].shape[1], carry.shape[1]
    masks = dropout.lm_masks(key, x, vocab_size, m, n, cfg.rates)
    loss, (nll, carry) = peer_loss(
        params,
        train.reset_carry(carry, index),
        x,
        y,
        masks,
        batch_size=cfg.batch_size,
        weight_decay=cfg.weight_decay,
        **options,
    )
    return loss, ({"loss": nll, "count": jnp.float32(cfg.batch_size * cfg.num_steps)}, carry)


def make_peer_step(
    cfg: lm_configs.LMConfig,
    tx: optax.GradientTransformation,
    *,
    vocab_size: int,
    hsg: bool,
    tied: bool,
    dtype: str = "float32",
    layers: str = "python",
):
    """The peer's ``train_step(state, (rows, window), key) -> (state, sums)``: the contract,
    state and step of :func:`rhnzoo.tasks.lm.make_train_step` over :func:`peer_loss`. Wrap
    it in ``jax.jit(..., donate_argnums=0)``."""
    options = {"hsg": hsg, "tied": tied, "dtype": dtype, "layers": layers}
    loss = functools.partial(peer_window_loss, cfg=cfg, vocab_size=vocab_size, **options)
    return step.make_train_step(loss, tx)


# ---------------------------------------------------------------------------- the benchmark


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _layer_loop(layer_loop: str, depth: int, scan_impl: str) -> str | None:
    """The micro-layer layout the fused RHN step (or the pallas kernels') runs with
    ``--layer_loop`` at ``depth``; None for the reference scan."""
    if scan_impl == "reference":
        return None
    if layer_loop == "auto":
        return "python" if depth <= rhn_fused.LOOP_LAYERS_UP_TO else "scan"
    return layer_loop


def bench(
    name: str,
    *,
    num_steps: int | None = None,
    scan_impl: str = "fused",
    dtype: str = "float32",
    remat: bool = False,
    unroll: int = 1,
    peer: bool = True,
    peer_layers: str = "python",
    steps: int = 10,
    budget_s: float = 120.0,
    eval_tokens: int = 2000,
    layer_loop: str = "auto",
) -> dict:
    """Compiles and times configuration ``name`` of :data:`CONFIGS`; returns the JSON
    record (module docstring; arguments: the flags of the same names). ``steps=0`` returns
    after compilation."""
    settings = {"num_steps": num_steps} if num_steps else {}
    cfg, vocab = config(
        name, scan_impl=scan_impl, dtype=dtype, remat=remat, unroll=unroll, **settings
    )
    model = cfg.model(vocab)
    batch, key = random_batch(cfg, vocab, windows=4, seed=0), jax.random.PRNGKey(1)
    tx = train.make_optimizer(cfg, data.num_windows(batch[0].shape[1], cfg.num_steps))
    state = train.init_state(model, cfg, tx, jax.random.PRNGKey(0))
    result: dict[str, Any] = {
        "config": name,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dtype": dtype,
        "matmul_precision": precision.current(),
        "scan_impl": scan_impl,
        "remat": remat,
        "unroll": unroll,
        "layer_loop": _layer_loop(layer_loop, cfg.depth, scan_impl),
        **shape(cfg, vocab),
        **host_info(),
    }
    if layer_loop != "auto":  # the fused scan's backend option, through the model
        model = dataclasses.replace(model, layer_loop=layer_loop)
    compiled, result["compile_s"] = compile_donated(
        train.make_train_step(model, cfg, tx), state, batch, key
    )
    result.update(memory_estimate(compiled))
    candidates, boxes = {}, {}
    candidates["rhnzoo"], boxes["rhnzoo"] = stepper(compiled, state, batch, key)
    if peer:
        peer_step = make_peer_step(
            cfg, tx, vocab_size=vocab, hsg=cfg.hsg, tied=cfg.tied, dtype=dtype, layers=peer_layers
        )
        result["peer_layers"] = peer_layers
        peer_state = jax.tree.map(jnp.copy, state)  # its own buffers (both are donated)
        peer_compiled, result["peer_compile_s"] = compile_donated(peer_step, peer_state, batch, key)
        result.update(memory_estimate(peer_compiled, "peer_"))
        candidates["peer"], boxes["peer"] = stepper(peer_compiled, peer_state, batch, key)
    if steps == 0:  # compile only: compile time and the compiler's memory estimate
        return result

    # One call each (the warm-up, so alternate skips its own) to size the rounds to the budget.
    t = time.perf_counter()
    for fn in candidates.values():
        jax.block_until_ready(fn())
    peak_dtype = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
    matmul_peak(peak_dtype, reps=3)
    round_s = time.perf_counter() - t
    rounds = max(min(steps, 3), min(steps, int(budget_s // round_s)))
    result["loadavg_1m_before"] = _loadavg()
    timing = alternate(candidates, rounds=rounds, peak_dtype=peak_dtype, warmup=False)
    result["loadavg_1m_after"] = _loadavg()

    secs, peaks = timing["seconds"], timing["peak_flops_per_s"]
    fpt, tokens_per_step = flops_per_token(result), cfg.batch_size * cfg.num_steps
    result.update(
        rounds=rounds,
        peak_dtype=jnp.dtype(peak_dtype).name,
        peak_flops_per_s_max=peaks["max"],
        peak_flops_per_s_min=peaks["min"],
        peak_gflops_all=[round(p / 1e9, 1) for p in peaks["all"]],
        model_flops_per_token=fpt,
    )
    for who, s in secs.items():
        result[f"{who}_step_ms_min"] = 1e3 * s["min"]
        result[f"{who}_step_ms_median"] = 1e3 * s["median"]
        result[f"{who}_step_ms_all"] = [round(1e3 * x, 1) for x in s["all"]]
    for who, s in secs.items():
        pre = "" if who == "rhnzoo" else "peer_"
        result[f"{pre}tokens_per_s"] = tokens_per_step / s["min"]
        result[f"{pre}achieved_flops_per_s"] = fpt * tokens_per_step / s["min"]
        result[f"{pre}mfu"] = fpt * tokens_per_step / s["min"] / peaks["max"]
    if peer:
        r = ratios(secs, "peer", "rhnzoo")
        result.update(
            speedup=r["min"], speedup_median=r["median"], speedup_paired_median=r["paired_median"]
        )

    if eval_tokens:
        evaluate = functools.partial(lm_analysis.stream_nll, model)
        params = boxes["rhnzoo"][0]["params"]
        tokens = np.asarray(batch[0]).ravel()  # the stream the rows were cut from, whole
        for b in (1, cfg.batch_size):
            toks = tokens[: max(eval_tokens, 2 * b)]
            evaluate(params, tokens[: 2 * b], b, 100)  # compiles the same [b, 100] window
            t = time.perf_counter()
            evaluate(params, toks, b, 100)
            result[f"eval_batch{b}_tokens_per_s"] = len(toks) / (time.perf_counter() - t)
    return result


def main(argv):
    del argv
    unknown = set(FLAGS.configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"error: unknown configs {sorted(unknown)}; choose from {list(CONFIGS)}")
    if FLAGS.steps < 0 or FLAGS.budget_s <= 0:
        raise SystemExit(
            f"error: need --steps >= 0 and --budget_s > 0, got {FLAGS.steps}, {FLAGS.budget_s}"
        )
    options = {k: getattr(FLAGS, k) for k in OPTIONS}
    for name in FLAGS.configs:
        with precision.context(FLAGS.matmul_precision):
            result = bench(name, **options)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
