"""Trained models as serialised ``jax.export`` artifacts that run without rhnzoo.

:func:`export_language_model` writes a language model's window forward
(:meth:`~rhnzoo.models.lm.LanguageModel.forward`) and its one-token step
(:meth:`~rhnzoo.models.lm.LanguageModel.step`); :func:`export_classifier` a sequence
classifier's logits (:meth:`~rhnzoo.models.classifier.SequenceClassifier.logits`). Each
goes into a directory of its own:

* ``<name>.jaxexport``: ``jax.export.export(jax.jit(f), platforms=...)(*shapes).serialize()``
  of each function (StableHLO with its calling convention), the batch (and time) axes
  symbolic, so one artifact takes any batch and window length;
* ``params.npz``: the parameters, flattened (``p0``, ``p1``, ... in ``jax.tree.leaves``
  order), and a language model's initial state of one row (``s0``, ``s1``, ...);
* ``manifest.json``: what each function takes and returns (shapes with ``B``/``T`` for the
  symbolic axes, dtypes), the platforms it was lowered for, the model's description;
* ``exported.py``: a loader that imports only ``jax`` and ``numpy``
  (``exported.load(directory)``), for a process without rhnzoo.

Every function takes the parameters and states as flat lists of arrays (no rhnzoo pytree
classes, which another process could not rebuild)::

    import exported                                  # the artifact's own loader
    model = exported.load("lm_export")
    state = model.initial_state(batch_size=2)        # list of arrays
    logits, state = model.forward(state, tokens)     # tokens [B, T] int32 -> [B, T, V]
    logits, state = model.step(state, tokens[:, 0])  # tokens [B] int32 -> [B, V]

The platforms: ``('cpu', 'cuda', 'tpu')`` where the lowering allows (rhnzoo's reference
and fused scans are plain JAX, which lowers for all three), else ``('cpu',)``, the
manifest's ``platforms_note`` saying why. A model set to the Pallas scan (Mosaic GPU
kernels, one platform) is exported with its fused scan, which computes the same function.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from rhnzoo.cells import scan
from rhnzoo.models.classifier import SequenceClassifier
from rhnzoo.models.lm import LanguageModel

Params = Any
PathLike = str | os.PathLike

FORMAT = "rhnzoo-export/1"
PLATFORMS = ("cpu", "cuda", "tpu")

# The loader written beside each artifact: jax and numpy only.
LOADER = '''"""Loads an rhnzoo export (manifest.json, params.npz, *.jaxexport) with jax and numpy
only: ``model = load(directory)``; ``model.<function>(*inputs)`` for each function of the
manifest (the parameters are passed for you); ``model.initial_state(batch_size)`` for a
language model's state."""

import json
import pathlib

import jax
import numpy as np


class Loaded:
    def __init__(self, directory):
        directory = pathlib.Path(directory)
        self.manifest = json.loads((directory / "manifest.json").read_text())
        arrays = np.load(directory / "params.npz")
        self.params = [arrays[f"p{i}"] for i in range(self.manifest["num_params"])]
        self.state_rows = [arrays[f"s{i}"] for i in range(self.manifest.get("num_state", 0))]
        for name, spec in self.manifest["functions"].items():
            raw = bytearray((directory / spec["file"]).read_bytes())
            call = jax.jit(jax.export.deserialize(raw).call)
            setattr(self, name, self._bind(call))

    def _bind(self, call):
        return lambda *inputs: call(self.params, *inputs)

    def initial_state(self, batch_size):
        """The state before the first token: a list of arrays [batch_size, ...]."""
        return [np.repeat(row, batch_size, axis=0) for row in self.state_rows]


def load(directory):
    return Loaded(directory)
'''


def _spec(shape: Sequence[Any], dtype: Any) -> dict[str, Any]:
    return {"shape": [d if isinstance(d, int) else str(d) for d in shape], "dtype": str(dtype)}


def _portable(model: Any) -> Any:
    """``model`` with a scan every platform lowers: ``auto`` and ``pallas`` resolved to
    the fused or reference scan (the same function)."""
    if model.scan_impl not in ("auto", "pallas"):
        return model
    impl = "fused" if model.scan_impl == "pallas" else model.resolved_scan(None).value
    return dataclasses.replace(model, scan_impl=impl)


def _export(fn: Callable, shapes: Sequence[Any], platforms: Sequence[str]):
    """``(exported, platforms, note)``: ``fn`` exported for ``platforms``, else for the
    CPU alone (``note`` says why; None when the first try lowered)."""
    try:
        return jax_export.export(jax.jit(fn), platforms=tuple(platforms))(*shapes), None
    except Exception as e:  # a lowering rule missing on some platform: CPU alone
        if tuple(platforms) == ("cpu",):
            raise
        why = " ".join(str(e).split())[:300]
        note = f"exported for cpu only: lowering for {', '.join(platforms)} failed ({why})"
        return jax_export.export(jax.jit(fn), platforms=("cpu",))(*shapes), note


def _write(
    directory: PathLike,
    params: Params,
    functions: dict[str, tuple[Callable, Sequence[Any], list, list]],
    description: dict[str, Any],
    platforms: Sequence[str],
    state_rows: Sequence[np.ndarray] = (),
) -> dict[str, Any]:
    directory = pathlib.Path(directory)
    leaves = [np.asarray(a) for a in jax.tree.leaves(params)]
    entries, notes, lowered = {}, [], None
    exported = {}
    for name, (fn, shapes, inputs, outputs) in functions.items():
        exp, note = _export(fn, shapes, platforms)
        notes += [f"{name}: {note}"] * (note is not None)
        exported[name] = exp.serialize()
        lowered = (
            exp.platforms if lowered is None else tuple(p for p in lowered if p in exp.platforms)
        )
        entries[name] = {"file": f"{name}.jaxexport", "inputs": inputs, "outputs": outputs}
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in exported.items():
        (directory / f"{name}.jaxexport").write_bytes(data)
    arrays = {f"p{i}": a for i, a in enumerate(leaves)}
    arrays.update({f"s{i}": np.asarray(a) for i, a in enumerate(state_rows)})
    np.savez(directory / "params.npz", **arrays)
    manifest = {
        "format": FORMAT,
        "model": description,
        "platforms": list(lowered),
        "platforms_note": "; ".join(notes) or None,
        "num_params": len(leaves),
        "num_state": len(state_rows),
        "params": [_spec(a.shape, a.dtype) for a in leaves],
        "functions": entries,
        "jax_version": jax.__version__,
    }
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    (directory / "exported.py").write_text(LOADER)
    return manifest


def _prepare(model: Any, params: Params):
    """``(model, treedef, param shapes, (B, T))``: the portable model, the parameters' tree
    and shapes, the symbolic axes; ValueError for parameters that do not fit the model."""
    expected = jax.eval_shape(model.init, jax.random.PRNGKey(0))
    shapes = lambda tree: jax.tree.map(lambda a: tuple(a.shape), tree)
    if jax.tree.structure(expected) != jax.tree.structure(params) or shapes(expected) != shapes(
        params
    ):
        raise ValueError("the parameters do not have the model's structure and shapes")
    leaves, tree = jax.tree.flatten(params)
    p_shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in leaves]
    return _portable(model), tree, p_shapes, jax_export.symbolic_shape("B, T")


def _about(model: Any, kind: str, description: dict[str, Any] | None, **sizes: Any) -> dict:
    """The manifest's ``model`` entry."""
    return {
        "kind": kind,
        **sizes,
        "hidden_size": model.cell.hidden_size,
        "cell": scan.describe(model.cell),
        "scan_impl": model.scan_impl,
        **(description or {}),
    }


def export_language_model(
    model: LanguageModel,
    params: Params,
    directory: PathLike,
    *,
    platforms: Sequence[str] = PLATFORMS,
    description: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes the language model's ``forward`` and ``step`` into ``directory`` (made if
    missing; files of the same names replaced).

    The exported functions, ``params`` the flat list of ``params.npz`` and ``state`` a
    list of arrays (the carry's leaves, ``[B, ...]``, float32 and for SC-LSTM an int32
    counter; ``initial_state(B)`` of the loader is the model's zero carry):

    * ``forward(params, state, tokens [B, T] int32) -> (logits [B, T, V] float32, state)``
      (:meth:`LanguageModel.forward`, the teacher-forced window);
    * ``step(params, state, tokens [B] int32) -> (logits [B, V] float32, state)``
      (:meth:`LanguageModel.step`).

    B and T are symbolic: any batch and window length.

    Args:
      model: the language model (its scan made portable: ``auto``/``pallas`` become the
        fused or reference scan).
      params: its parameters (the structure of ``model.init``).
      directory: where the artifact goes.
      platforms: the platforms to lower for (``jax.export`` names: ``'cpu'``,
        ``'cuda'``, ``'rocm'``, ``'tpu'``); if that fails, the CPU alone (the manifest's
        ``platforms_note`` says why).
      description: extra entries of the manifest's ``model`` (e.g. the run's vocabulary
        size and data set).

    Returns:
      The manifest (also ``manifest.json``).

    Raises:
      ValueError: parameters that do not fit the model.
    """
    model, tree, p_shapes, (b, t) = _prepare(model, params)
    state_rows, state_tree = jax.tree.flatten(model.initial_carry(1))
    s_shapes = [jax.ShapeDtypeStruct((b,) + a.shape[1:], a.dtype) for a in state_rows]
    state = {"name": "state", "leaves": [_spec(["B", *a.shape[1:]], a.dtype) for a in state_rows]}
    V = model.vocab_size

    def flat(method):  # parameters and state as flat lists of arrays
        def fn(p, s, tokens):
            carry = jax.tree.unflatten(state_tree, s)
            logits, carry = method(jax.tree.unflatten(tree, p), carry, tokens)
            return logits, jax.tree.leaves(carry)

        return fn

    functions = {
        name: (
            flat(getattr(model, name)),
            (p_shapes, s_shapes, jax.ShapeDtypeStruct(token_shape, jnp.int32)),
            [state, {"name": "tokens", **_spec(axes, "int32")}],
            [{"name": "logits", **_spec([*axes, V], "float32")}, {"name": "state"}],
        )
        for name, token_shape, axes in (("forward", (b, t), "BT"), ("step", (b,), "B"))
    }
    about = _about(model, "language_model", description, vocab_size=V)
    return _write(directory, params, functions, about, platforms, state_rows)


def export_classifier(
    model: SequenceClassifier,
    params: Params,
    directory: PathLike,
    *,
    platforms: Sequence[str] = PLATFORMS,
    description: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes the sequence classifier's ``logits`` (no dropout) into ``directory``:
    ``logits(params, inputs, lengths [B] int32) -> [B, C] float32``, ``inputs`` ``[B, T]``
    int32 token ids (a model with ``vocab_size``) or ``[B, T, m]`` float32 features; B
    and T symbolic. Arguments, return and errors as :func:`export_language_model`'s."""
    model, tree, p_shapes, (b, t) = _prepare(model, params)
    if model.vocab_size is not None:
        x_shape, x_spec = jax.ShapeDtypeStruct((b, t), jnp.int32), _spec("BT", "int32")
    else:
        m = model.input_size
        x_shape = jax.ShapeDtypeStruct((b, t, m), jnp.float32)
        x_spec = _spec(["B", "T", m], "float32")

    def logits(p, inputs, lengths):
        return model.logits(jax.tree.unflatten(tree, p), inputs, lengths)

    functions = {
        "logits": (
            logits,
            (p_shapes, x_shape, jax.ShapeDtypeStruct((b,), jnp.int32)),
            [{"name": "inputs", **x_spec}, {"name": "lengths", **_spec("B", "int32")}],
            [{"name": "logits", **_spec(["B", model.num_classes], "float32")}],
        )
    }
    about = _about(
        model,
        "sequence_classifier",
        description,
        num_classes=model.num_classes,
        vocab_size=model.vocab_size,
        input_size=model.input_size,
    )
    return _write(directory, params, functions, about, platforms)
