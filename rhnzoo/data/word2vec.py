"""Pretrained word vectors in Mikolov's word2vec formats, for initialising an embedding.

Wang & Tian (2016) initialise their embeddings with Word2Vec vectors trained on
Wikipedia, which were not published; rhnzoo learns embeddings from scratch by
default, and ``--embeddings=PATH`` loads vectors of your own in either format that
the original ``word2vec`` tool writes (and gensim's ``save_word2vec_format``):

* text: a header line ``<count> <dim>`` (optional here, so GloVe files work too),
  then one line per word: ``word v_1 ... v_dim`` separated by spaces;
* binary: the header line, then per word: the word's UTF-8 bytes, one space, ``dim``
  little-endian float32 values, and an optional newline.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Sequence

import numpy as np

from rhnzoo.data.common import DataError


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
                    raise DataError(f"{path}: vectors have {len(vector)} dimensions, the "
                                    f"embedding has {dim}; set --embed_size={len(vector)}")  # fmt: skip
                vectors = np.zeros((len(vocab), len(vector)), np.float32)
            i = index.get(word)
            if i is not None and not found[i]:
                if len(vector) != vectors.shape[1]:
                    raise DataError(f"{path}: the vector of {word!r} has {len(vector)} values, "
                                    f"not {vectors.shape[1]}")  # fmt: skip
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
