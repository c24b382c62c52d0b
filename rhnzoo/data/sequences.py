"""Labelled sequences for the sequence classifier (Wang & Tian, EMNLP 2016): train / dev /
test splits.

:class:`Split` holds sequences (``[T_i]`` token ids, or ``[T_i, m]`` float features for
P-MNIST) with their labels; :class:`Dataset` the three splits and what a model needs to
know about them. The dev split is the paper's 15 % of the training set
(:func:`rhnzoo.data.text.dev_split`, a fixed seed). :func:`load_pmnist` is P-MNIST's
loader in the registry; :func:`rhnzoo.data.registry.load_dataset` loads any set of the
``'sequences'`` task by name (IMDB, P-MNIST, AG News, 20 Newsgroups).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rhnzoo.data import images, text
from rhnzoo.data.common import DataDir, check_source

# The text sets' names in TensorFlow Datasets (20NG has none).
TFDS_TEXT_NAMES = {"imdb": "imdb_reviews", "agnews": "ag_news_subset"}


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """Labelled sequences: ``inputs[i]`` is ``[T_i]`` int32 token ids or ``[T_i, m]``
    float32 features; ``labels [N] int32``."""

    inputs: Sequence[np.ndarray]
    labels: np.ndarray

    def __post_init__(self):
        if len(self.inputs) != len(self.labels):
            raise ValueError(f"{len(self.inputs)} sequences but {len(self.labels)} labels")

    def subset(self, index: np.ndarray) -> Split:
        return Split([self.inputs[i] for i in index], np.asarray(self.labels)[index])


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """Train / dev / test splits with what the model needs to know about them."""

    train: Split
    dev: Split
    test: Split
    num_classes: int
    vocab: tuple[str, ...] | None  # None: float features (P-MNIST)
    input_size: int | None  # features per step for float inputs


def with_dev_split(
    train_all: Split,
    test: Split,
    num_classes: int,
    vocab: tuple[str, ...] | None,
    dev_fraction: float = 0.15,
    dev_seed: int = 0,
) -> Dataset:
    """The :class:`Dataset` whose dev split is ``dev_fraction`` of ``train_all``
    (:func:`rhnzoo.data.text.dev_split` with ``dev_seed``) and whose train split is the
    rest."""
    keep, held_out = text.dev_split(len(train_all.labels), dev_fraction, dev_seed)
    return Dataset(
        train_all.subset(keep),
        train_all.subset(held_out),
        test,
        num_classes,
        vocab,
        None if vocab is not None else 1,
    )


def from_text(data: text.TextData, dev_fraction: float = 0.15, dev_seed: int = 0) -> Dataset:
    """A tokenised text set (:class:`rhnzoo.data.text.TextData`, its vocabulary built
    without the same dev documents) with its dev split."""
    return with_dev_split(
        Split(data.train, data.train_labels),
        Split(data.test, data.test_labels),
        data.num_classes,
        data.vocab,
        dev_fraction,
        dev_seed,
    )


def load_tfds_text(name: str, data_dir: DataDir = None, **options) -> text.TextData:
    """Text set ``name`` (``'imdb'``, ``'agnews'``) from TensorFlow Datasets
    (:func:`rhnzoo.data.text.load_tfds_text`; ``options``: its own). Raises ValueError for
    a set that TFDS does not have."""
    tfds_name = TFDS_TEXT_NAMES.get(name)
    if tfds_name is None:
        raise ValueError(f"{name} is not in TensorFlow Datasets; use --data_source=files")
    return text.load_tfds_text(tfds_name, data_dir, **options)


def load_pmnist(
    data_dir: DataDir = None,
    *,
    download: bool = True,
    verify: bool = True,
    source: str = "files",
    permute: bool = True,
    dev_fraction: float = 0.15,
    dev_seed: int = 0,
) -> Dataset:
    """P-MNIST: MNIST as 784 pixel steps ``[784, 1]`` float32 in [0, 1] under the fixed
    permutation of :func:`rhnzoo.data.images.pixel_sequences` (``permute=False``:
    sequential MNIST), 10 classes, with the dev split. ``source='tfds'`` reads
    TensorFlow Datasets' ``mnist`` instead of the idx files.

    Raises:
      ValueError: an unknown source.
      rhnzoo.data.DataError: missing or corrupt files.
    """
    check_source(source)
    data = (
        images.load_tfds_images("mnist", data_dir, download=download)
        if source == "tfds"
        else images.load_mnist(data_dir, download=download, verify=verify)
    )
    to_steps = lambda x: images.pixel_sequences(x, permute=permute)[..., None]
    return with_dev_split(
        Split(to_steps(data.train_images), data.train_labels),
        Split(to_steps(data.test_images), data.test_labels),
        10,
        None,
        dev_fraction,
        dev_seed,
    )
