r"""Gated-cell classifier train-step benchmarks: rhnzoo's fused scan (and its persistent
Pallas kernel) against Flax, cuDNN (from JAX and from PyTorch) and its own reference path.

  python -m rhnzoo.bench.rnn                                   # every cell and shape
  python -m rhnzoo.bench.rnn --cells=lstm --configs=imdb_cpu,pmnist --rounds=7
  python -m rhnzoo.bench.rnn --cells=lstm --bfloat16           # adds rhnzoo in bfloat16
  python -m rhnzoo.bench.rnn --configs=pmnist --cells=lstm,gru --pallas --torch --bfloat16

Every candidate computes the forward and backward pass of a sequence classifier: a
recurrent layer over ``xs [T, B, m]`` float32 (time-major), its last output through a
linear softmax layer, mean cross-entropy, its value and the gradients of every parameter
(no optimizer step); the JAX ones as ``jax.value_and_grad`` under ``jax.jit``:

* **rhnzoo**: :func:`rhnzoo.cells.gated_fused.unroll` as the classifier calls it
  (``lengths`` all T, ``outputs="last"``, its defaults otherwise); **rhnzoo_bf16**
  (``--bfloat16``) the same with bfloat16 matmul inputs; **rhnzoo_u{k}**
  (``--unroll=k,...``) with ``unroll=k`` (default:
  :func:`rhnzoo.cells.gated_fused.default_unroll`);
* **reference**: :func:`rhnzoo.cells.unroll` (``lax.scan`` + autodiff under
  ``save_matmuls_only``: the classifier's ``scan_impl='reference'``);
* **flax** (LSTM and GRU): ``nn.RNN(nn.OptimizedLSTMCell(n))`` with rhnzoo's LSTM weights
  copied in (losses checked to agree before timing), and ``nn.RNN(nn.GRUCell(n))`` with
  its own initialisation (Flax's GRU is the reset-after variant, a different function of
  the same FLOPs: its loss is reported, not compared);
* **jax_cudnn** (LSTM, GPU only): ``jax.experimental.rnn.lstm`` with rhnzoo's weights in
  cuDNN's layout (:func:`cudnn_weights`);
* **pallas** (``--pallas``, GPU only, where ``scan.pallas_supports(cell)``): the persistent
  kernels (``scan.unroll(..., impl='pallas')``, :mod:`rhnzoo.cells.kernels.gated` /
  :mod:`~rhnzoo.cells.kernels.chained`) called as the fused scan, ``dtype=bfloat16``; loss
  checked against rhnzoo's to ``PALLAS_RTOL``; ``skipped['pallas']`` says why it is absent;
* **torch_fp32**, **torch_tf32**, **torch_bf16**, **torch_fp16** (``--torch``; LSTM and
  GRU): ``torch.nn.LSTM`` / ``torch.nn.GRU`` (cuDNN on a GPU) -> ``nn.Linear`` ->
  ``F.cross_entropy``, ``backward()``, ending in ``torch.cuda.synchronize()``
  (:func:`torch_step`), weights from :func:`torch_weights`; losses checked against
  ``losses['torch_function_fp32']`` (rhnzoo's reference scan at ``highest``). TF32 off /
  on for cuBLAS and cuDNN's RNN (:func:`_set_tf32`), bf16 / fp16 by ``.to(dtype)``, not
  autocast (which casts cuDNN's RNN to float16 whatever it is given). Which cuDNN kernels
  run at each precision: docs/runs/gpu/2026-11-27/README.md. ``--torch_profile`` adds,
  after all timings, one ``"record": "torch_kernels"`` line per torch peer (its five
  longest GPU kernels); ``--torch_device=cpu`` checks the peers' code without a GPU.
  ``skipped`` says where torch or CUDA is absent.

Cells: ``lstm``, ``gru`` (Cho et al.'s), ``gru_ra`` (reset-after: PyTorch's and cuDNN's),
``sc_lstm`` (SC-LSTM-P, L = 20), ``rrn`` (K = 2, σ). Timed with
:func:`rhnzoo.bench.alternate`; one JSON line per (cell, shape) gives the times and the
ratios ``ratio_{a}_over_{b}`` (a's time / b's, :func:`rhnzoo.bench.ratios`: of the minima,
the medians, and ``paired_median``) of the peer (Flax for LSTM and GRU, the reference path
for SC-LSTM and RRN) over ``rhnzoo``; with ``--pallas`` / ``--torch`` also every torch
peer over ``rhnzoo`` (bf16 / fp16 ones also over ``rhnzoo_bf16``), and the peer,
``rhnzoo``, ``rhnzoo_bf16`` and the torch peers over ``pallas``. Each line also names the
device, backend, commit, versions and ``precisions`` (each candidate's arithmetic:
``fp32``, ``tf32``, ``bf16``, ``fp16``).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import optax
from absl import app, flags, logging
from jax.experimental import rnn as jax_rnn

from rhnzoo import cells, precision
from rhnzoo.apps import cli
from rhnzoo.bench import alternate, ratios
from rhnzoo.cells import gated_fused, scan, torch_interop
from rhnzoo.cells.scan_options import Options

CONFIGS = {
    # Wang & Tian's IMDB shape (embedding 256 -> LSTM 512, reviews cut to 400 words),
    # the same with T = 100 (CPU-sized), and permuted pixel MNIST (1 -> 100, T = 784).
    "imdb": {"input": 256, "hidden": 512, "batch": 32, "steps": 400, "classes": 2},
    "imdb_cpu": {"input": 256, "hidden": 512, "batch": 32, "steps": 100, "classes": 2},
    "pmnist": {"input": 1, "hidden": 100, "batch": 100, "steps": 784, "classes": 10},
    "tiny": {"input": 3, "hidden": 8, "batch": 4, "steps": 6, "classes": 3},  # for tests
}
CELLS = {
    "lstm": lambda n: cells.LSTM(n),
    "gru": lambda n: cells.GRU(n),
    "gru_ra": lambda n: cells.GRU(n, reset_after=True),  # PyTorch's / cuDNN's GRU
    "sc_lstm": lambda n: cells.SCLSTM(n, skip=20, learn_alpha=True),
    "rrn": lambda n: cells.RRN(n, 2),
}
# The PyTorch peers: name -> (torch dtype, TensorFloat-32 allowed in cuBLAS and cuDNN's RNN).
TORCH_PEERS = {
    "torch_fp32": ("float32", False),
    "torch_tf32": ("float32", True),
    "torch_bf16": ("bfloat16", False),
    "torch_fp16": ("float16", False),
}
TORCH_CELLS = ("lstm", "gru", "gru_ra")  # PyTorch has no SC-LSTM or RRN
# Relative tolerances of the (non-fatal) loss checks: cuDNN's reduction order at float32,
# its rounding at TF32 (2.4 % off at the IMDB shape for jax_cudnn), bf16 / fp16 over T steps.
TORCH_RTOL = {"torch_fp32": 1e-3, "torch_tf32": 5e-2, "torch_bf16": 5e-2, "torch_fp16": 5e-2}
PALLAS_RTOL = 5e-2


def define_flags() -> None:
    """The script's flags, defined only when run (each benchmark names its own ``--configs``)."""
    flags.DEFINE_list("configs", ["imdb_cpu", "pmnist"], f"Shapes, of {list(CONFIGS)}.")
    flags.DEFINE_list("cells", list(CELLS), "Cells.")
    flags.DEFINE_boolean("bfloat16", False, "Also time rhnzoo with bfloat16 matmul inputs.")
    flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds.")
    flags.DEFINE_integer("repeats", 1, "Timings per candidate per round.")
    flags.DEFINE_list(
        "unroll",
        [],
        "Also time rhnzoo's fused scan with these unroll=k (time steps "
        "per scan iteration, forward and backward), e.g. 2,4,8.",
    )
    flags.DEFINE_boolean(
        "pallas",
        False,
        "Also time rhnzoo's persistent Pallas kernel "
        "(rhnzoo.cells.kernels.gated, bfloat16) where it supports the cell, on a GPU.",
    )
    flags.DEFINE_boolean(
        "torch",
        False,
        "Also time torch.nn.LSTM / nn.GRU (cuDNN) in float32, TF32, "
        "bfloat16 and float16 (LSTM and GRU; skipped with a reason where torch or "
        "CUDA is absent).",
    )
    flags.DEFINE_string(
        "torch_device",
        "cuda",
        "Device of the torch peers (cpu: check their code without a GPU; not cuDNN's times).",
    )
    flags.DEFINE_boolean(
        "torch_profile",
        False,
        "With --torch: after all timings, one JSON line "
        "per torch peer with its five longest GPU kernels (torch.profiler).",
    )
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
    as the classifier computes it; ``scan_impl``: ``fused``, ``pallas`` (no ``unroll``) or
    ``reference``."""
    T, B = xs.shape[:2]
    carry = cell.initial_carry(B)
    if scan_impl == "fused":  # no output stack: the last output read from the final carry
        opts = Options(dtype=dtype, outputs="last", unroll=unroll)
        lengths = jnp.full((B,), T)
        _, last = gated_fused.unroll(cell, params["cell"], carry, xs, None, opts, lengths=lengths)
    elif scan_impl == "pallas":
        _, last = scan.unroll(
            cell,
            params["cell"],
            carry,
            xs,
            impl="pallas",
            dtype=dtype,
            lengths=jnp.full((B,), T),
            outputs="last",
        )
    else:
        _, ys = cells.unroll(
            cell, params["cell"], carry, xs, project_per_step=xs.shape[-1] <= 8, save_matmuls=True
        )
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
    """rhnzoo LSTM params -> the flat ``[4n (m + n + 2)]`` float32 weight vector of
    ``jax.experimental.rnn.lstm``: ``W_ih [4n, m]``, ``W_hh [4n, n]``, ``b_ih [4n]``,
    ``b_hh [4n]`` (zero), gates i | f | g | o (rhnzoo's blocks are i | f | o | c̃)."""
    p = params["cell"]
    order = [0, 1, 3, 2]  # cuDNN's i, f, g, o as rhnzoo's block indices
    blocks = lambda a: jnp.concatenate([a[..., k * n : (k + 1) * n] for k in order], -1)
    return jnp.concatenate(
        [
            blocks(p["W"]).T.ravel(),
            blocks(p["U"]).T.ravel(),
            blocks(p["b"]),
            jnp.zeros((4 * n,), p["b"].dtype),
        ]
    )


def cudnn_logits(m: int, n: int, params, xs):
    """cuDNN's LSTM (GPU only) over ``xs [T, B, m]`` -> final h -> the linear layer;
    ``params = {"lstm": cudnn_weights(...), "out": ...}``; TF32 as
    :func:`rhnzoo.precision.cudnn_rnn` says."""
    B = xs.shape[1]
    zeros = jnp.zeros((1, B, n), xs.dtype)
    _, h, _ = jax_rnn.lstm(
        jnp.swapaxes(xs, 0, 1),
        zeros,
        zeros,
        params["lstm"],
        jnp.full((B,), xs.shape[0], jnp.int32),
        input_size=m,
        hidden_size=n,
        num_layers=1,
        dropout=0.0,
        bidirectional=False,
        precision=precision.cudnn_rnn(),
    )
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


@functools.cache
def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout this module lies in (once per process), or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


def versions(torch_module=None) -> dict:
    """Python, JAX, jaxlib, Flax and optax versions; with ``torch_module`` (an imported
    ``torch``) also torch's, the CUDA it was built for and the cuDNN it loaded."""
    out = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "optax": optax.__version__,
    }
    if torch_module is not None:
        cudnn = torch_module.backends.cudnn
        out.update(
            torch=torch_module.__version__,
            torch_cuda=torch_module.version.cuda,
            torch_cudnn=cudnn.version() if cudnn.is_available() else None,
        )
    return out


def jax_precision(backend: str, level: str | None = None) -> str:
    """What a float32 JAX matmul computes at ``level`` (default: the precision in effect)
    on ``backend``: ``fp32``, ``tf32`` (a GPU's ``default`` / ``high``, Ampere and
    newer), ``bf16`` / ``bf16_3x`` (a TPU's), or a ``DotAlgorithmPreset`` name as is."""
    level = precision.resolve(level)
    if level == "highest" or level.startswith("F32_F32_F32"):
        return "fp32"
    if level not in precision.LEVELS:
        return level
    if backend == "cpu":
        return "fp32"
    if backend in ("gpu", "cuda", "rocm"):
        return "tf32"
    if backend == "tpu":
        return "bf16_3x" if level == "high" else "bf16"
    return level


def pallas_skip_reason(cell, backend: str | None = None) -> str | None:
    """Why the ``pallas`` candidate is not timed for ``cell`` on ``backend`` (default:
    JAX's), or None where it is: only compiled on a GPU, and only where
    ``scan.pallas_supports(cell)``."""
    backend = backend or jax.default_backend()
    if backend != "gpu":
        return (
            f"not a GPU (backend {backend}): the persistent Pallas kernel is timed "
            "compiled on a GPU only"
        )
    if not scan.pallas_supports(cell):
        return f"no persistent Pallas kernel for {cell!r} (scan.pallas_supports)"
    return None


def _pallas_fits(cell, c: dict) -> bool | None:
    """Whether ``auto`` would pick ``cell``'s kernels at shape ``c`` in bfloat16
    (:func:`rhnzoo.cells.kernels.backend_of`), None where it cannot say."""
    try:
        from rhnzoo.cells import kernels

        backend = kernels.backend_of(cell)
        if backend is None:
            return False
        return bool(backend.fits(cell, c["batch"], jnp.bfloat16, input_size=c["input"]))
    except Exception:  # noqa: BLE001 - informative only
        return None


def _one_line(e: BaseException, limit: int = 300) -> str:
    """``'TypeName: first line of the message'``, cut to ``limit`` characters."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:limit]


def _import_torch():
    """``(torch, None)``, or ``(None, why)`` where torch does not import."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken CUDA library load
        return None, f"torch is not importable here ({_one_line(e)})"
    return torch, None


def torch_skip_reason(cell_name: str, device: str) -> str | None:
    """Why the torch peers are not timed for ``cell_name`` on ``device``, or None."""
    if cell_name not in TORCH_CELLS:
        return f"no PyTorch peer for {cell_name} (PyTorch has LSTM and GRU only)"
    torch, why = _import_torch()
    if torch is None:
        return why
    if device.startswith("cuda") and not torch.cuda.is_available():
        return (
            f"CUDA is not available to torch {torch.__version__} (built for CUDA "
            f"{torch.version.cuda}): the torch peers are cuDNN on a GPU"
        )
    return None


def torch_weights(cell_name: str, params):
    """``(cell, cell_params, state_dict)``: the function the torch peer of ``cell_name``
    computes, as an rhnzoo cell and parameters, and its ``torch.nn.LSTM`` / ``GRU``
    ``state_dict`` (NumPy, :mod:`rhnzoo.cells.torch_interop`). ``gru``: PyTorch's GRU is
    the reset-after variant, so ``GRU(n, reset_after=True)`` with the same W, U, b and
    b_hn = 0.

    Raises:
      ValueError: for a cell PyTorch does not have.
    """
    p = {k: np.asarray(v) for k, v in params["cell"].items()}
    n = p["U"].shape[0]
    if cell_name == "lstm":
        return cells.LSTM(n), p, torch_interop.lstm_to_torch(p)
    if cell_name == "gru":
        p = dict(p, b_hn=np.zeros((n,), p["b"].dtype))
        return cells.GRU(n, reset_after=True), p, torch_interop.gru_to_torch(p)
    if cell_name == "gru_ra":  # the same function as torch.nn.GRU
        return cells.GRU(n, reset_after=True), p, torch_interop.gru_to_torch(p)
    raise ValueError(f"no PyTorch peer for {cell_name}; PyTorch has {list(TORCH_CELLS)}")


def torch_function_loss(cell_name: str, params, xs, labels) -> float:
    """The loss the torch peers compute, by rhnzoo's reference scan at float32
    (``highest``): the value their losses are checked against."""
    cell, p, _ = torch_weights(cell_name, params)
    xent = optax.softmax_cross_entropy_with_integer_labels
    with precision.context("highest"):
        f = jax.jit(
            lambda p, xs, y: xent(rhnzoo_logits(cell, p, xs, scan_impl="reference"), y).mean()
        )
        return float(f({"cell": p, "out": params["out"]}, xs, labels))


def _set_tf32(torch, allowed: bool) -> dict:
    """TensorFloat-32 on or off for cuBLAS matmuls and cuDNN's RNNs; returns the settings
    now in effect. PyTorch's ``fp32_precision`` API where it has one (2.9+: the legacy
    ``allow_tf32`` flags map onto it, and mixing the two is an error when read back)."""
    backends = torch.backends
    rnn = getattr(backends.cudnn, "rnn", None)
    if rnn is not None and hasattr(rnn, "fp32_precision"):
        mode = "tf32" if allowed else "ieee"
        backends.cuda.matmul.fp32_precision = mode
        rnn.fp32_precision = mode
        return {
            "cuda.matmul.fp32_precision": backends.cuda.matmul.fp32_precision,
            "cudnn.rnn.fp32_precision": rnn.fp32_precision,
        }
    backends.cuda.matmul.allow_tf32 = allowed
    backends.cudnn.allow_tf32 = allowed
    return {
        "cuda.matmul.allow_tf32": backends.cuda.matmul.allow_tf32,
        "cudnn.allow_tf32": backends.cudnn.allow_tf32,
    }


def torch_step(
    cell_name: str,
    params,
    xs,
    labels,
    *,
    dtype: str = "float32",
    tf32: bool = False,
    device: str = "cuda",
):
    """The torch peer's train step (see the module docstring): ``step()`` -> the loss (a
    detached 0-d tensor). Gradients set to None before each step; ``tf32`` set before every
    step (the peers alternate); on a CUDA device the step ends with a synchronize."""
    import torch

    _, _, sd = torch_weights(cell_name, params)
    m, n = xs.shape[-1], sd["weight_hh_l0"].shape[-1]
    kernel, bias = np.asarray(params["out"]["kernel"]), np.asarray(params["out"]["bias"])
    rnn = (torch.nn.LSTM if cell_name == "lstm" else torch.nn.GRU)(m, n)
    rnn.load_state_dict({k: torch.from_numpy(np.array(v, np.float32)) for k, v in sd.items()})
    linear = torch.nn.Linear(n, kernel.shape[1])
    linear.load_state_dict(
        {
            "weight": torch.from_numpy(np.array(kernel.T, np.float32)),
            "bias": torch.from_numpy(np.array(bias, np.float32)),
        }
    )
    tdtype = getattr(torch, dtype)
    rnn.to(device=device, dtype=tdtype)
    linear.to(device=device, dtype=tdtype)
    x = torch.from_numpy(np.array(xs, np.float32)).to(device=device, dtype=tdtype)
    y = torch.from_numpy(np.array(labels, np.int64)).to(device=device)
    weights = [*rnn.parameters(), *linear.parameters()]
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    cross_entropy = torch.nn.functional.cross_entropy

    def step():
        _set_tf32(torch, tf32)
        for w in weights:
            w.grad = None
        ys, _ = rnn(x)
        loss = cross_entropy(linear(ys[-1]).float(), y)
        loss.backward()
        sync()
        return loss.detach()

    return step


def torch_kernels(step, top: int = 5) -> list[dict]:
    """The ``top`` GPU kernels of one call of ``step`` by their total device time
    (``torch.profiler``): ``[{'name', 'calls', 'ms'}]``, longest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
    torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        newer = hasattr(e, "self_device_time_total")
        us = getattr(e, "self_device_time_total" if newer else "self_cuda_time_total", 0)
        if us > 0:
            rows.append({"name": str(e.key)[:160], "calls": int(e.count), "ms": us / 1e3})
    return sorted(rows, key=lambda r: -r["ms"])[:top]


def _loss_check(loss: float, against: str, value: float, rtol: float) -> dict:
    ok = bool(np.isfinite(loss) and np.isclose(loss, value, rtol=rtol, atol=0))
    return {"against": against, "rtol": rtol, "ok": ok}


def bench(
    cell_name: str,
    name: str,
    c: dict,
    *,
    rounds: int,
    repeats: int,
    bfloat16: bool = False,
    unrolls=(),
    pallas: bool = False,
    torch_device: str | None = None,
    profile_into: list | None = None,
) -> dict:
    """Times rhnzoo's train step (value and grad) against its peers on shape ``c``
    (``unrolls``: extra fused candidates ``rhnzoo_u{k}``; ``pallas``: the persistent
    Pallas kernel where it can run; ``torch_device``: the torch peers on that device, None:
    none). ``profile_into``: a list that gets ``(cell, config, peer, step)`` for every
    torch peer timed (for :func:`torch_kernels` after all timings)."""
    m, n, C = c["input"], c["hidden"], c["classes"]
    backend = jax.default_backend()
    cell, params, xs, labels = problem(cell_name, c)
    ours = lambda **kw: loss_of(functools.partial(rhnzoo_logits, cell, **kw))
    steps = {"rhnzoo": (ours(), params), "reference": (ours(scan_impl="reference"), params)}
    if bfloat16:
        steps["rhnzoo_bf16"] = (ours(dtype=jnp.bfloat16), params)
    for k in unrolls:
        steps[f"rhnzoo_u{k}"] = (ours(unroll=k), params)
    peer = "reference"
    if cell_name == "lstm":
        model = FlaxLSTMClassifier(n, C)
        steps["flax"] = (loss_of(model.apply), flax_params(params, n))
        peer = "flax"
        if backend == "gpu":
            steps["jax_cudnn"] = (
                loss_of(functools.partial(cudnn_logits, m, n)),
                {"lstm": cudnn_weights(params, m, n), "out": params["out"]},
            )
    elif cell_name in ("gru", "gru_ra"):
        model = FlaxGRUClassifier(n, C)
        steps["flax"] = (loss_of(model.apply), model.init(jax.random.PRNGKey(1), xs))
        peer = "flax"
    losses = {k: float(f(p, xs, labels)[0]) for k, (f, p) in steps.items()}
    same = [
        k
        for k in losses
        if k not in ("rhnzoo_bf16", "jax_cudnn")
        and not (k == "flax" and cell_name in ("gru", "gru_ra"))
    ]
    # cuDNN's own reduction order, and under TF32 its own rounding (2.4 % off XLA's TF32
    # loss at the IMDB shape on an H100, where XLA's paths agreed to 2e-6)
    near = [losses.get("jax_cudnn", losses["rhnzoo"])]
    cudnn_fp32 = precision.cudnn_rnn() == jax.lax.Precision.HIGHEST
    near_rtol = 1e-3 if cudnn_fp32 else 5e-2
    if not (
        np.allclose([losses[k] for k in same], losses["rhnzoo"], rtol=1e-4)
        and np.allclose(near, losses["rhnzoo"], rtol=near_rtol)
    ):
        raise AssertionError(f"{cell_name} {name}: the losses differ: {losses}")
    fns = {k: functools.partial(f, p, xs, labels) for k, (f, p) in steps.items()}
    level = jax_precision(backend)
    precisions = {k: "bf16" if k == "rhnzoo_bf16" else level for k in steps}
    if "jax_cudnn" in steps:
        precisions["jax_cudnn"] = "fp32" if cudnn_fp32 else "tf32"
    skipped, checks, extra = {}, {}, {}
    torch_module = None

    def skip(what, why):
        skipped[what] = why
        logging.warning("bench.rnn %s %s: %s skipped: %s", cell_name, name, what, why)

    if pallas:
        why = pallas_skip_reason(cell, backend)
        if why is None:
            extra["pallas_fits"] = _pallas_fits(cell, c)
            try:
                f = ours(scan_impl="pallas", dtype=jnp.bfloat16)
                losses["pallas"] = float(f(params, xs, labels)[0])
            except Exception as e:  # noqa: BLE001 - a kernel that fails to build or run
                why = f"failed: {_one_line(e)}"
            else:
                fns["pallas"] = functools.partial(f, params, xs, labels)
                precisions["pallas"] = "bf16"
                checks["pallas"] = _loss_check(
                    losses["pallas"], "rhnzoo", losses["rhnzoo"], PALLAS_RTOL
                )
        if why is not None:
            skip("pallas", why)
    if torch_device is not None:
        why = torch_skip_reason(cell_name, torch_device)
        if why is None:
            torch_module, _ = _import_torch()
            try:
                losses["torch_function_fp32"] = torch_function_loss(cell_name, params, xs, labels)
            except Exception as e:  # noqa: BLE001 - the peers are still timed, unchecked
                logging.warning(
                    "bench.rnn %s %s: no loss to check the torch peers against: %s",
                    cell_name,
                    name,
                    _one_line(e),
                )
            for peer_name, (dtype, tf32) in TORCH_PEERS.items():
                try:
                    step = torch_step(
                        cell_name, params, xs, labels, dtype=dtype, tf32=tf32, device=torch_device
                    )
                    losses[peer_name] = float(step())  # also the warm-up
                except Exception as e:  # noqa: BLE001 - e.g. a cuDNN that does not load
                    skip(peer_name, f"failed: {_one_line(e)}")
                    continue
                fns[peer_name] = step
                precisions[peer_name] = {
                    "float32": "tf32" if tf32 else "fp32",
                    "bfloat16": "bf16",
                    "float16": "fp16",
                }[dtype]
                if "torch_function_fp32" in losses:
                    checks[peer_name] = _loss_check(
                        losses[peer_name],
                        "torch_function_fp32",
                        losses["torch_function_fp32"],
                        TORCH_RTOL[peer_name],
                    )
                if profile_into is not None:
                    profile_into.append((cell_name, name, peer_name, step))
            extra["torch_settings"] = {
                p: _set_tf32(torch_module, tf)
                for p, (dt, tf) in TORCH_PEERS.items()
                if p in fns and dt == "float32"
            }
            extra["torch_device"] = torch_device
        else:
            for peer_name in TORCH_PEERS:
                skip(peer_name, why)
    bad = sorted(k for k, v in checks.items() if not v["ok"])
    if bad:
        logging.warning(
            "bench.rnn %s %s: loss check failed for %s (timed all the same): %s",
            cell_name,
            name,
            bad,
            losses,
        )

    timed = alternate(
        fns,
        rounds=rounds,
        repeats=repeats,
        warmup=False,  # the loss checks above compiled and ran every step once
    )
    s = {k: {"min": v["min"], "median": v["median"]} for k, v in timed["seconds"].items()}
    ratio = functools.partial(ratios, timed["seconds"])
    out = {
        "cell": cell_name,
        "config": name,
        "device": str(jax.devices()[0].device_kind),
        "backend": backend,
        "matmul_precision": precision.current(),
        **c,
        "losses": losses,
        "seconds": s,
        "peer": peer,
        f"ratio_{peer}_over_rhnzoo": ratio(peer, "rhnzoo"),
        "peak_flops_per_s": {k: timed["peak_flops_per_s"][k] for k in ("max", "min")},
        "rounds": rounds,
        "repeats": repeats,
    }
    if peer != "reference":
        out["ratio_reference_over_rhnzoo"] = ratio("reference", "rhnzoo")
    if bfloat16:
        out[f"ratio_{peer}_over_rhnzoo_bf16"] = ratio(peer, "rhnzoo_bf16")
    if "jax_cudnn" in steps:
        out["ratio_jax_cudnn_over_rhnzoo"] = ratio("jax_cudnn", "rhnzoo")
    for k in unrolls:
        out[f"ratio_rhnzoo_u{k}_over_rhnzoo"] = ratio(f"rhnzoo_u{k}", "rhnzoo")
    torch_timed = [k for k in TORCH_PEERS if k in fns]
    for k in torch_timed:  # peer / candidate at (about) the same precision, and across
        out[f"ratio_{k}_over_rhnzoo"] = ratio(k, "rhnzoo")
        if bfloat16 and k in ("torch_bf16", "torch_fp16"):
            out[f"ratio_{k}_over_rhnzoo_bf16"] = ratio(k, "rhnzoo_bf16")
    if "pallas" in fns:
        for k in (peer, "rhnzoo", "rhnzoo_bf16", *torch_timed):
            if k in fns:
                out[f"ratio_{k}_over_pallas"] = ratio(k, "pallas")
    out.update(precisions=precisions, commit=git_commit(), versions=versions(torch_module))
    if pallas or torch_device is not None:
        out.update(skipped=skipped, loss_checks=checks, **extra)
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
    if FLAGS.torch and not FLAGS.torch_device.strip():
        raise SystemExit("error: --torch_device must name a device (cuda, cuda:0, cpu)")
    torch_device = FLAGS.torch_device.strip() if FLAGS.torch else None
    profiled = [] if FLAGS.torch and FLAGS.torch_profile else None
    for cell_name in FLAGS.cells:
        for name in FLAGS.configs:
            with precision.context(FLAGS.matmul_precision):
                result = bench(
                    cell_name,
                    name,
                    CONFIGS[name],
                    rounds=FLAGS.rounds,
                    repeats=FLAGS.repeats,
                    bfloat16=FLAGS.bfloat16,
                    unrolls=unrolls,
                    pallas=FLAGS.pallas,
                    torch_device=torch_device,
                    profile_into=profiled,
                )
            print(json.dumps(result), flush=True)
    for cell_name, name, peer_name, step in profiled or ():  # after every timing: the
        # profiler may leave the process slower
        record = {
            "record": "torch_kernels",
            "cell": cell_name,
            "config": name,
            "candidate": peer_name,
            "commit": git_commit(),
        }
        try:
            record["kernels"] = torch_kernels(step)
        except Exception as e:  # noqa: BLE001 - no CUPTI, a CPU device, ...
            record["error"] = _one_line(e)
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    define_flags()
    app.run(main)
