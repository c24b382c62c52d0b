r"""Train-step benchmark: tokens/s and model-FLOPs utilisation (MFU).

  python -m rhnzoo.bench.lm                                   # every configuration
  python -m rhnzoo.bench.lm --configs=ptb_sota --scan_impl=reference
  python -m rhnzoo.bench.lm --configs=ptb_d40_hsg --num_steps=200 --remat

Times the full jit-compiled train step of :mod:`rhnzoo.train` (dropout masks,
forward, backward, clipping, SGD update) after compilation, on whatever device
JAX sees, and prints one JSON object per configuration with the device, tokens/s,
the analytic model FLOPs per token, the achieved FLOP/s, the same device's
dense-matmul throughput measured in the same run, their ratio (MFU), the compile
time, the compiler's memory estimate, and evaluation speed.

Model FLOPs per token (matmuls only; a multiply-add counts 2; training = 3 x
forward, as the backward pass does two matmuls per forward matmul):

    forward = 2 m k n              input projection (k = 2: fused H|T)
            + L 2 n k n            recurrent micro-layers
            + [HSG] 2 (2 n n)      HSG gate (W_R, W_F)
            + 2 n V                softmax
"""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from rhnzoo import data, dropout
from rhnzoo.bench import matmul_peak
from rhnzoo.models import lm
from rhnzoo.training import lm as train

CONFIGS = {
    # The reference code's ptb_sota and enwik8_sota settings, HSG's deepest, and the CPU preset.
    "ptb_sota": dict(vocab=10000, hidden=830, depth=10, batch=20, num_steps=35, tied=True,
                     hsg=False, rates=(0.25, 0.75, 0.25, 0.75)),
    "ptb_d40_hsg": dict(vocab=10000, hidden=830, depth=40, batch=20, num_steps=35, tied=True,
                        hsg=True, rates=(0.25, 0.75, 0.25, 0.75)),
    "enwik8_sota": dict(vocab=205, hidden=1500, depth=10, batch=128, num_steps=50, tied=False,
                        hsg=False, rates=(0.10, 0.40, 0.10, 0.40)),
    "cpu_small": dict(vocab=10000, hidden=256, depth=3, batch=20, num_steps=35, tied=True,
                      hsg=False, rates=(0.1, 0.3, 0.1, 0.3)),
}  # fmt: skip

flags.DEFINE_list("configs", list(CONFIGS), "Configurations to run.")
flags.DEFINE_enum("scan_impl", "fused", ["fused", "reference"], "Time-scan implementation.")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Matmul input dtype.")
flags.DEFINE_boolean("remat", False, "Rematerialise time steps in the backward pass.")
flags.DEFINE_integer("num_steps", None, "Override the BPTT window length.")
flags.DEFINE_integer("unroll", 1, "Time steps per scan iteration.")
flags.DEFINE_integer("steps", 20, "Timed train steps (median reported); 0: compile only.")
flags.DEFINE_integer("eval_tokens", 2000, "Tokens for the evaluation-speed measurement.")
FLAGS = flags.FLAGS


def flops_per_token(c: dict) -> float:
    """Training model FLOPs per token (see the module docstring)."""
    n, L, V = c["hidden"], c["depth"], c["vocab"]
    m = n if c["tied"] else min(V, n)
    forward = 2 * m * 2 * n + L * 2 * n * 2 * n + (4 * n * n if c["hsg"] else 0) + 2 * n * V
    return 3.0 * forward


def _memory(compiled) -> dict:
    try:
        m = compiled.memory_analysis()
        est = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
        return {"temp_bytes": int(m.temp_size_in_bytes),
                "peak_bytes_estimate": int(est - m.alias_size_in_bytes)}  # fmt: skip
    except Exception:  # not every backend reports it
        return {}


def bench(name: str, c: dict, *, scan_impl: str, dtype: str, remat: bool, unroll: int,
          steps: int, eval_tokens: int, peak: float) -> dict:  # fmt: skip
    """Compiles and times the train step (and evaluation) of configuration ``c``."""
    model = lm.rhn_language_model(c["vocab"], c["hidden"], c["depth"], hsg=c["hsg"],
                                  tied=c["tied"], scan_impl=scan_impl, remat=remat,
                                  dtype=dtype, unroll=unroll)  # fmt: skip
    cfg = train.TrainConfig(batch_size=c["batch"], num_steps=c["num_steps"],
                            rates=dropout.Rates(*c["rates"]))  # fmt: skip
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, c["vocab"], c["batch"] * (c["num_steps"] * 4 + 1), dtype=np.int32)
    rows = jnp.asarray(data.batchify(tokens, c["batch"]))
    spe = data.num_windows(rows.shape[1], c["num_steps"])
    tx = train.make_optimizer(cfg, spe)
    state = train.init_state(model, cfg, tx, jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    step_fn = jax.jit(train.make_train_step(model, cfg, tx), donate_argnums=0)
    batch = (rows, jnp.int32(1))
    t = time.perf_counter()
    compiled = step_fn.lower(state, batch, key).compile()
    compile_s = time.perf_counter() - t
    if steps == 0:  # compile-only: compile time and the compiler's memory estimate
        return {"config": name, "scan_impl": scan_impl, "remat": remat, "dtype": dtype,
                "num_steps": c["num_steps"], "compile_s": compile_s, **_memory(compiled)}  # fmt: skip
    for _ in range(2):
        state, sums = compiled(state, batch, key)
    sums['loss'].block_until_ready()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        state, sums = compiled(state, batch, key)
        sums['loss'].block_until_ready()
        times.append(time.perf_counter() - t)
    step_s = statistics.median(times)
    tok_s = c["batch"] * c["num_steps"] / step_s
    fpt = flops_per_token(c)
    result = {
        "config": name, "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
        "scan_impl": scan_impl, "dtype": dtype, "remat": remat, "unroll": unroll,
        **{k: c[k] for k in ("hidden", "depth", "hsg", "batch", "num_steps", "vocab")},
        "step_ms": 1e3 * step_s, "tokens_per_s": tok_s, "model_flops_per_token": fpt,
        "achieved_flops_per_s": fpt * tok_s, "matmul_peak_flops_per_s": peak,
        "mfu": fpt * tok_s / peak, "compile_s": compile_s, **_memory(compiled),
    }  # fmt: skip
    if eval_tokens:
        evaluate = train.make_evaluate(model)
        for b in (1, c["batch"]):
            toks = tokens[: max(eval_tokens, 2 * b)]
            evaluate(state["params"], toks, b, 100)  # compile
            t = time.perf_counter()
            evaluate(state["params"], toks, b, 100)
            result[f"eval_batch{b}_tokens_per_s"] = len(toks) / (time.perf_counter() - t)
    return result


def main(argv):
    del argv
    unknown = set(FLAGS.configs) - set(CONFIGS)
    if unknown:
        raise SystemExit(f"error: unknown configs {sorted(unknown)}; choose from {list(CONFIGS)}")
    peak = matmul_peak(jnp.bfloat16 if FLAGS.dtype == "bfloat16" else jnp.float32)
    for name in FLAGS.configs:
        c = dict(CONFIGS[name])
        if FLAGS.num_steps:
            c["num_steps"] = FLAGS.num_steps
        result = bench(name, c, scan_impl=FLAGS.scan_impl, dtype=FLAGS.dtype, remat=FLAGS.remat,
                       unroll=FLAGS.unroll, steps=FLAGS.steps, eval_tokens=FLAGS.eval_tokens,
                       peak=peak)  # fmt: skip
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    app.run(main)
