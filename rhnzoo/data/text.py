"""Text classification sets for Recurrent Residual Learning (Wang & Tian, EMNLP 2016):
IMDB (Maas et al. 2011), AG News (Zhang, Zhao & LeCun 2015) and 20 Newsgroups in
Cachopo's preprocessed version, plus the TFDS route to IMDB and AG News.

Every loader returns a `TextData`: one int32 id array per document and 0-based labels.
The vocabulary is built from training documents only (`build_vocab`): ``'<pad>'`` (id
0), ``'<unk>'`` (id 1), then the most frequent training words, by descending count
(ties by word), until they cover `coverage` of the training tokens; every other word
is ``'<unk>'``. The paper takes a 15 % development set out of the training set
(`dev_split`); pass the same `dev_fraction` to the loader to keep the development
documents out of the vocabulary too: with ``dev_fraction > 0`` the vocabulary is
``build_vocab(docs, coverage)`` over the training documents less those that
``dev_split(len(train), dev_fraction, dev_seed)`` holds out (all training documents
are still returned: take the same split for validation).
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import itertools
import pathlib
import re
import tarfile
import zlib
from collections.abc import Iterable, Sequence

import numpy as np

from rhnzoo.data import common
from rhnzoo.data.common import DataDir, DataError, resolve_data_dir

PAD, UNK = "<pad>", "<unk>"


@dataclasses.dataclass(frozen=True, eq=False)
class TextData(common.Labelled):
    """A tokenised classification set: `train` / `test` hold one int32 id array ``[T_i]``
    per document (``vocab[id]`` is the word; id 0 ``'<pad>'`` never occurs in a document,
    id 1 is ``'<unk>'``), labels are int32 ``[N]`` in ``0 .. num_classes - 1``."""

    train: tuple[np.ndarray, ...]
    train_labels: np.ndarray
    test: tuple[np.ndarray, ...]
    test_labels: np.ndarray
    vocab: tuple[str, ...]
    label_names: tuple[str, ...]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


# ------------------------------------------------------------------ tokens and vocabulary

_BREAK = re.compile(r"<br\s*/?>")
_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Split raw text into word and punctuation tokens.

    Exactly: (1) lower-case (``str.lower``); (2) replace every HTML line break
    ``<br />`` / ``<br/>`` / ``<br>`` (IMDB's) by a space; (3) return the matches of
    the regular expression ``\\w+(?:'\\w+)*|[^\\w\\s]``, left to right: a run of
    word characters (Unicode letters, digits, ``_``) with inner apostrophes kept
    (``"don't"``, ``"it's"`` are one token), or any other single non-space
    character (``.``, ``,``, ``!``, a lone ``'``, ``<``, ...). Whitespace separates
    tokens and is dropped.

    Example: ``tokenize("It's GREAT!<br />10/10")`` is
    ``["it's", "great", "!", "10", "/", "10"]``.
    """
    return _TOKEN.findall(_BREAK.sub(" ", text.lower()))


def build_vocab(docs_tokens: Iterable[Sequence[str]], coverage: float = 0.95) -> tuple[str, ...]:
    """The vocabulary of a training set: ``('<pad>', '<unk>')`` then the most frequent
    words, by descending count and then by word, up to the first k words whose counts
    sum to at least ``coverage`` of all training tokens (k minimal); the others map
    to ``'<unk>'``. ``coverage=1`` keeps every word. Tokens equal to ``'<pad>'`` or
    ``'<unk>'`` are not counted as words.

    Raises: ValueError if coverage is not in (0, 1].
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    counts = collections.Counter()
    for tokens in docs_tokens:
        counts.update(tokens)
    counts.pop(PAD, None)
    counts.pop(UNK, None)
    words = sorted(counts, key=lambda w: (-counts[w], w))
    if not words:
        return (PAD, UNK)
    cumulative = np.cumsum([counts[w] for w in words])
    k = int(np.searchsorted(cumulative, coverage * cumulative[-1])) + 1  # first with sum >= it
    return (PAD, UNK, *words[:k])


def encode(docs_tokens: Iterable[Sequence[str]], vocab: Sequence[str]) -> tuple[np.ndarray, ...]:
    """Token lists -> int32 id arrays under `vocab` (words not in it become id 1, '<unk>')."""
    index = {word: i for i, word in enumerate(vocab)}
    return tuple(
        np.fromiter(map(index.get, tokens, itertools.repeat(1)), np.int32, len(tokens))
        for tokens in docs_tokens
    )


def dev_split(n: int, fraction: float = 0.15, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fixed train / development split of `n` training documents (the paper's 15 % dev set).

    The dev set is the first ``round(fraction * n)`` entries of
    ``np.random.default_rng(seed).permutation(n)``, the rest is train.

    Returns: (train indices, dev indices), both sorted int64, disjoint, covering 0..n-1.
    Raises: ValueError if fraction is not in (0, 1) or either part would be empty.
    """
    n_dev = round(fraction * n)
    if not 0.0 < fraction < 1.0 or not 0 < n_dev < n:
        raise ValueError(f"dev_split: fraction={fraction} of n={n} leaves an empty part")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_dev:]), np.sort(order[:n_dev])


def _text_data(
    tokens: dict[str, list[list[str]]],
    labels: dict[str, Sequence[int]],
    label_names: Sequence[str],
    coverage: float = 0.95,
    dev_fraction: float = 0.0,
    dev_seed: int = 0,
) -> TextData:
    """Every loader's last step: `tokens` and `labels` (keyed ``'train'`` / ``'test'``, one
    token list and one 0-based label per document) `encode`d with the vocabulary the
    module docstring describes."""
    vocab_docs = tokens["train"]
    if dev_fraction:
        keep, _ = dev_split(len(vocab_docs), dev_fraction, dev_seed)
        vocab_docs = [vocab_docs[i] for i in keep]
    vocab = build_vocab(vocab_docs, coverage)
    return TextData(
        train=encode(tokens["train"], vocab),
        train_labels=np.asarray(labels["train"], np.int32),
        test=encode(tokens["test"], vocab),
        test_labels=np.asarray(labels["test"], np.int32),
        vocab=vocab,
        label_names=tuple(label_names),
    )


# ------------------------------------------------------------------------------- IMDB

IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
IMDB_FILE = "aclImdb_v1.tar.gz"
# The original archive (84,125,825 bytes), sha256 as pinned by public loaders, e.g.
# gomlx/gomlx examples/imdb/imdb.go (TarHash) and Julia's MLDatasets / CorpusLoaders
# DataDeps registrations of "IMDB movie reviews dataset".
IMDB_SHA256 = {IMDB_FILE: "c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe"}
IMDB_LABELS = ("neg", "pos")  # label 0, 1
_IMDB_REVIEW = re.compile(r"(?:^|/)aclImdb/(train|test)/(neg|pos)/\d+_\d+\.txt$")


def _download_imdb(tmp: pathlib.Path) -> None:
    common.fetch(IMDB_URL, tmp / IMDB_FILE)


IMDB_ORIGIN = common.Origin(
    "imdb",
    _download_imdb,
    f"it is {IMDB_URL}; an extracted aclImdb/ folder, or a tarball "
    "of aclImdb/{train,test}/{neg,pos}/*.txt, there works too",
)


def _imdb_reviews(source: pathlib.Path) -> dict[str, list[tuple[str, str, bytes]]]:
    """{'train'|'test': [(path in aclImdb, label, raw bytes), ...]} from an aclImdb/
    folder or a tar archive holding one (streamed, never extracted); train/unsup and
    every other file are skipped."""
    found = {"train": [], "test": []}

    def add(name: str, read) -> None:
        match = _IMDB_REVIEW.search(name)
        if match:
            found[match[1]].append((name[match.start() :].lstrip("/"), match[2], read()))

    if source.is_dir():
        for split in ("train", "test"):
            for label in IMDB_LABELS:
                for path in (source / split / label).glob("*.txt"):
                    add(f"aclImdb/{split}/{label}/{path.name}", path.read_bytes)
    else:
        try:
            with tarfile.open(source, "r:*") as tar:
                for member in tar:
                    if member.isfile():
                        add(member.name, tar.extractfile(member).read)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
            raise DataError(f"{source} is not a readable tar archive ({e})") from None
    for split, reviews in found.items():
        if not reviews:
            raise DataError(
                f"{source} has no reviews aclImdb/{split}/{{neg,pos}}/<id>_<rating>.txt"
            )
        reviews.sort()
    return found


def imdb_source(directory: pathlib.Path, download: bool, verify: bool) -> pathlib.Path:
    """The original archive, else an extracted aclImdb/ folder, else the one other
    tarball in `directory` (already resolved, as `load_imdb` and the registry pass it);
    else download the original (IMDB_ORIGIN, into `directory` as is)."""
    if not (directory / IMDB_FILE).is_file():
        others = sorted(
            path
            for path in (directory.iterdir() if directory.is_dir() else ())
            if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar"))
        )
        if (directory / "aclImdb").is_dir():
            return directory / "aclImdb"
        if len(others) > 1:
            raise DataError(
                f"{directory} holds several archives ({', '.join(p.name for p in others)}); "
                "keep only the one with the aclImdb reviews"
            )
        if others:
            return others[0]
    IMDB_ORIGIN.ensure(directory, IMDB_SHA256, download=download, verify=verify)
    return directory / IMDB_FILE


def load_imdb(
    data_dir: DataDir = None, *, download: bool = True, verify: bool = True, **vocab
) -> TextData:
    """Load the IMDB Large Movie Review set (Maas et al., ACL 2011), 50,000 labelled reviews.

    Looks in `resolve_data_dir('imdb', data_dir)` for, in this order: (a) the original
    ``aclImdb_v1.tar.gz`` (sha256-checked when `verify`; downloaded from IMDB_URL, 84 MB,
    and always checked, when nothing below is there and `download`), (b) an extracted
    ``aclImdb/`` folder, or (c) exactly one other ``.tar.gz`` / ``.tgz`` / ``.tar``
    with the same ``aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt`` layout (e.g. a
    repack without train/unsup). (b) and (c) are yours: they are not checksummed.
    Archives are streamed, never extracted. train/unsup is skipped.

    Documents are in order of their path (``aclImdb/train/neg/0_3.txt`` <
    ``aclImdb/train/neg/10000_4.txt`` < ... < ``aclImdb/train/pos/...``, plain string
    order), so neg reviews come first; text is decoded as UTF-8 and `tokenize`d.

    Args:
      vocab: ``coverage=0.95``, ``dev_fraction=0.0``, ``dev_seed=0``, as the module docstring says.

    Returns:
      TextData, labels neg = 0, pos = 1. Real data: 25,000 / 25,000 reviews, each
      split 12,500 per label.
    Raises:
      DataError: no source (and no download or it failed), checksum mismatch, an
        unreadable archive, no reviews for a split, several candidate archives, or a
        review that is empty or not UTF-8 (the message names it).
    """
    source = imdb_source(resolve_data_dir("imdb", data_dir), download, verify)
    reviews = _imdb_reviews(source)
    tokens, labels = {}, {}
    for split, items in reviews.items():
        tokens[split] = [
            tokenize(common.decode_text(raw, f"{source}: {name}")) for name, _, raw in items
        ]
        labels[split] = [IMDB_LABELS.index(label) for _, label, _ in items]
    return _text_data(tokens, labels, IMDB_LABELS, **vocab)


# ---------------------------------------------------------------------------- AG News

AGNEWS_LABELS = ("World", "Sports", "Business", "Sci/Tech")  # classes.txt; CSV labels 1..4
# sha256 of Zhang et al.'s train.csv (29,470,338 bytes) and test.csv (1,857,427 bytes), as
# pinned by huggingface/datasets datasets/ag_news/dataset_infos.json (download_checksums,
# for the mhjabreel/CharCnn_Keras copies below; torchtext checks the same files by md5
# b1a00f826fdfbd249f79597b59e1dc12 / d52ea96a97a2d943681189a97654912d).
AGNEWS_SHA256 = {
    "train.csv": "76a0a2d2f92b286371fe4d4044640910a04a803fdd2538e0f3f29a5c6f6b672e",
    "test.csv": "521465c2428ed7f02f8d6db6ffdd4b5447c1c701962353eb2c40d548c3c85699",
}
# The authors' Google Drive folder cannot be fetched by a script; these can. The CSVs
# are tried first; then the fast.ai archive, whose ag_news_csv/{train,test}.csv members
# are extracted and checked against the same sha256 sums.
AGNEWS_CSV_URL = (
    "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
)
AGNEWS_TGZ_URL = "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz"


def _download_agnews(tmp: pathlib.Path) -> None:
    try:
        for name in AGNEWS_SHA256:
            common.fetch(AGNEWS_CSV_URL + name, tmp / name)
    except OSError:
        members = {f"ag_news_csv/{n}": tmp / n for n in AGNEWS_SHA256}
        common.fetch_members(AGNEWS_TGZ_URL, tmp / "ag_news_csv.tgz", members)


AGNEWS_ORIGIN = common.Origin(
    "ag_news", _download_agnews, f"they are ag_news_csv/*.csv of {AGNEWS_TGZ_URL}"
)


def _read_agnews(path: pathlib.Path) -> tuple[list[list[str]], list[int]]:
    tokens, labels = [], []
    reader = csv.reader(io.StringIO(common.read_text(path), newline=""))
    try:
        for row in reader:
            if len(row) != 3 or row[0] not in ("1", "2", "3", "4"):
                raise DataError(
                    f'{path}: line {reader.line_num} is not "label","title","description" '
                    "with label 1..4"
                )
            labels.append(int(row[0]) - 1)
            # A backslash stands for a line break in these files ("\\" for a blank line).
            tokens.append(tokenize(f"{row[1]} {row[2]}".replace("\\", " ")))
    except csv.Error as e:
        raise DataError(f"{path}: line {reader.line_num}: {e}") from None
    return tokens, labels


def load_agnews(
    data_dir: DataDir = None, *, download: bool = True, verify: bool = True, **vocab
) -> TextData:
    """Load AG News (Zhang, Zhao & LeCun, NIPS 2015): 4 topics, 120,000 / 7,600 articles.

    Files ``train.csv`` and ``test.csv`` (``ag_news_csv/`` of the authors' archive) in
    `resolve_data_dir('ag_news', data_dir)`, sha256-checked (AGNEWS_SHA256) when
    `verify` and always after a download (AGNEWS_CSV_URL, else AGNEWS_TGZ_URL).
    Rows ``"label","title","description"`` (csv module, ``""`` for a quote), labels 1..4
    -> 0..3 (World, Sports, Business, Sci/Tech). A document is ``title + " " +
    description`` with every backslash (the files' line break) replaced by a space,
    then `tokenize`d; HTML entities such as ``#39;`` / ``&lt;`` are left as they are.
    Documents keep the files' order.

    Args:
      vocab: ``coverage=0.95``, ``dev_fraction=0.0``, ``dev_seed=0``, as the module docstring says.

    Returns:
      TextData, labels World = 0, Sports = 1, Business = 2, Sci/Tech = 3. Real data:
      120,000 / 7,600 articles, 30,000 / 1,900 per label.
    Raises:
      DataError: files missing (and no download or it failed), checksum mismatch, a
        file that is empty, not UTF-8, or has a row that is not of this format.
    """
    directory = AGNEWS_ORIGIN.ensure(data_dir, AGNEWS_SHA256, download=download, verify=verify)
    tokens, labels = {}, {}
    for split in ("train", "test"):
        tokens[split], labels[split] = _read_agnews(directory / f"{split}.csv")
    return _text_data(tokens, labels, AGNEWS_LABELS, **vocab)


# ---------------------------------------------------------------------- 20 Newsgroups

# Ana Cardoso-Cachopo's "all-terms" 20 Newsgroups (bydate split, 11,293 / 7,528
# documents; http://ana.cachopo.org/datasets-for-single-label-text-categorization):
# lower-case letters only, one document per line ``<newsgroup>\t<terms>``. No checksum
# of these files is published or pinned by public code, so they are not checked
# (None); a download is checked for the format only. Mirrors, tried in order.
NG20_FILES = {"20ng-train-all-terms.txt": None, "20ng-test-all-terms.txt": None}
NG20_MIRRORS = (
    "http://web.ist.utl.pt/acardoso/datasets/",
    "https://www.cs.umb.edu/~smimarog/textmining/datasets/",
)


def _download_20ng(tmp: pathlib.Path) -> None:
    for name in NG20_FILES:
        common.fetch_first([mirror + name for mirror in NG20_MIRRORS], tmp / name)


NG20_ORIGIN = common.Origin("20ng", _download_20ng, f"they are at {NG20_MIRRORS[0]}<file>")


def _read_20ng(path: pathlib.Path) -> tuple[list[list[str]], list[str]]:
    tokens, groups = [], []
    for number, line in enumerate(common.read_text(path).split("\n"), 1):
        line = line.rstrip("\r")
        if not line:
            continue
        group, tab, terms = line.partition("\t")
        if not tab or not group or group != group.strip():
            raise DataError(f"{path}: line {number} is not <newsgroup><TAB><terms>")
        groups.append(group)
        tokens.append(terms.split())
    return tokens, groups


def load_20ng(
    data_dir: DataDir = None, *, download: bool = True, verify: bool = True, **vocab
) -> TextData:
    """Load 20 Newsgroups in Cachopo's preprocessed "all-terms" version (the paper's).

    Files ``20ng-{train,test}-all-terms.txt`` in `resolve_data_dir('20ng', data_dir)`,
    downloaded from NG20_MIRRORS when missing (no checksum exists: `verify` has
    nothing to check). Each non-empty line is ``<newsgroup>\\t<terms>``; the terms,
    already lower-case letters, are split on whitespace (`tokenize` is not applied). A
    document can be empty (no terms). Labels are the newsgroups in sorted order
    (``alt.atheism`` = 0, ``comp.graphics`` = 1, ...), taken from the training file.
    Documents keep the files' order.

    Args:
      vocab: ``coverage=0.95``, ``dev_fraction=0.0``, ``dev_seed=0``, as the module docstring says.

    Returns:
      TextData, label_names the newsgroups in sorted order. Real data: 11,293 / 7,528
      documents, 20 newsgroups.
    Raises:
      DataError: files missing (and no download or it failed), a file that is empty,
        not UTF-8 or has a malformed line, or a test newsgroup absent from train.
    """
    directory = NG20_ORIGIN.ensure(data_dir, NG20_FILES, download=download, verify=verify)
    tokens, groups = {}, {}
    for split in ("train", "test"):
        tokens[split], groups[split] = _read_20ng(directory / f"20ng-{split}-all-terms.txt")
    names = tuple(sorted(set(groups["train"])))
    unknown = sorted(set(groups["test"]) - set(names))
    if unknown:
        raise DataError(
            f"{directory / '20ng-test-all-terms.txt'}: newsgroup {unknown[0]!r} is not in "
            "the training file; the files do not belong together"
        )
    index = {g: i for i, g in enumerate(names)}
    labels = {split: [index[g] for g in groups[split]] for split in groups}
    return _text_data(tokens, labels, names, **vocab)


# ------------------------------------------------------------------------------- TFDS

TFDS_TEXT_SETS = ("imdb_reviews", "ag_news_subset")


def load_tfds_text(
    name: str, data_dir: DataDir = None, *, download: bool = True, **vocab
) -> TextData:
    """Load ``'imdb_reviews'`` or ``'ag_news_subset'`` through TensorFlow Datasets.

    Reads ``train`` and ``test`` with ``tfds.data_source`` (extra ``rhnzoo[tfds]``, no
    TensorFlow); `data_dir` is TFDS's data directory, where the set must be prepared
    as array_record (preparing needs TensorFlow, see `common.tfds_examples`). A
    document is the ``text`` feature (IMDB) or ``title + " " + description`` (AG News,
    backslashes replaced by spaces as in `load_agnews`), `tokenize`d; labels and
    label_names are TFDS's (IMDB neg = 0, pos = 1; AG News World, Sports, Business,
    Sci/Tech). Document order is TFDS's, not the loaders' above.

    Args:
      download: False (``--nodownload``): a set not prepared in `data_dir` fails at once
        (TFDS neither downloads nor prepares it).
      vocab: ``coverage=0.95``, ``dev_fraction=0.0``, ``dev_seed=0``, as the module docstring says.

    Raises: ValueError for another name; DataError if tensorflow-datasets is not
      installed or TFDS fails.
    """
    if name not in TFDS_TEXT_SETS:
        raise ValueError(f"load_tfds_text: name must be one of {TFDS_TEXT_SETS}, got {name!r}")

    def text(value) -> str:
        return value.decode("utf-8") if isinstance(value, bytes) else str(value)

    tokens, labels = {}, {}
    for split in ("train", "test"):
        examples, features = common.tfds_examples(name, split, data_dir, download=download)
        if name == "imdb_reviews":
            docs = (text(e["text"]) for e in examples)
        else:
            docs = (
                f"{text(e['title'])} {text(e['description'])}".replace("\\", " ") for e in examples
            )
        tokens[split] = [tokenize(d) for d in docs]
        labels[split] = [int(e["label"]) for e in examples]
    return _text_data(tokens, labels, features["label"].names, **vocab)
