"""Recurrent language model: embedding -> cell scanned over time -> softmax.

The model of Zilly et al. (2017, sec. 5.2) and Shoham & Permuter: one recurrent
cell (RHN, HSG(RHN), or any cell of :mod:`rhnzoo.cells`), variational dropout at
four sites (:mod:`rhnzoo.dropout`), optional weight tying of the embedding and
the softmax (Press & Wolf 2017; Inan et al. 2017).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rhnzoo import cells, dropout
from rhnzoo.cells import scan
from rhnzoo.cells.base import check_positive

Array = jax.Array
Params = Any


def check_token_ids(ids: Any, vocab_size: int, what: str = "tokens") -> None:
    """Checks token ids (an array of any shape) for a vocabulary of ``vocab_size`` symbols:
    an integer dtype, and every id in ``[0, vocab_size)`` where the ids are concrete.

    Traced ids (under ``jit``, ``vmap``, ``jax.export``) are checked by dtype only, with no
    host transfer; there JAX's indexing decides: a token id >= V reads the embedding row
    V - 1, an id in [-V, 0) row id + V (it wraps), an id below -V row 0; a target id in
    [-V, 0) gives the NLL of target id + V, any other target outside [0, V) a NaN.

    Raises:
      ValueError: (one line) a non-integer dtype, or a concrete id outside ``[0, V)``.
    """
    try:
        values = np.asarray(ids)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        values = None  # traced: the dtype only
    dtype = jnp.result_type(ids) if values is None else values.dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"{what} must be integer token ids, got dtype {dtype}")
    if values is not None and values.size and (values.min() < 0 or values.max() >= vocab_size):
        raise ValueError(
            f"{what} must be ids in [0, {vocab_size}) (the vocabulary), got min "
            f"{values.min()} max {values.max()}"
        )


@dataclasses.dataclass(frozen=True)
class LanguageModel(scan.ScannedModel):
    """Next-token model over a vocabulary of ``vocab_size`` symbols.

    Attributes:
      cell: the recurrent cell (``hidden_size`` n).
      vocab_size: V.
      embed_size: m, the embedding width; must equal n when ``tied``.
      tied: share the embedding ``[V, n]`` as the softmax weights (transposed).
      init_scale: half-width of the uniform initialisation of embedding/softmax.
      unroll: time steps per ``lax.scan`` iteration.
      scan_impl: the time scan, one of :data:`rhnzoo.cells.scan.CHOICES`
        (:func:`rhnzoo.cells.scan.unroll`; default ``'reference'``, plain autodiff, any
        cell). They compute the same function.
      remat: recompute each time step's activations in the backward pass (the
        reference scan and the RHN's fused one).
      dtype: matmul input dtype, ``'float32'`` or ``'bfloat16'`` (float32
        parameters, state and accumulation); bfloat16 needs the fused or pallas scan.
      layer_loop: the RHN fused scan's backend option (:func:`rhnzoo.cells.scan.unroll`'s
        ``layer_loop``): ``'python'``, ``'scan'`` or None (by depth); others ignore it.

    Raises:
      ValueError: (one line) ``vocab_size`` or ``embed_size`` not an integer >= 1, if
        ``tied`` and ``embed_size != cell.hidden_size``, for an unknown
        ``scan_impl``/``dtype``, or a scan the cell does not have with these settings
        (:func:`rhnzoo.cells.scan.resolve`).
    """

    cell: Any
    vocab_size: int
    embed_size: int
    tied: bool = True
    init_scale: float = 0.04
    unroll: int = 1
    scan_impl: str = "reference"
    remat: bool = False
    dtype: str = "float32"
    layer_loop: str | None = None

    def __post_init__(self):
        check_positive("vocab_size", self.vocab_size)
        check_positive("embed_size", self.embed_size)
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        self.resolved_scan()  # an unknown scan_impl, or one this cell does not have: one line
        if self.tied and self.embed_size != self.cell.hidden_size:
            raise ValueError(
                f"weight tying needs embed_size == hidden_size, got {self.embed_size} "
                f"and {self.cell.hidden_size}"
            )

    @property
    def scan_input_size(self) -> int:
        """m, the width of the inputs the scan runs over (:meth:`resolved_scan`)."""
        return self.embed_size

    def init(self, key: Array) -> Params:
        """Returns ``{'embed': [V, m], 'cell': ..., 'softmax_b': [V]}`` (+ ``'softmax_w' [n,
        V]``)."""
        ke, kc, ks = jax.random.split(key, 3)
        u = lambda k, shape: cells.base.uniform(k, shape, self.init_scale)
        params = {
            "embed": u(ke, (self.vocab_size, self.embed_size)),
            "cell": self.cell.init(kc, self.embed_size),
            "softmax_b": u(jax.random.fold_in(ks, 1), (self.vocab_size,)),
        }
        if not self.tied:
            params["softmax_w"] = u(ks, (self.cell.hidden_size, self.vocab_size))
        return params

    def initial_carry(self, batch_size: int) -> Any:
        return self.cell.initial_carry(batch_size)

    def dropout_masks(self, key: Array, tokens: Array, rates: dropout.Rates) -> dict[str, Array]:
        """The variational-dropout masks of a training minibatch ``tokens [B, T]``, drawn
        from ``key`` (:func:`rhnzoo.dropout.lm_masks`; the model knows its own sizes)."""
        return dropout.lm_masks(
            key, tokens, self.vocab_size, self.embed_size, self.cell.hidden_size, rates
        )

    def softmax_weights(self, params: Params) -> Array:
        """``[n, V]``: the softmax matrix (the tied embedding, transposed, if tied)."""
        return params["embed"].T if self.tied else params["softmax_w"]

    def hidden(
        self, params: Params, carry: Any, tokens: Array, masks: dict[str, Array] | None = None
    ) -> tuple[Any, Array]:
        """Runs the cell over ``tokens [B, T]`` int; returns ``(carry, ys [T, B, n])``.

        ``masks`` from :func:`rhnzoo.dropout.lm_masks` (training) or ``None``.

        Raises:
          ValueError: (one line) ``tokens`` not ``[B, T]``, not integer, or concrete ids
            outside ``[0, V)`` (traced ids are not checked: :func:`check_token_ids`).
        """
        if jnp.ndim(tokens) != 2:
            raise ValueError(f"tokens must be [B, T] ids, got shape {list(jnp.shape(tokens))}")
        check_token_ids(tokens, self.vocab_size, "tokens")
        xs = params["embed"][tokens.T]  # [T, B, m]
        if masks is not None:
            xs = xs * (masks["x"].T[..., None] * masks["i"][None])
        mask_h = None if masks is None else masks["h"]
        carry, ys = scan.unroll(
            self.cell,
            params["cell"],
            carry,
            xs,
            mask_h,
            impl=self.scan_impl,
            unroll=self.unroll,
            remat=self.remat,
            dtype=self.dtype,
            layer_loop=self.layer_loop,
        )
        if masks is not None:
            ys = ys * masks["o"][None]
        return carry, ys

    def logits(self, params: Params, ys: Array) -> Array:
        """``ys [..., n] -> [..., V]`` unnormalised log-probabilities: float32 (bfloat16
        matmul inputs with ``dtype='bfloat16'``), or the inputs' own dtype where it is
        wider (float64 parameters under ``jax.enable_x64``)."""
        w = self.softmax_weights(params)
        if self.dtype == "float32":  # the inputs' own precision, float32 or wider
            return jnp.dot(ys, w) + params["softmax_b"]
        logits = jnp.dot(
            ys.astype(self.dtype), w.astype(self.dtype), preferred_element_type=jnp.float32
        )
        return logits + params["softmax_b"]

    def forward(self, params: Params, carry: Any, tokens: Array) -> tuple[Array, Any]:
        """The teacher-forced window forward of evaluation (no dropout): ``tokens [B, T]``
        int -> ``(logits [B, T, V], carry)``, the logits at position t those of the
        token after ``tokens[:, t]``; :meth:`hidden` then :meth:`logits`.

        ``carry`` is :meth:`initial_carry` (B) or a previous call's; float32 logits
        (float64 with float64 parameters under ``jax.enable_x64``).

        Raises:
          ValueError: what :meth:`hidden` raises (bad ``tokens``, concrete ids outside
            ``[0, V)``)."""
        carry, ys = self.hidden(params, carry, tokens)
        return jnp.swapaxes(self.logits(params, ys), 0, 1), carry

    def step(self, params: Params, carry: Any, tokens: Array) -> tuple[Array, Any]:
        """One time step, for generation: ``tokens [B]`` int (the latest token of each row)
        -> ``(logits [B, V], carry)``, the next token's logits and the new carry.

        :meth:`forward` over a window of one step, so stepping through a sequence gives
        the teacher-forced logits of :meth:`forward` at every position. ``carry``:
        :meth:`initial_carry` (B) or the previous step's.

        Raises:
          ValueError: if ``tokens`` is not one-dimensional, or :meth:`hidden`'s errors
            (concrete ids outside ``[0, V)``).
        """
        if jnp.ndim(tokens) != 1:
            raise ValueError(f"step takes tokens [B], got shape {jnp.shape(tokens)}")
        logits, carry = self.forward(params, carry, tokens[:, None])
        return logits[:, 0], carry

    def nll(
        self,
        params: Params,
        carry: Any,
        tokens: Array,
        targets: Array,
        masks: dict[str, Array] | None = None,
        weights: Array | None = None,
        time_chunk: int | None = None,
    ) -> tuple[Array, Any]:
        """Summed negative log-likelihood (nats) of ``targets [B, T]``.

        Args:
          tokens: ``[B, T]`` int input ids in ``[0, V)``.
          targets: ``[B, T]`` int target ids in ``[0, V)`` (:func:`check_token_ids`).
          masks: :func:`rhnzoo.dropout.lm_masks` (training) or None.
          weights: optional ``[B, T]`` float 0/1 weights (padding in evaluation), exactly
            the shape of ``tokens`` (no broadcasting).
          time_chunk: None: the softmax over all ``[T, B, V]`` positions at once; an
            integer c >= 1: summed over time chunks of c steps in a ``lax.scan``, so
            that only ``[c, B, V]`` logits exist at a time (evaluation, see
            :func:`rhnzoo.evaluation.eval_time_chunk`); c must divide T unless c >= T
            (one chunk).

        Returns:
          ``(nll_sum, carry)``: the scalar sum over all B x T positions, and the
          final carry for the next truncated-BPTT window.

        Raises:
          ValueError: (one line, before any computation) ``tokens`` not ``[B, T]``,
            ``targets`` or ``weights`` of another shape, ``time_chunk`` not None or an
            integer >= 1, or one below T that does not divide it; non-integer or concrete
            out-of-range ids (:meth:`hidden`, :func:`check_token_ids`).
        """
        shape = tuple(jnp.shape(tokens))
        if len(shape) != 2:
            raise ValueError(f"tokens must be [B, T] ids, got shape {list(shape)}")
        for name, a in (("targets", targets), ("weights", weights)):
            if a is not None and tuple(jnp.shape(a)) != shape:
                raise ValueError(
                    f"{name} must be [B, T] = {list(shape)} like tokens, got shape "
                    f"{list(jnp.shape(a))}"
                )
        T = shape[1]
        if time_chunk is not None:
            integer = isinstance(time_chunk, (int, np.integer)) and not isinstance(time_chunk, bool)
            if not integer or time_chunk < 1:
                raise ValueError(f"time_chunk must be None or an integer >= 1, got {time_chunk!r}")
            if time_chunk < T and T % time_chunk:
                raise ValueError(f"time_chunk {time_chunk} does not divide the window's {T} steps")
        check_token_ids(targets, self.vocab_size, "targets")
        carry, ys = self.hidden(params, carry, tokens, masks)
        w = None if weights is None else weights.T

        def chunk_nll(y, t, w):  # y [c, B, n], t and w [c, B]
            losses = optax.softmax_cross_entropy_with_integer_labels(self.logits(params, y), t)
            return (losses if w is None else losses * w).sum()

        if time_chunk is None or time_chunk >= T:
            return chunk_nll(ys, targets.T, w), carry
        split = lambda a: a.reshape((T // time_chunk, time_chunk) + a.shape[1:])
        add = lambda total, chunk: (total + chunk_nll(*chunk), None)
        total, _ = jax.lax.scan(
            add, jnp.zeros((), jnp.float32), jax.tree.map(split, (ys, targets.T, w))
        )
        return total, carry


def language_model(
    cell: str,
    vocab_size: int,
    hidden_size: int,
    *,
    hsg: bool = False,
    tied: bool = True,
    init_scale: float = 0.04,
    hsg_init_bias: float = -2.5,
    unroll: int = 1,
    scan_impl: str = "reference",
    remat: bool = False,
    dtype: str = "float32",
    **cell_options: Any,
) -> LanguageModel:
    """A language model over any registered cell (:func:`rhnzoo.cells.make`).

    ``cell`` is a name of :data:`rhnzoo.cells.ALL_NAMES` (``hsg=True`` or an ``hsg_``
    prefix adds the Highway State Gate, with bias ``hsg_init_bias``);
    ``cell_options`` are the cell's own settings (``depth``, ``init_bias``...). The
    embedding width is the hidden size when tied, and otherwise
    ``min(vocab_size, hidden_size)`` (the reference code's rule for character
    vocabularies smaller than the state).

    Raises:
      ValueError: (one line, before any computation) an unknown cell or option, a bad
        option value (:func:`rhnzoo.cells.make`), ``vocab_size`` or ``hidden_size`` not an
        integer >= 1, or :class:`LanguageModel`'s errors.
    """
    check_positive("vocab_size", vocab_size)
    wrapped = hsg or cell.startswith("hsg_")
    extra = {"hsg_init_bias": hsg_init_bias} if wrapped else {}
    rnn = cells.make(cell, hidden_size, hsg=hsg, init_scale=init_scale, **extra, **cell_options)
    embed = hidden_size if tied else min(vocab_size, hidden_size)
    return LanguageModel(
        rnn,
        vocab_size,
        embed,
        tied=tied,
        init_scale=init_scale,
        unroll=unroll,
        scan_impl=scan_impl,
        remat=remat,
        dtype=dtype,
    )


def rhn_language_model(
    vocab_size: int,
    hidden_size: int,
    depth: int,
    *,
    coupled: bool = True,
    init_bias: float = -2.0,
    **options: Any,
) -> LanguageModel:
    """The RHN language model of Zilly et al., optionally with the HSG gate:
    :func:`language_model` with ``cell='rhn'``, recurrence depth ``depth``, the RHN's
    ``coupled`` and T-gate ``init_bias``; ``options`` are :func:`language_model`'s
    (``hsg``, ``tied``, ``init_scale``, ``hsg_init_bias``, ``unroll``, ``scan_impl``,
    ``remat``, ``dtype``), with its defaults.

    Raises:
      ValueError: (one line) if vocab_size, hidden_size or depth is not an integer >= 1,
        or :func:`language_model`'s errors.
    """
    return language_model(
        "rhn",
        vocab_size,
        hidden_size,
        depth=depth,
        coupled=coupled,
        init_bias=init_bias,
        **options,
    )
