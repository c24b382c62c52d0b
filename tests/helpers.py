"""Shared test helpers (imported by test modules as ``helpers``)."""

import gzip
import pathlib
import struct

import jax
import numpy as np


def random_params(params, key, scale=0.5):
    """Replaces every leaf by random values, so biases and gates are not at their init."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(
        tree, [jax.random.normal(k, l.shape, l.dtype) * scale for k, l in zip(keys, leaves)]
    )


def np_tree(t):
    """The pytree as float64 NumPy arrays (for NumPy transcriptions of the equations)."""
    return jax.tree.map(lambda a: np.asarray(a, np.float64), t)


def idx_bytes(array: np.ndarray) -> bytes:
    """The idx encoding written independently of the reader: struct '>I' fields."""
    header = struct.pack(">I", 0x0800 | array.ndim) + b"".join(
        struct.pack(">I", d) for d in array.shape
    )
    return header + np.ascontiguousarray(array, np.uint8).tobytes()


def write_mnist(directory: pathlib.Path, arrays) -> dict[str, bytes]:
    directory.mkdir(parents=True, exist_ok=True)
    payloads = {name: gzip.compress(idx_bytes(a)) for name, a in arrays.items()}
    for name, payload in payloads.items():
        (directory / name).write_bytes(payload)
    return payloads
