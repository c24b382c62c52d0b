"""Word2Vec vectors for initialising an embedding: trained here, or loaded from a file.

Wang & Tian (2016, sec. 4) feed "word embedding vectors pre-trained by Word2Vec
(Mikolov et al., 2013) on Wikipedia"; those vectors were not published. By default
rhnzoo trains Word2Vec itself (gensim, CBOW, on the *training split's* text only, never
dev or test) and caches the vectors under ``${XDG_CACHE_HOME:-~/.cache}/rhnzoo/<data
set>/word2vec/`` (:func:`train_word2vec`). ``--embeddings=PATH`` loads vectors of your
own in either format that the original ``word2vec`` tool writes (and gensim's
``save_word2vec_format``):

* text: a header line ``<count> <dim>`` (optional here, so GloVe files work too),
  then one line per word: ``word v_1 ... v_dim`` separated by spaces;
* binary: the header line, then per word: the word's UTF-8 bytes, one space, ``dim``
  little-endian float32 values, and an optional newline.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import zlib
from collections.abc import Sequence

import numpy as np

from rhnzoo.data.common import DataError, user_cache_dir

# gensim's Word2Vec settings (Mikolov et al. 2013's defaults but CBOW's 5 epochs);
# part of the cache key.
W2V_SETTINGS = dict(sg=0, window=5, negative=5, sample=1e-3, epochs=5, min_count=1)


def _stable_hash(text: str) -> int:
    """Seeds gensim's initial vectors independently of Python's hash randomisation."""
    return zlib.crc32(text.encode("utf-8"))


def train_word2vec(
    docs: Sequence[np.ndarray],
    vocab: Sequence[str],
    dim: int,
    *,
    dataset: str,
    seed: int = 0,
    cache: bool = True,
    log=print,
) -> tuple[np.ndarray, np.ndarray]:
    """Word2Vec vectors of ``vocab`` trained on ``docs`` (token ids), cached.

    One worker thread and a fixed hash make the training deterministic, so the same
    documents, vocabulary, width and seed give the same vectors on any machine; the
    cache file's name is a digest of all of them and :data:`W2V_SETTINGS`.

    Args:
      docs: the training split's documents, ``[T_i]`` int ids into ``vocab`` (rare
        words already ``'<unk>'``; ``'<pad>'``, id 0, never occurs).
      vocab: id -> word.
      dim: vector width (the model's embedding size).
      dataset: the data set's name (the cache directory).
      seed: gensim's seed.
      cache: read / write ``<user cache>/<dataset>/word2vec/<digest>.bin``.
      log: receives one line when vectors are trained or read.

    Returns:
      ``(vectors [V, dim] float32, found [V] bool)`` as :func:`load_word2vec`: every
      word occurring in ``docs`` is found.

    Raises:
      DataError: gensim is not installed, or no document has a word.
    """
    path = cache_path(docs, vocab, dim, dataset=dataset, seed=seed)
    if cache and path.is_file():
        log(f"word2vec: {path} (cached, trained on the training split)")
        return load_word2vec(path, vocab, dim)
    try:
        from gensim.models import Word2Vec
    except ImportError:
        raise DataError(
            "word2vec embeddings need gensim: pip install gensim "
            "(or --embeddings=random to learn them from scratch)"
        ) from None
    sentences = [[vocab[i] for i in doc] for doc in docs if len(doc)]
    if not sentences:
        raise DataError("word2vec: the training split has no words")
    model = Word2Vec(
        sentences, vector_size=dim, seed=seed, workers=1, hashfxn=_stable_hash, **W2V_SETTINGS
    )
    vectors, found = np.zeros((len(vocab), dim), np.float32), np.zeros(len(vocab), bool)
    for i, word in enumerate(vocab):
        if word in model.wv.key_to_index:
            vectors[i], found[i] = model.wv[word], True
    log(
        f"word2vec: trained {dim}-d vectors for {found.sum():,} words on "
        f"{sum(map(len, sentences)):,} training tokens"
    )
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        model.wv.save_word2vec_format(str(tmp), binary=True)
        os.replace(tmp, path)
    return vectors, found


def cache_path(
    docs: Sequence[np.ndarray], vocab: Sequence[str], dim: int, *, dataset: str, seed: int = 0
) -> pathlib.Path:
    """Where :func:`train_word2vec` caches the vectors of these arguments:
    ``<user cache>/<dataset>/word2vec/<dim>d_<digest>.bin``, the digest (16 hex digits)
    of ``dim``, ``seed``, :data:`W2V_SETTINGS`, ``vocab`` and ``docs``."""
    digest = hashlib.sha256(repr((dim, seed, sorted(W2V_SETTINGS.items()))).encode())
    digest.update("\n".join(vocab).encode("utf-8"))
    for doc in docs:
        digest.update(np.asarray(doc, np.int32).tobytes() + b"|")
    return user_cache_dir(dataset) / "word2vec" / f"{dim}d_{digest.hexdigest()[:16]}.bin"


def load_word2vec(
    path: str | os.PathLike, vocab: Sequence[str], dim: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The vectors of ``vocab``'s words found in a word2vec file (text or binary).

    Args:
      path: the file; binary if its name ends with ``.bin``, else text.
      vocab: the model's vocabulary (id -> word).
      dim: the expected vector width (the model's embedding size), or None.

    Returns:
      ``(vectors [V, dim] float32, found [V] bool)``: row i holds word ``vocab[i]``'s
      vector when ``found[i]``, zeros otherwise. A word listed twice keeps its first vector.

    Raises:
      DataError: (one line) the file is missing or malformed, or its width is not ``dim``.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"--embeddings: {path} does not exist")
    index = {w: i for i, w in enumerate(vocab)}
    try:
        rows = _read_binary(path) if path.suffix == ".bin" else _read_text(path)
        vectors, found = None, np.zeros(len(vocab), bool)
        for word, vector in rows:
            if vectors is None:
                if dim is not None and len(vector) != dim:
                    raise DataError(
                        f"{path}: vectors have {len(vector)} dimensions, the "
                        f"embedding has {dim}; set --embed_size={len(vector)}"
                    )
                vectors = np.zeros((len(vocab), len(vector)), np.float32)
            i = index.get(word)
            if i is not None and not found[i]:
                if len(vector) != vectors.shape[1]:
                    raise DataError(
                        f"{path}: the vector of {word!r} has {len(vector)} values, "
                        f"not {vectors.shape[1]}"
                    )
                vectors[i], found[i] = vector, True
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not a word2vec file ({e})") from None
    if vectors is None:
        raise DataError(f"{path}: holds no vectors")
    return vectors, found


def _read_text(path: pathlib.Path):
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f):
            parts = line.rstrip("\n").rstrip().split(" ")
            if number == 0 and len(parts) == 2 and all(p.isdigit() for p in parts):
                continue  # the "<count> <dim>" header
            if len(parts) < 2:
                raise ValueError(f"line {number + 1} has no vector")
            yield parts[0], np.asarray(parts[1:], np.float32)


def _read_binary(path: pathlib.Path):
    with open(path, "rb") as f:
        header = f.readline().split()
        if len(header) != 2:
            raise ValueError("the binary format starts with a '<count> <dim>' line")
        count, dim = int(header[0]), int(header[1])
        for _ in range(count):
            word = bytearray()
            while (c := f.read(1)) != b" ":
                if not c:
                    raise ValueError("the file ends inside a word")
                if c != b"\n":  # the newline that ends the previous vector
                    word += c
            data = f.read(4 * dim)
            if len(data) != 4 * dim:
                raise ValueError("the file ends inside a vector")
            yield word.decode("utf-8"), np.frombuffer(data, "<f4")
