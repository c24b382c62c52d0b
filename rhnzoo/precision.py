"""The matmul precision policy: what a float32 matmul computes, chosen in one place.

JAX computes float32 matmuls and convolutions at the precision of
``jax.default_matmul_precision`` (read from ``JAX_DEFAULT_MATMUL_PRECISION`` when JAX
starts). Unset, each backend runs its fastest, which is full float32 only on the CPU: on
an NVIDIA GPU ``default`` and ``high`` take TensorFloat-32 inputs (11 significant bits), on
a TPU 1, 3 or 6 bfloat16 passes; docs/speed.md ("Matmul precision") has the table.

rhnzoo sets no precision of its own: no matmul passes ``precision=`` (the fused scans'
:func:`rhnzoo.cells.fastmath.dot` and ``einsum`` included, which choose only the input
dtype), and no library code changes JAX's global config. A run's precision is
``RunSettings.matmul_precision`` (the experiments' ``--matmul_precision``), applied with
:func:`context` around the run's compiled steps and evaluations and recorded in its
``config.json``; the benchmarks record the precision in effect in every line.

Names: ``default``, ``high``, ``highest``, JAX's aliases (``bfloat16`` and ``fastest``
= ``default``; ``tensorfloat32`` and ``bfloat16_3x`` = ``high``; ``float32`` =
``highest``), which :func:`normalize` maps to the level, and the names of
``jax.lax.DotAlgorithmPreset`` (``'TF32_TF32_F32'``...), kept as they are.
"""

from __future__ import annotations

import contextlib

import jax

LEVELS = ("default", "high", "highest")
ALIASES = {
    "fastest": "default",
    "bfloat16": "default",
    "tensorfloat32": "high",
    "bfloat16_3x": "high",
    "float32": "highest",
}


def normalize(name: str) -> str:
    """The precision ``name`` as a level (``'default'``, ``'high'``, ``'highest'``) or a
    ``jax.lax.DotAlgorithmPreset`` name.

    Raises:
      ValueError: for a name JAX does not know (one line).
    """
    if name in LEVELS:
        return name
    if name in ALIASES:
        return ALIASES[name]
    presets = jax.lax.DotAlgorithmPreset.__members__
    if isinstance(name, str) and name != "DEFAULT" and name in presets:
        return name
    raise ValueError(
        f"unknown matmul precision {name!r}: use default, high or highest (JAX also "
        "names them bfloat16, tensorfloat32, float32) or a jax.lax.DotAlgorithmPreset "
        "name"
    )


def current() -> str:
    """The precision in effect here (JAX's setting, normalised; ``'default'`` when unset)."""
    value = jax.config.jax_default_matmul_precision
    return "default" if value is None else normalize(value)


def resolve(name: str | None) -> str:
    """``normalize(name)``, or for None the precision in effect (:func:`current`)."""
    return current() if name is None else normalize(name)


def context(name: str | None) -> contextlib.AbstractContextManager:
    """``jax.default_matmul_precision(normalize(name))``: the precision of the float32
    matmuls traced inside (jit caches compile per precision). ``None``: a no-op, JAX's
    setting stays.

    Raises:
      ValueError: for an unknown ``name``.
    """
    if name is None:
        return contextlib.nullcontext()
    return jax.default_matmul_precision(normalize(name))


def cudnn_rnn(name: str | None = None) -> jax.lax.Precision:
    """The one ``precision=`` that cuDNN's RNN op (``jax.experimental.rnn.lstm``) takes, for
    ``name`` (default: the precision in effect): ``HIGHEST`` (float32 inputs) at
    ``highest`` or the ``F32_F32_F32`` preset, else ``HIGH`` (TensorFloat-32 inputs
    allowed: what ``default`` and ``high`` compute on a GPU). Passed nothing, the op fails
    under ``jax.default_matmul_precision('default')`` (the benchmarks' default): it reads
    ``DEFAULT`` as a bfloat16 request it does not implement (NotImplementedError, JAX
    0.10-0.11).

    Raises:
      ValueError: for an unknown ``name``.
    """
    level = resolve(name)
    full = level == "highest" or level.startswith("F32_F32_F32")
    return jax.lax.Precision.HIGHEST if full else jax.lax.Precision.HIGH
