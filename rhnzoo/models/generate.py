"""Step-wise inference and text generation with a trained language model.

Built on :meth:`rhnzoo.models.lm.LanguageModel.step` (the training model's own cell code,
one time step at a time) and :meth:`~rhnzoo.models.lm.LanguageModel.forward` (the
teacher-forced window): a prompt is read in one window (:func:`prime`), then tokens are
drawn one at a time inside a ``jax.lax.scan`` (:func:`decode`), greedily or by sampling
with a temperature and a top-k cut::

    model = lm.rhn_language_model(50, 64, 3)
    params = model.init(jax.random.PRNGKey(0))
    prompt = jnp.zeros((2, 5), jnp.int32)                     # [B, P] token ids
    tokens = generate.generate(model, params, prompt, 20, key=jax.random.PRNGKey(1),
                               temperature=0.8, top_k=10)      # [B, 20] int32

Everything here is a pure function of its arguments: the random draws come from the key
passed in (token i of a decode drawn with ``jax.random.fold_in(key, i)``, so decoding
in chunks gives the same tokens as decoding at once), nothing is kept between calls.
:func:`encode` and :func:`render` map text to token ids and back with a corpus's
vocabulary (``rhnzoo.data.Corpus.vocab``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rhnzoo.models.lm import LanguageModel, check_token_ids

Array = jax.Array
Params = Any

# The symbol a word-level vocabulary ends a sentence with (rhnzoo.data.ptb.EOS).
WORD_EOS = "<eos>"


class State(NamedTuple):
    """What decoding carries from one token to the next.

    Attributes:
      carry: the model's recurrent carry (leaves ``[B, ...]``).
      logits: ``[B, V]`` the next token's logits (float32; float64 under x64).
      position: int32 scalar, the number of tokens decoded so far (the index of the
        next token's key, ``jax.random.fold_in(key, position)``).
    """

    carry: Any
    logits: Array
    position: Array


def initial_carry(model: LanguageModel, params: Params, batch_size: int) -> Any:
    """The model's zero carry for ``batch_size`` rows, its floating leaves in the
    parameters' dtype (float64 parameters under ``jax.enable_x64``: a float64 carry)."""
    dtype = jax.tree.leaves(params)[0].dtype
    cast = lambda c: c.astype(dtype) if jnp.issubdtype(c.dtype, jnp.floating) else c
    return jax.tree.map(cast, model.initial_carry(batch_size))


def _check_tokens(tokens: Array, what: str) -> None:
    shape = np.shape(tokens)  # an array, a tracer or a list
    if len(shape) != 2 or shape[1] < 1:
        raise ValueError(f"{what} must be token ids [B, P] with P >= 1, got {shape}")
    if not jnp.issubdtype(jnp.asarray(tokens).dtype, jnp.integer):
        raise ValueError(f"{what} must be integer token ids, got {jnp.asarray(tokens).dtype}")


def prime(model: LanguageModel, params: Params, prompt: Array, carry: Any = None) -> State:
    """Reads ``prompt`` in one teacher-forced window (:meth:`LanguageModel.forward`).

    Args:
      model, params: the language model and its parameters.
      prompt: ``[B, P]`` int token ids, P >= 1, ids in ``[0, V)``: checked where the
        prompt is concrete; under a caller's ``jit`` JAX's indexing reads an id >= V as
        V - 1, an id in [-V, 0) as id + V (it wraps), an id below -V as 0
        (:func:`~rhnzoo.models.lm.check_token_ids`).
      carry: the carry before the prompt (None: :func:`initial_carry`).

    Returns:
      The :class:`State` after the prompt: its carry, the logits of the token after it,
      position 0.

    Raises:
      ValueError: (one line) a prompt that is not ``[B, P]`` integer ids with P >= 1, or
        a concrete one with an id outside ``[0, V)``.
    """
    _check_tokens(prompt, "prompt")
    check_token_ids(prompt, model.vocab_size, "prompt")
    prompt = jnp.asarray(prompt, jnp.int32)
    if carry is None:
        carry = initial_carry(model, params, prompt.shape[0])
    return _prime(model, params, carry, prompt)


@functools.partial(jax.jit, static_argnames="model")
def _prime(model, params, carry, prompt):  # jit: a state of committed arrays, as decode's
    logits, carry = model.forward(params, carry, prompt)
    return State(carry, logits[:, -1], jnp.zeros((), jnp.int32))


def pick(
    logits: Array,
    key: Array | None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
) -> Array:
    """The next token of each row from its logits ``[B, V]``: ``[B]`` int32.

    ``greedy``: the argmax (``key`` unused, may be None). Otherwise a draw from
    ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits (None:
    all V; ties with the k-th largest stay in), with ``key``.

    Raises:
      ValueError: ``temperature`` <= 0 or ``top_k`` outside ``[1, V]`` when sampling;
        sampling without a key.
    """
    if greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    _check_sampling(logits.shape[-1], temperature, top_k, key)
    logits = logits.astype(jnp.float32) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def _check_sampling(vocab: int, temperature: float, top_k: int | None, key: Any) -> None:
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    if top_k is not None and not (isinstance(top_k, int) and 1 <= top_k <= vocab):
        raise ValueError(
            f"top_k must be an integer in [1, {vocab}] (the vocabulary), got {top_k!r}"
        )
    if key is None:
        raise ValueError("sampling needs a key (jax.random.PRNGKey(seed)); or greedy=True")


@functools.partial(
    jax.jit, static_argnames=("model", "num_tokens", "temperature", "top_k", "greedy")
)
def _decode(model, params, state, key, num_tokens, temperature, top_k, greedy):
    def body(state: State, _):
        k = None if greedy else jax.random.fold_in(key, state.position)
        token = pick(state.logits, k, temperature=temperature, top_k=top_k, greedy=greedy)
        logits, carry = model.step(params, state.carry, token)
        return State(carry, logits, state.position + 1), token

    state, tokens = jax.lax.scan(body, state, None, length=num_tokens)
    return tokens.T, state


def decode(
    model: LanguageModel,
    params: Params,
    state: State,
    num_tokens: int,
    *,
    key: Array | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
) -> tuple[Array, State]:
    """Draws ``num_tokens`` tokens after ``state``, one :meth:`LanguageModel.step` per
    token, in one jit-compiled ``jax.lax.scan``.

    Args:
      model, params: the language model and its parameters.
      state: from :func:`prime` or a previous :func:`decode` (which continues it).
      num_tokens: how many tokens (>= 1).
      key: PRNG key of the draws (sampling); token ``state.position + i`` is drawn with
        ``jax.random.fold_in(key, state.position + i)``, so one key over several calls
        gives the tokens of a single call. Unused with ``greedy``.
      temperature, top_k, greedy: as :func:`pick`.

    Returns:
      ``(tokens [B, num_tokens] int32, state)``: the tokens and the state after them.

    Raises:
      ValueError: ``num_tokens`` < 1, or :func:`pick`'s errors.
    """
    if not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be an integer >= 1, got {num_tokens!r}")
    if not greedy:
        _check_sampling(model.vocab_size, temperature, top_k, key)
        temperature = float(temperature)
    else:
        temperature, top_k, key = 1.0, None, jax.random.PRNGKey(0)
    return _decode(model, params, state, key, num_tokens, temperature, top_k, greedy)


def generate(
    model: LanguageModel, params: Params, prompt: Array, num_tokens: int, **options: Any
) -> Array:
    """``num_tokens`` tokens after ``prompt [B, P]`` int: :func:`prime` then :func:`decode`
    (``options``: ``key``, ``temperature``, ``top_k``, ``greedy``, as :func:`pick`).
    Returns ``[B, num_tokens]`` int32.

    Raises:
      ValueError: a bad prompt (:func:`prime`), ``num_tokens`` < 1, ``temperature`` <= 0,
        ``top_k`` outside ``[1, V]``, sampling without a key.
    """
    return decode(model, params, prime(model, params, prompt), num_tokens, **options)[0]


# ----------------------------------------------------------------------------- text


def start_symbol(vocab: Sequence[str]) -> int:
    """The id a prompt-less generation starts from: the end of a sentence (``<eos>`` of a
    word vocabulary, the newline of a character one), else id 0."""
    for symbol in (WORD_EOS, "\n"):
        if symbol in vocab:
            return list(vocab).index(symbol)
    return 0


def encode(text: str, vocab: Sequence[str], *, char_level: bool, space: str = " ") -> np.ndarray:
    """``text`` as ``[P]`` int32 ids of ``vocab``: whitespace-separated words (a newline
    is ``<eos>`` where the vocabulary has it), or characters (``space``: the symbol a
    space is in the vocabulary, ``'_'`` in PTB-char). Empty text: ``[start_symbol]``.

    Raises:
      ValueError: (one line) a word or character that is not in ``vocab``.
    """
    index = {s: i for i, s in enumerate(vocab)}
    if char_level:
        symbols = [space if c == " " else c for c in text]
    else:
        symbols = []
        for i, line in enumerate(text.split("\n")):
            if i and WORD_EOS in index:  # a newline ends a sentence
                symbols.append(WORD_EOS)
            symbols.extend(line.split())
    missing = sorted({s for s in symbols if s not in index})
    if missing:
        what = "characters" if char_level else "words"
        raise ValueError(
            f"the prompt has {what} outside the run's {len(vocab)}-symbol vocabulary: "
            + ", ".join(repr(s) for s in missing[:10])
        )
    ids = [index[s] for s in symbols] or [start_symbol(vocab)]
    return np.asarray(ids, np.int32)


def render(ids: Sequence[int], vocab: Sequence[str], *, char_level: bool, space: str = " ") -> str:
    """Token ids ``[N]`` as text: words joined by spaces (``<eos>`` a newline), or
    characters joined (``space``, e.g. PTB-char's ``'_'``, shown as a space)."""
    symbols = [vocab[int(i)] for i in np.asarray(ids).reshape(-1)]
    if char_level:
        return "".join(" " if s == space else s for s in symbols)
    words = ["\n" if s == WORD_EOS else s for s in symbols]
    return "".join(
        w if i == 0 or "\n" in (w, words[i - 1]) else " " + w for i, w in enumerate(words)
    )
