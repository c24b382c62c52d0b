"""Data sets: loaders that find, download, verify and cache their files.

Each loader looks in ``--data_dir``, else ``$RHNZOO_DATA/<name>``, else the user
cache, downloads from the standard source when the files are absent, checks
sha256 sums, and otherwise fails with one line naming the missing files.

:mod:`rhnzoo.data.registry` names every set (``DATASETS``: loader, files, sha256, task,
metric, sizes); ``load(name)``, ``load_dataset(name)`` (the sequence classifier's sets
with their dev split, :mod:`rhnzoo.data.sequences`) and ``ensure_files(name)`` go
through it.
"""

from rhnzoo.data.char import load_enwik8, load_ptb_char, load_text8
from rhnzoo.data.common import (
    SOURCES,
    Corpus,
    DataError,
    batchify,
    fetch,
    num_windows,
    resolve_data_dir,
    sha256_file,
    windows,
)
from rhnzoo.data.images import (
    PMNIST_PERMUTATION_SEED,
    ImageData,
    load_cifar100,
    load_mnist,
    load_tfds_images,
    pixel_sequences,
)
from rhnzoo.data.music import load_jsb
from rhnzoo.data.registry import DATASETS, DataSet, ensure_files, load, load_dataset, names
from rhnzoo.data.ptb import EOS, PTB_SHA256, PTB_URL, load_ptb
from rhnzoo.data.text import (
    TextData,
    build_vocab,
    dev_split,
    encode,
    load_20ng,
    load_agnews,
    load_imdb,
    load_tfds_text,
    tokenize,
)

__all__ = [
    "DATASETS",
    "DataSet",
    "load",
    "load_dataset",
    "names",
    "EOS",
    "PMNIST_PERMUTATION_SEED",
    "PTB_SHA256",
    "PTB_URL",
    "Corpus",
    "DataError",
    "SOURCES",
    "ImageData",
    "TextData",
    "batchify",
    "build_vocab",
    "dev_split",
    "encode",
    "ensure_files",
    "fetch",
    "load_20ng",
    "load_agnews",
    "load_cifar100",
    "load_enwik8",
    "load_imdb",
    "load_jsb",
    "load_mnist",
    "load_ptb",
    "load_ptb_char",
    "load_text8",
    "load_tfds_images",
    "load_tfds_text",
    "num_windows",
    "pixel_sequences",
    "resolve_data_dir",
    "sha256_file",
    "tokenize",
    "windows",
]
