"""Every data set by name: its loader, files, sha256 sums and what a task needs of it.

    from rhnzoo import data
    data.DATASETS["ptb"].task                 # 'lm'
    corpus = data.load("ptb")                 # = data.load_ptb()
    directory = data.ensure_files("mnist")    # finds / downloads / checks the files
    imdb = data.load_dataset("imdb")          # train / dev / test sequences, vocab

``ensure_files(name, data_dir=None)`` resolves the set's own directory (``--data_dir``,
else ``$RHNZOO_DATA/<dir>``, else the user cache), downloads what is missing and checks
the sha256 sums, exactly as the loader does before reading.

Tasks (:attr:`DataSet.task`): ``'lm'`` (a :class:`~rhnzoo.data.Corpus` of token ids;
``metric`` ``'ppl'`` for words, ``'bpc'`` for characters), ``'polyphonic'`` (JSB piano
rolls), ``'images'`` (:class:`~rhnzoo.data.ImageData`; ``input_size``, ``num_classes``
for a feed-forward net) and ``'sequences'`` (labelled sequences for the sequence
classifier; :func:`load_dataset` gives any of them as a
:class:`~rhnzoo.data.sequences.Dataset` with its dev split).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from rhnzoo.data import char, common, images, music, ptb, sequences, text


@dataclasses.dataclass(frozen=True)
class DataSet:
    """One registered data set.

    Attributes:
      name: the registry name (``--dataset``).
      task: ``'lm'``, ``'polyphonic'``, ``'images'`` or ``'sequences'``.
      load: ``load(data_dir=None, *, download=True, verify=True, **options)``.
      files: file name -> sha256 (None: no published checksum).
      origin: the :class:`~rhnzoo.data.common.Origin` the loader fetches the files
        from: the folder name under ``$RHNZOO_DATA`` / the user cache (``directory``),
        ``download(tmp)`` writing them into ``tmp`` (None: none) and ``offline_hint``,
        where to get them by hand (in the missing-files error).
      ensure: ``ensure(directory, download, verify)`` when the loader accepts more than
        ``files`` (IMDB: the archive, another tarball or an extracted folder).
      metric: the task's metric (``'ppl'``, ``'bpc'``, ``'nats'``, ``'accuracy'``).
      input_size: features per example (images) or per step (P-MNIST: 1); None: tokens.
      num_classes: classes of a classification set.
    """

    name: str
    task: str
    load: Callable[..., Any]
    files: Mapping[str, str | None]
    origin: common.Origin
    metric: str
    input_size: int | None = None
    num_classes: int | None = None
    ensure: Callable[[pathlib.Path, bool, bool], Any] | None = None  # a loader's own lookup


DATASETS: dict[str, DataSet] = {
    d.name: d
    for d in (
        DataSet("ptb", "lm", ptb.load_ptb, ptb.PTB_SHA256, ptb.PTB_ORIGIN, "ppl"),
        DataSet(
            "ptb_char", "lm", char.load_ptb_char, char.PTB_CHAR_SHA256, char.PTB_CHAR_ORIGIN, "bpc"
        ),
        DataSet("enwik8", "lm", char.load_enwik8, char.ENWIK8_SHA256, char.ENWIK8_ORIGIN, "bpc"),
        DataSet("text8", "lm", char.load_text8, char.TEXT8_SHA256, char.TEXT8_ORIGIN, "bpc"),
        DataSet(
            "jsb_chorales", "polyphonic", music.load_jsb, music.JSB_SHA256, music.JSB_ORIGIN, "nats"
        ),
        DataSet(
            "mnist",
            "images",
            images.load_mnist,
            images.MNIST_SHA256,
            images.MNIST_ORIGIN,
            "accuracy",
            784,
            10,
        ),
        DataSet(
            "cifar100",
            "images",
            images.load_cifar100,
            images.CIFAR100_SHA256,
            images.CIFAR100_ORIGIN,
            "accuracy",
            3072,
            100,
        ),
        DataSet(
            "pmnist",
            "sequences",
            sequences.load_pmnist,
            images.MNIST_SHA256,
            images.MNIST_ORIGIN,
            "accuracy",
            1,
            10,
        ),
        DataSet(
            "imdb",
            "sequences",
            text.load_imdb,
            text.IMDB_SHA256,
            text.IMDB_ORIGIN,
            "accuracy",
            None,
            2,
            text.imdb_source,
        ),  # the archive, another tarball or an aclImdb/ folder
        DataSet(
            "agnews",
            "sequences",
            text.load_agnews,
            text.AGNEWS_SHA256,
            text.AGNEWS_ORIGIN,
            "accuracy",
            None,
            4,
        ),
        DataSet(
            "20ng",
            "sequences",
            text.load_20ng,
            text.NG20_FILES,
            text.NG20_ORIGIN,
            "accuracy",
            None,
            20,
        ),
    )
}
NAMES: tuple[str, ...] = tuple(DATASETS)


def names(task: str | None = None) -> tuple[str, ...]:
    """The registered names, or those of one ``task``."""
    return tuple(n for n, d in DATASETS.items() if task is None or d.task == task)


def get(name: str, task: str | None = None) -> DataSet:
    """The entry of ``name``; ValueError (one line) for an unknown name or another task."""
    valid = names(task)
    if name not in valid:
        raise ValueError(
            f"unknown {'' if task is None else task + ' '}data set {name!r}; "
            f"choose from {', '.join(valid)}"
        )
    return DATASETS[name]


def load(
    name: str,
    data_dir: common.DataDir = None,
    *,
    download: bool = True,
    verify: bool = True,
    **options: Any,
) -> Any:
    """Loads data set ``name`` with its loader (``options``: the loader's own)."""
    return get(name).load(data_dir, download=download, verify=verify, **options)


def load_dataset(
    name: str,
    *,
    data_dir: common.DataDir = None,
    download: bool = True,
    verify: bool = True,
    source: str = "files",
    coverage: float = 0.95,
    dev_fraction: float = 0.15,
    dev_seed: int = 0,
    permute: bool = True,
) -> sequences.Dataset:
    """A set of the ``'sequences'`` task (IMDB, P-MNIST, AG News, 20NG) with the paper's
    15 % dev split of the training set (:mod:`rhnzoo.data.sequences`).

    Text sets are tokenised by :func:`rhnzoo.data.text.tokenize` with a vocabulary of
    the most frequent training words covering ``coverage`` of the training tokens
    (built without the dev documents); P-MNIST is MNIST as 784 pixel steps in [0, 1]
    under the fixed permutation of :func:`rhnzoo.data.images.pixel_sequences`
    (``permute=False``: sequential MNIST). ``source='tfds'`` reads TensorFlow Datasets
    (``imdb_reviews``, ``ag_news_subset``, ``mnist``) instead of the original files.

    Raises:
      ValueError: an unknown name or source (20NG has no TFDS version).
      rhnzoo.data.DataError: missing or corrupt files.
    """
    get(name, task="sequences")  # one line for an unknown name
    common.check_source(source)
    files = dict(download=download, verify=verify)
    dev = dict(dev_fraction=dev_fraction, dev_seed=dev_seed)
    if name == "pmnist":
        return sequences.load_pmnist(data_dir, source=source, permute=permute, **files, **dev)
    data = (
        sequences.load_tfds_text(name, data_dir, download=download, coverage=coverage, **dev)
        if source == "tfds"
        else load(name, data_dir, coverage=coverage, **files, **dev)
    )
    return sequences.from_text(data, dev_fraction, dev_seed)


def ensure_files(
    name: str,
    data_dir: common.DataDir = None,
    *,
    download: bool = True,
    verify: bool = True,
) -> pathlib.Path:
    """Makes sure the files of ``name`` are in its directory (``data_dir``, else
    ``$RHNZOO_DATA/<directory>``, else the user cache): downloads the missing ones,
    checks sha256 sums. Returns the directory.

    Raises:
      ValueError: an unknown name.
      rhnzoo.data.DataError: files missing (and no download) or corrupt.
    """
    d = get(name)
    if d.ensure is not None:
        directory = common.resolve_data_dir(d.origin.directory, data_dir)
        d.ensure(directory, download, verify)
        return directory
    return d.origin.ensure(data_dir, d.files, download=download, verify=verify)
