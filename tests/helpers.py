"""Shared test helpers (imported by test modules as ``helpers``)."""

import functools
import gzip
import io
import os
import pathlib
import struct
import subprocess
import sys
import tarfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent"))


def run_script(script: str, *args: str, timeout: float = 300, cwd=ROOT):
    """``experiments/<script>`` as a user runs it, from the checkout (``cwd``), its output
    captured (``subprocess.CompletedProcess``)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def needs_data(subdir: str, *files: str, what: str):
    """Skip unless ``$RHNZOO_DATA/<subdir>`` holds ``files`` (the real ``what`` files)."""
    directory = DATA / subdir
    return pytest.mark.skipif(
        not all((directory / f).is_file() for f in files),
        reason=f"real {what} files not found in {directory} (set RHNZOO_DATA)",
    )


KEY = jax.ShapeDtypeStruct((2,), jnp.uint32)  # a raw PRNG key's shape, for jax.eval_shape


def rng_of(seed) -> np.random.Generator:
    """A NumPy generator from ``seed``: an int, a ``jax.random`` key (its key data, raw
    or typed) or a generator itself (returned as is)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, (int, np.integer)):
        return np.random.default_rng(int(seed))
    if jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
        seed = jax.random.key_data(seed)
    return np.random.default_rng(np.asarray(seed, np.uint32).ravel().tolist())


def as_jax(a, dtype=None):
    """``a`` (NumPy) as a jax array of ``dtype`` (None: its own), converted on the host (a
    ``jnp.asarray(a, dtype)`` with another dtype compiles a conversion program)."""
    return jnp.asarray(np.asarray(a, None if dtype is None else np.dtype(dtype)))


def normal(seed, shape, dtype=jnp.float32, scale=1.0):
    """``scale`` times standard normal numbers of ``shape`` and ``dtype``, drawn with
    NumPy (:func:`rng_of` ``seed``): no program is compiled for a draw."""
    return as_jax(scale * rng_of(seed).standard_normal(shape), dtype)


def dropout_mask(seed, shape, keep, dtype=jnp.float32):
    """A variational dropout mask (1 / keep where kept, probability ``keep``, else 0),
    drawn with NumPy."""
    return as_jax((rng_of(seed).random(shape) < keep) / keep, dtype)


def shapes(init, *args):
    """The ``jax.ShapeDtypeStruct`` tree of ``init(key, *args)`` (a cell's or a model's
    ``init``): its parameters' shapes, nothing computed."""
    return jax.eval_shape(lambda key: init(key, *args), KEY)


def filled(structs, value=0.0):
    """Arrays of ``structs``' shapes and dtypes (a tree of arrays or ``ShapeDtypeStruct``)
    filled with ``value``, made on the host (nothing compiled)."""
    return jax.tree.map(lambda s: as_jax(np.full(s.shape, value), s.dtype), structs)


def random_params(params, seed, scale=0.5):
    """Every leaf of ``params`` (arrays or :func:`shapes`' structs: only shapes and dtypes
    are read) replaced by ``scale`` times standard normal numbers (NumPy, :func:`rng_of`
    ``seed``), so biases and gates are not at their init."""
    rng = rng_of(seed)
    return jax.tree.map(lambda l: normal(rng, l.shape, l.dtype, scale), params)


def random_problem(cell, *, T, B, m, n, dtype, seed=0):
    """``(params, carry, xs [T, B, m], mask [B, n], target [T, B, n])`` for a scan test:
    random (not initial) parameters and carry, inputs, a dropout mask (keep 0.8, scaled)
    and a target; an integer carry leaf (the SC-LSTM step counter) a random phase per row.
    Drawn with NumPy, the shapes from ``jax.eval_shape``: nothing compiled."""
    rng = rng_of(seed)
    params = jax.tree.map(lambda l: normal(rng, l.shape, dtype, 0.5), shapes(cell.init, m))
    xs = normal(rng, (T, B, m), dtype)

    def rand(a):
        if jnp.issubdtype(a.dtype, jnp.integer):
            return as_jax(rng.integers(0, 5, a.shape), a.dtype)
        return normal(rng, a.shape, dtype, 0.5)

    carry = jax.tree.map(rand, jax.eval_shape(lambda: cell.initial_carry(B, dtype)))
    mask = dropout_mask(rng, (B, n), 0.8, dtype)
    return params, carry, xs, mask, normal(rng, (T, B, n), dtype)


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


def write_random_mnist(directory: pathlib.Path, train: int, test: int, seed: int = 0):
    """MNIST idx files of random 28 x 28 images and labels 0-9 (``train`` / ``test`` of
    each) in ``directory``; returns it."""
    rng = np.random.default_rng(seed)
    write_mnist(
        directory,
        {
            "train-images-idx3-ubyte.gz": rng.integers(0, 256, (train, 28, 28), dtype=np.uint8),
            "train-labels-idx1-ubyte.gz": rng.integers(0, 10, train).astype(np.uint8),
            "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (test, 28, 28), dtype=np.uint8),
            "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, test).astype(np.uint8),
        },
    )
    return directory


def write_files(directory: pathlib.Path, contents) -> pathlib.Path:
    """Writes ``contents`` (file name -> text, UTF-8) into ``directory`` (created); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def simple_examples_tgz(contents) -> bytes:
    """A gzipped tar of ``./simple-examples/data/<name>`` members (name -> text), the layout
    of Mikolov's archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in contents.items():
            payload = text.encode("utf-8")
            info = tarfile.TarInfo(f"./simple-examples/data/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def fake_fetch(monkeypatch, payload: bytes) -> list:
    """Replaces ``rhnzoo.data.common.fetch`` by one that writes ``payload`` to the
    destination; returns the list it appends each requested URL to."""
    from rhnzoo.data import common

    urls = []

    def fetch(url, dest, timeout=60.0):
        urls.append(url)
        pathlib.Path(dest).write_bytes(payload)

    monkeypatch.setattr(common, "fetch", fetch)
    return urls


def unroll_loss(cell, xs, mask, target):
    """``params -> Σ (ys - target)²`` of ``cell`` unrolled over ``xs`` from the zero carry
    with recurrent dropout ``mask`` (float64 under ``jax.enable_x64``), jit-compiled."""
    from rhnzoo import cells

    @jax.jit
    def loss(p):
        _, ys = cells.unroll(cell, p, cell.initial_carry(xs.shape[1], jnp.float64), xs, mask)
        return jnp.sum((ys - target) ** 2)

    return loss


def check_gradient_by_finite_differences(loss, params, *, directions=4, seed=0, eps=1e-6):
    """``jax.grad(loss)`` against central differences along random directions in parameter
    space (float64: call under ``jax.enable_x64(True)`` with float64 params)."""
    grads = jax.grad(loss)(params)
    flat, unravel = ravel_pytree(params)
    g_flat, _ = ravel_pytree(grads)
    assert g_flat.dtype == jnp.float64
    rng = np.random.default_rng(seed)
    for _ in range(directions):
        d = rng.standard_normal(flat.shape)
        fd = (loss(unravel(flat + eps * d)) - loss(unravel(flat - eps * d))) / (2 * eps)
        np.testing.assert_allclose(float(g_flat @ d), float(fd), rtol=1e-6, atol=1e-8)


def check_unroll_gradient(cell, input_size=3):
    """`check_gradient_by_finite_differences` (5 directions, float64) of `unroll_loss` for
    `cell` (hidden size ``cell.hidden_size``) at random parameters, over 4 steps of a batch
    of 2 random inputs with a recurrent dropout mask (keep 0.8)."""
    n = cell.hidden_size
    with jax.enable_x64(True):
        rng = rng_of(1)
        params = jax.tree.map(
            lambda l: normal(rng, l.shape, jnp.float64, 0.5), shapes(cell.init, input_size)
        )
        xs = normal(2, (4, 2, input_size), jnp.float64)
        mask = dropout_mask(3, (2, n), 0.8, jnp.float64)
        target = normal(4, (4, 2, n), jnp.float64)

        check_gradient_by_finite_differences(
            unroll_loss(cell, xs, mask, target), params, directions=5
        )


def scan_by_hand(cell, params, xs):
    """A user's own jitted ``lax.scan`` of ``cell.step`` over ``cell.project_inputs(xs)``
    from ``cell.initial_carry(B)``, nothing else from rhnzoo: ``(carry, ys)``."""

    @jax.jit
    def run(params, xs):
        x_proj = cell.project_inputs(params, xs)
        carry = cell.initial_carry(xs.shape[1])
        return jax.lax.scan(functools.partial(cell.step, params), carry, x_proj)

    return run(params, xs)
