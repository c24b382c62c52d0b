"""Penn Treebank, Mikolov's preprocessed word-level version (``simple-examples``)."""

from __future__ import annotations

import collections
import pathlib

import numpy as np

from rhnzoo.data import common
from rhnzoo.data.common import Corpus, DataDir

PTB_URL = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"
PTB_SHA256 = {
    "ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}
EOS = "<eos>"


def download_simple_examples(tmp: pathlib.Path, names) -> None:
    """Fetch Mikolov's archive into `tmp` and extract `simple-examples/data/<name>` there.

    Raises: tarfile.TarError if a member is missing; OSError if the download fails.
    """
    common.fetch_members(
        PTB_URL,
        tmp / "simple-examples.tgz",
        {f"simple-examples/data/{name}": tmp / name for name in names},
    )


def _download_ptb(tmp: pathlib.Path) -> None:
    download_simple_examples(tmp, PTB_SHA256)


# Mikolov's archive holds the word- and character-level files (rhnzoo.data.char).
SIMPLE_EXAMPLES_HINT = f"they are in simple-examples/data/ of {PTB_URL}"
PTB_ORIGIN = common.Origin("ptb", _download_ptb, SIMPLE_EXAMPLES_HINT)


def _read_words(path: pathlib.Path) -> list[str]:
    """Equivalent to concatenating ``line.split() + ['<eos>']`` over the file's lines."""
    text = common.read_text(path)
    if text and not text.endswith("\n"):
        text += "\n"
    return text.replace("\n", f" {EOS} ").split()


def load_ptb(data_dir: DataDir = None, *, download: bool = True, verify: bool = True) -> Corpus:
    """Load PTB ``ptb.{train,valid,test}.txt`` from `resolve_data_dir('ptb', data_dir)`.

    Each line becomes ``line.split() + ['<eos>']``. The vocabulary is built from
    train only, ids ordered by descending frequency, then by word. If files are
    missing and `download` is true they are fetched from Mikolov's archive.
    `verify=False` skips the sha256 check of files already on disk (for your own
    or test corpora); downloaded files are always checked.

    Returns: Corpus with int32 [N_split] id arrays (real data: 929589 / 73760 /
      82430 tokens, vocab_size 10000).
    Raises: DataError for missing files (and no download), checksum mismatch,
      an empty or non-UTF-8 file, or a valid/test word absent from the train
      vocabulary.
    """
    directory = PTB_ORIGIN.ensure(data_dir, PTB_SHA256, download=download, verify=verify)
    paths = {split: directory / f"ptb.{split}.txt" for split in ("train", "valid", "test")}
    splits = {split: _read_words(path) for split, path in paths.items()}
    counts = collections.Counter(splits["train"])
    vocab = tuple(sorted(counts, key=lambda w: (-counts[w], w)))
    return common.encode_splits(splits, vocab, paths, np.int32, "word")
