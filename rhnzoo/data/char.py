"""Character-level corpora: enwik8 and text8 (Hutter Prize / Mahoney) and Mikolov's PTB-char.

enwik8 and text8 are 10^8-byte files split as in the reference RHN code
(Zilly et al. 2017; jzilly/RecurrentHighwayNetworks ``data/create_enwik8.py``,
``data/create_text8.py``, ``data/reader.py``): the last 5M symbols are test, the
5M before them validation, the rest (90M) training; the vocabulary is the set of
distinct byte values of the whole file (205 for enwik8, 27 for text8), ids in
increasing byte order (``np.unique(raw, return_inverse=True)`` there). They are
read with ``np.memmap`` and mapped through a 256-entry lookup table, so no Python
object per symbol is ever built, and the ids stay ``uint8``.

PTB-char is Mikolov's ``ptb.char.{train,valid,test}.txt`` from ``simple-examples``:
every line is one sentence whose characters are separated by single spaces, with
``_`` between words; each line gives ``line.split()`` plus one end-of-line symbol.
"""

from __future__ import annotations

import pathlib
import shutil
import zipfile

import numpy as np

from rhnzoo.data import common, ptb
from rhnzoo.data.common import Corpus, DataDir, DataError

# The reference split (create_enwik8.py / create_text8.py: num_test_chars = 5000000).
NUM_TEST_SYMBOLS = 5_000_000

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
# sha256 of the extracted ``enwik8`` member (100,000,000 bytes), the file that is
# cached. Pinned in google/wuffs cmd/ractool/main.go (``unzip -p enwik8.zip |
# sha256sum``) and in several loaders that also pin the zip's sha256
# (547994d9980ebed1288380d652999f38a14fe291a6247c157c3d33d4932534bc, 36,445,475
# bytes, as in huggingface/datasets datasets/enwik8/dataset_infos.json).
ENWIK8_SHA256 = {"enwik8": "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8"}

TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
# sha256 of the extracted ``text8`` member (100,000,000 bytes), pinned by several
# public loaders together with the zip's sha256
# (a6640522afe85d1963ad56c05b0ede0a0c000dddc9671758a6cc09b7a38e5232; 31,344,016
# bytes, the size TensorFlow's word2vec tutorial checks).
TEXT8_SHA256 = {"text8": "6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7"}

# shared/data/SOURCES.md (ptb_char section): byte-identical to Mikolov's files.
PTB_CHAR_SHA256 = {
    "ptb.char.train.txt": "e313d91425e06c4f0a8fb6e881dcce0c291f2a0e9f4dda54833069b122f91da9",
    "ptb.char.valid.txt": "21661f63ec355085879458b6524644d4add5573541b4be14fb52ab2e2e995eb8",
    "ptb.char.test.txt": "1ef5607ac3c463b16e38bfe7900dd3bfc91de5a96e0f21e7eab5188b465b8ebe",
}
# The end-of-line symbol of PTB-char: the newline itself, so that joining
# ``vocab[i]`` over a split gives back the file's lines (without the spaces).
PTB_CHAR_EOL = "\n"

_CHUNK = 1 << 20  # bytes per vectorised pass (bounds the int64 temporaries of bincount)


def _download_zip_member(url: str, member: str):
    """A ``download(tmp)`` for `ensure_files`: fetch the zip at `url` into `tmp`,
    extract `member` to ``tmp/member`` (streamed), delete the zip.

    A corrupt archive or a missing member raises OSError, which `ensure_files`
    reports as a failed download.
    """

    def download(tmp: pathlib.Path) -> None:
        archive = tmp / pathlib.PurePosixPath(url).name
        common.fetch(url, archive)
        try:
            with (
                zipfile.ZipFile(archive) as zf,
                zf.open(member) as src,
                open(tmp / member, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 20)
        except (zipfile.BadZipFile, KeyError) as e:
            raise OSError(f"{url}: {e}") from None
        finally:
            archive.unlink(missing_ok=True)

    return download


def _zip_origin(name: str, url: str) -> common.Origin:
    """The origin of a set that is the single member `name` of the zip at `url`."""
    return common.Origin(
        name, _download_zip_member(url, name), f"{name} is the member of {url} (unzip it there)"
    )


ENWIK8_ORIGIN = _zip_origin("enwik8", ENWIK8_URL)
TEXT8_ORIGIN = _zip_origin("text8", TEXT8_URL)


def _load_byte_corpus(
    origin: common.Origin,
    sha256: dict[str, str],
    data_dir: DataDir,
    download: bool = True,
    verify: bool = True,
    num_test_symbols: int = NUM_TEST_SYMBOLS,
) -> Corpus:
    (member,) = sha256
    directory = origin.ensure(data_dir, sha256, download=download, verify=verify)
    path = directory / member
    n = path.stat().st_size
    if num_test_symbols < 1 or n < 2 * num_test_symbols + 2:
        raise DataError(
            f"{path}: {n} bytes is too short for the split (valid and test "
            f"{num_test_symbols} bytes each, and at least 2 bytes of train)"
        )
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    counts = np.zeros(256, np.int64)
    for start in range(0, n, _CHUNK):
        counts += np.bincount(raw[start : start + _CHUNK], minlength=256)
    symbols = np.flatnonzero(counts)  # sorted byte values that occur
    lookup = np.zeros(256, np.uint8)
    lookup[symbols] = np.arange(len(symbols), dtype=np.uint8)
    ids = lookup[raw]  # vectorised (numpy buffers the index cast): a uint8 copy, no list
    del raw
    return Corpus(
        train=ids[: n - 2 * num_test_symbols],
        valid=ids[n - 2 * num_test_symbols : n - num_test_symbols],
        test=ids[n - num_test_symbols :],
        vocab=tuple(chr(b) for b in symbols),
    )


def load_enwik8(
    data_dir: DataDir = None,
    *,
    download: bool = True,
    verify: bool = True,
    num_test_symbols: int = NUM_TEST_SYMBOLS,
) -> Corpus:
    """Load enwik8, the first 10^8 bytes of the English Wikipedia dump of 2006-03-03.

    Looks for the file ``enwik8`` in `resolve_data_dir('enwik8', data_dir)`; if it
    is missing and `download` is true, fetches ``enwik8.zip`` (36 MB) from
    ``ENWIK8_URL`` and caches only the extracted member. The sha256 of the
    extracted file is checked after a download always, and for a file already on
    disk when `verify` (``verify=False`` accepts your own byte files of any size).

    Args:
      num_test_symbols: bytes of the test split and of the validation split
        (reference: 5,000,000); the train split is everything before them.

    Returns:
      Corpus of ``uint8`` 1-D id arrays (real data: 90,000,000 / 5,000,000 /
      5,000,000 bytes, vocab_size 205). ``vocab[i]`` is ``chr(byte)``, i.e. the
      byte decoded as Latin-1, ids in increasing byte order; so
      ``np.array([ord(c) for c in vocab], np.uint8)[ids].tobytes()`` gives back
      the original bytes (multi-byte UTF-8 characters are several symbols).
    Raises:
      DataError: the file is missing (and no download), its checksum does not
        match, or it is shorter than ``2 * num_test_symbols + 2`` bytes.
    """
    return _load_byte_corpus(
        ENWIK8_ORIGIN, ENWIK8_SHA256, data_dir, download, verify, num_test_symbols
    )


def load_text8(data_dir: DataDir = None, **options) -> Corpus:
    """Load text8: enwik8's text cleaned to the 26 letters a-z and space (10^8 bytes).

    Same protocol and keywords (``options``: ``download``, ``verify``,
    ``num_test_symbols``) as `load_enwik8`: file ``text8`` in
    `resolve_data_dir('text8', data_dir)`, downloaded from ``TEXT8_URL`` =
    ``text8.zip`` (31 MB) when absent, the extracted member cached and
    sha256-checked; reference 90M / 5M / 5M split.

    Returns:
      Corpus of ``uint8`` id arrays (real data: vocab_size 27, ``vocab[0] == ' '``
      then ``'a'`` .. ``'z'``).
    Raises:
      DataError: as `load_enwik8`.
    """
    return _load_byte_corpus(TEXT8_ORIGIN, TEXT8_SHA256, data_dir, **options)


def _download_ptb_char(tmp: pathlib.Path) -> None:
    ptb.download_simple_examples(tmp, PTB_CHAR_SHA256)


PTB_CHAR_ORIGIN = common.Origin("ptb_char", _download_ptb_char, ptb.SIMPLE_EXAMPLES_HINT)


def _read_symbols(path: pathlib.Path) -> list[str]:
    """``line.split() + [EOL]`` for each line; trailing whitespace after the last
    newline (the real files end with ``"\\n "``) is not a line."""
    lines = common.read_text(path).split("\n")
    if not lines[-1].strip():
        lines.pop()
    symbols: list[str] = []
    for line in lines:
        symbols.extend(line.split())
        symbols.append(PTB_CHAR_EOL)
    return symbols


def load_ptb_char(
    data_dir: DataDir = None, *, download: bool = True, verify: bool = True
) -> Corpus:
    """Load Mikolov's character-level Penn Treebank from `resolve_data_dir('ptb_char', data_dir)`.

    Files ``ptb.char.{train,valid,test}.txt``; if missing and `download` is true
    they are extracted from Mikolov's ``simple-examples.tgz`` (``ptb.PTB_URL``).
    Each line becomes ``line.split() + [PTB_CHAR_EOL]`` (the characters of a
    sentence, ``_`` between words, then the end-of-line symbol ``"\\n"``). The
    vocabulary is built from train only, ids in increasing code-point order (so
    the end-of-line symbol is id 0). `verify=False` skips the sha256 check of
    files already on disk; downloaded files are always checked.

    Returns:
      Corpus of ``uint8`` id arrays (``int32`` if a corpus of your own has more
      than 256 symbols); real data: 5,017,482 / 393,042 / 442,423 symbols,
      vocab_size 50.
    Raises:
      DataError: missing files (and no download), checksum mismatch, an empty
        or non-UTF-8 file, or a valid/test symbol absent from the train vocabulary.
    """
    directory = PTB_CHAR_ORIGIN.ensure(data_dir, PTB_CHAR_SHA256, download=download, verify=verify)
    paths = {split: directory / f"ptb.char.{split}.txt" for split in ("train", "valid", "test")}
    splits = {split: _read_symbols(path) for split, path in paths.items()}
    vocab = tuple(sorted(set(splits["train"])))
    dtype = np.uint8 if len(vocab) <= 256 else np.int32
    return common.encode_splits(splits, vocab, paths, dtype, "symbol")
