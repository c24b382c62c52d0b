"""Shared data machinery: where data lives, download-verify-cache, token streams.

Data directory resolution (see `resolve_data_dir`): an explicit ``data_dir``
(the CLI's ``--data_dir``), else ``$RHNZOO_DATA/<name>``, else the user cache
``${XDG_CACHE_HOME:-~/.cache}/rhnzoo/<name>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pathlib
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np


# A loader's ``data_dir``: the data set's directory itself (``--data_dir``), or None
# (`resolve_data_dir`: ``$RHNZOO_DATA/<name>``, else the user cache).
DataDir = str | os.PathLike | None


class DataError(Exception):
    """Missing or corrupt data; the message is one line saying what and how to fix it."""


# Where a data set is read from: its original files (download, sha256, cache) or
# TensorFlow Datasets (``--data_source``).
SOURCES = ("files", "tfds")


def check_source(source: str) -> None:
    """ValueError (one line) unless ``source`` is ``'files'`` or ``'tfds'``."""
    if source not in SOURCES:
        raise ValueError(f"--data_source must be 'files' or 'tfds', got {source!r}")


def resolve_data_dir(name: str, data_dir: DataDir = None) -> pathlib.Path:
    """Directory holding data set `name`'s files: `data_dir` as is, else
    ``$RHNZOO_DATA/<name>``, else ``${XDG_CACHE_HOME:-~/.cache}/rhnzoo/<name>``."""
    if data_dir is not None:
        return pathlib.Path(data_dir)
    if os.environ.get("RHNZOO_DATA"):
        return pathlib.Path(os.environ["RHNZOO_DATA"]) / name
    return user_cache_dir(name)


def user_cache_dir(name: str) -> pathlib.Path:
    """``${XDG_CACHE_HOME:-~/.cache}/rhnzoo/<name>``: downloads, and what rhnzoo derives
    from a data set (e.g. word vectors), which never go into a shared data directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(cache) / "rhnzoo" / name


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_sha256(path: pathlib.Path, expected: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise DataError(
            f"{path}: sha256 mismatch (expected {expected[:12]}..., got {actual[:12]}...); "
            "delete the file to re-download it, or replace it with the canonical copy"
        )


def ensure_files(
    name: str,
    data_dir: DataDir,
    files: Mapping[str, str | None],
    *,
    download: Callable[[pathlib.Path], None] | None,
    offline_hint: str,
    verify: bool = True,
) -> pathlib.Path:
    """Make sure data set `name`'s directory, ``resolve_data_dir(name, data_dir)``, holds
    every file in `files`, downloading the missing ones.

    Args:
      name: the data set's directory name (e.g. ``'ptb'``): the directory is
        ``$RHNZOO_DATA/<name>`` or the user cache's when `data_dir` is None, and the
        missing-files message tells the user to put the files in ``DIR/<name>`` when
        using ``RHNZOO_DATA=DIR``, whatever the directory is.
      data_dir: the directory itself (``--data_dir``), or None.
      files: file name -> sha256 hex, or None for a file with no published checksum
        (then it is never checked).
      download: ``download(tmp)`` fetches the missing files, writing them into `tmp`,
        a temporary directory next to the directory; they are checksummed (always)
        and then moved into place with `os.replace`, so a failed download leaves
        nothing behind. None: no download.
      offline_hint: where to get the files by hand, for the error message.
      verify: checksum the files already present.

    Returns: the directory, a `pathlib.Path`.
    Raises: DataError if files are missing and `download` is None or fails
      (`OSError`, which includes `urllib.error.URLError`, or `tarfile.TarError`),
      naming the files, the directory and `offline_hint` (e.g. where to get
      them); DataError if a download does not produce a file or a checksum does
      not match.
    """
    directory = resolve_data_dir(name, data_dir)
    missing = [file for file in files if not (directory / file).is_file()]
    if missing:
        reason = "download disabled"
        # a failed download leaves none of the folders it made (refused: nothing written)
        with removed_if_left_empty(directory.parent):
            if download is not None:
                directory.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(
                    prefix=f".{directory.name}.", dir=directory.parent
                ) as tmp:
                    try:
                        download(pathlib.Path(tmp))
                    except (OSError, tarfile.TarError) as e:
                        reason = f"download failed: {e}".replace("\n", " ")
                    else:
                        for file in missing:
                            if not (pathlib.Path(tmp) / file).is_file():
                                raise DataError(f"download did not produce {file}; {offline_hint}")
                            if files[file] is not None:
                                _check_sha256(pathlib.Path(tmp) / file, files[file])
                        directory.mkdir(parents=True, exist_ok=True)
                        for file in missing:
                            os.replace(pathlib.Path(tmp) / file, directory / file)
                        missing = []
            if missing:
                raise DataError(
                    f"missing {', '.join(missing)} in {directory} ({reason}); {offline_hint}; "
                    f"put the files there, or pass --data_dir DIR holding them, "
                    f"or set RHNZOO_DATA=DIR with them in DIR/{name}"
                )
    if verify:
        for file, expected in files.items():
            if expected is not None:
                _check_sha256(directory / file, expected)
    return directory


@contextlib.contextmanager
def removed_if_left_empty(path: pathlib.Path) -> Iterator[None]:
    """The block; when it raises, ``path`` and the ancestors it lacked before the block
    are removed where they are still empty folders (a refused call leaves none behind;
    what the block wrote stays)."""
    new = []
    while not path.exists() and path != path.parent:
        new.append(path)
        path = path.parent
    try:
        yield
    except BaseException:
        for folder in new:  # deepest first; a folder holding files stays, and its parents
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a data set's files come from: what every loader and the registry pass to
    `ensure_files` besides the files themselves.

    Attributes:
      directory: the data set's directory name (``name`` of `ensure_files`).
      download: ``download(tmp)`` writing the files into `tmp`, or None (no download).
      offline_hint: where to get the files by hand (in the missing-files error).
    """

    directory: str
    download: Callable[[pathlib.Path], None] | None
    offline_hint: str

    def ensure(
        self,
        data_dir: DataDir,
        files: Mapping[str, str | None],
        *,
        download: bool = True,
        verify: bool = True,
    ) -> pathlib.Path:
        """`ensure_files` of `files` (name -> sha256 or None) in this origin's directory,
        downloading the missing ones when `download`; returns the directory."""
        return ensure_files(
            self.directory,
            data_dir,
            files,
            download=self.download if download else None,
            verify=verify,
            offline_hint=self.offline_hint,
        )


class Labelled:
    """The base of the labelled sets (`rhnzoo.data.ImageData`, `rhnzoo.data.TextData`):
    ``label_names[k]`` names class k."""

    label_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.label_names)


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
    """A tokenised corpus: 1-D integer id arrays per split (int32 for words, uint8 for
    byte-sized character vocabularies); `vocab[i]` is the symbol of id i."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    vocab: tuple[str, ...]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def fetch(url: str, dest: pathlib.Path, timeout: float = 60.0) -> None:
    """Download `url` to file `dest` (raises urllib.error.URLError / OSError)."""
    with urllib.request.urlopen(url, timeout=timeout) as response, open(dest, "wb") as f:
        shutil.copyfileobj(response, f)


def fetch_first(urls: Sequence[str], dest: pathlib.Path) -> None:
    """Download to `dest` from the first of `urls` (mirrors, tried in order) that works.

    Raises: the last mirror's OSError (urllib.error.URLError is one) if all fail.
    """
    error: OSError | None = None
    for url in urls:
        try:
            fetch(url, dest)
            return
        except OSError as e:
            error = e
    raise error if error is not None else OSError("no URL to download from")


def extract_members(
    archive: pathlib.Path, members: Mapping[str, pathlib.Path], source: str
) -> None:
    """Copy tar members (normalised names, e.g. ``'simple-examples/data/ptb.train.txt'``)
    of `archive` to the given paths, streaming.

    Raises: tarfile.TarError naming `source` if a member is missing (or the archive
      is corrupt), OSError if writing fails.
    """
    with tarfile.open(archive, "r:*") as tar:
        found = {os.path.normpath(m.name): m for m in tar.getmembers() if m.isfile()}
        for member, dest in members.items():
            if member not in found:
                raise tarfile.TarError(f"{source} has no member {member}")
            with tar.extractfile(found[member]) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def fetch_members(url: str, archive: pathlib.Path, members: Mapping[str, pathlib.Path]) -> None:
    """Download the tar archive at `url` to `archive`, copy its `members` out as
    `extract_members` does, and delete the archive (whether or not that worked).

    Raises: OSError if the download or a write fails, tarfile.TarError naming `url`
      if a member is missing or the archive is corrupt.
    """
    fetch(url, archive)
    try:
        extract_members(archive, members, url)
    finally:
        archive.unlink(missing_ok=True)


def decode_text(raw: bytes, where: str | os.PathLike) -> str:
    """`raw` decoded as UTF-8, for a file (or archive member) named `where`.

    Raises: DataError "WHERE is empty" if `raw` is empty or only whitespace, and
      "WHERE is not UTF-8 text (byte 0x93 at offset 1234)" if it does not decode.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{where} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})"
        ) from None
    if not text.strip():
        raise DataError(f"{where} is empty")
    return text


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of file `path`; DataError (one line naming the file) if it is
    empty / whitespace only or not UTF-8, as `decode_text`."""
    return decode_text(pathlib.Path(path).read_bytes(), path)


def encode_splits(
    splits: Mapping[str, Sequence[str]],
    vocab: Sequence[str],
    paths: Mapping[str, pathlib.Path],
    dtype: np.dtype | type,
    unit: str,
) -> Corpus:
    """A `Corpus` of `splits` (``'train'`` / ``'valid'`` / ``'test'`` -> symbols) encoded
    as 1-D `dtype` arrays of their index in `vocab` (the training symbols).

    Raises: DataError naming ``paths[split]`` and the `unit` (``'word'``, ``'symbol'``)
      if a symbol of a split is not in `vocab`: the files do not belong together.
    """
    index = {symbol: i for i, symbol in enumerate(vocab)}
    ids = {}
    for split, symbols in splits.items():
        try:
            ids[split] = np.fromiter(map(index.__getitem__, symbols), dtype, len(symbols))
        except KeyError as e:
            raise DataError(
                f"{paths[split]}: {unit} {e.args[0]!r} is not in the "
                "train vocabulary; the files do not belong together"
            ) from None
    return Corpus(vocab=tuple(vocab), **ids)


def import_tfds():
    """`tensorflow_datasets`, imported on first use (the optional extra ``rhnzoo[tfds]``;
    TensorFlow itself is not needed for ``tfds.data_source``).

    Raises: DataError (one line) if it is not installed.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise DataError(
            f"--data_source=tfds needs tensorflow-datasets ({e}); "
            "pip install 'rhnzoo[tfds]', or use the default data source"
        ) from None
    return tfds


@contextlib.contextmanager
def _absl_quiet():
    """absl's logger (which TFDS logs to) and urllib3's (its download's ``Retrying (...)``
    warnings, offline) silent for the block, as they were after it."""
    import logging as pylogging

    from absl import logging

    loggers = [logging.get_absl_logger(), pylogging.getLogger("urllib3")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(60)  # above CRITICAL (50)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _tfds_prepared(name: str, data_dir: str | os.PathLike) -> bool:
    """Whether TFDS's `data_dir` holds a prepared version of `name` (a
    ``dataset_info.json`` under ``data_dir/name/[config/]version``)."""
    return any((pathlib.Path(data_dir) / name).rglob("dataset_info.json"))


# The host TFDS downloads from first (its GCS mirror of prepared sets, and most sets'
# files): a name that does not resolve means no network, and TFDS's download would
# retry for minutes before failing.
TFDS_HOST = "storage.googleapis.com"


def _offline(host: str = TFDS_HOST, timeout: float = 5.0) -> str | None:
    """Why ``host`` cannot be reached, when that is certain at once: its name does not
    resolve (no network, no DNS); None where it resolves, the look-up takes longer than
    ``timeout`` seconds, or a proxy is set (the proxy resolves names)."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    import socket
    import threading

    found: list[str | None] = []

    def look_up():
        try:
            socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)
            found.append(None)
        except socket.gaierror as e:
            found.append(f"{host} does not resolve: {e.strerror or e}")
        except OSError:
            found.append(None)

    thread = threading.Thread(target=look_up, name="rhnzoo-tfds-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return found[0] if found else None


def _tfds_root(tfds, data_dir: DataDir) -> pathlib.Path:
    """TFDS's data directory: ``data_dir``, else ``$TFDS_DATA_DIR``, else TFDS's default
    (``~/tensorflow_datasets``)."""
    if data_dir is not None:
        return pathlib.Path(data_dir)
    try:
        default = tfds.core.constants.DATA_DIR
    except AttributeError:
        default = "~/tensorflow_datasets"
    return pathlib.Path(os.environ.get("TFDS_DATA_DIR") or default).expanduser()


@contextlib.contextmanager
def _removed_on_failure(root: pathlib.Path, name: str) -> Iterator[None]:
    """What a failed TFDS download of ``name`` made in its data directory ``root``
    removed when the block raises: ``root/name`` and ``root/downloads`` where they were
    not there before (partial files, empty folders), and ``root`` itself where it was
    not there before and is then empty."""
    existed = root.is_dir()
    before = {p.name for p in root.iterdir()} if existed else set()
    try:
        yield
    except BaseException:
        for made in (name, "downloads"):
            if made not in before and (root / made).is_dir():
                shutil.rmtree(root / made, ignore_errors=True)
        if not existed and root.is_dir() and not any(root.iterdir()):
            root.rmdir()
        raise


def tfds_examples(name: str, split: str, data_dir: DataDir = None, *, download: bool = True):
    """All examples of TFDS data set `name`'s `split`, read with ``tfds.data_source``
    (ArrayRecord files, random access, no TensorFlow), and the source's features.

    `data_dir` is TFDS's own data directory (default: TFDS's, ``~/tensorflow_datasets``).
    Reading a prepared data set does not need TensorFlow, but preparing one does
    (TFDS's extraction step imports it; tensorflow-datasets 4.9.10): prepare it once
    where TensorFlow is installed, ``tfds build NAME --file_format=array_record``.
    `download` is ``tfds.data_source``'s: False (``--nodownload``) reads only a set
    already prepared in `data_dir`, and one that is not fails at once, with nothing
    fetched or written. True: TFDS downloads and prepares a missing set first, which
    without a network retried for minutes; so where TFDS's host does not resolve
    (:func:`_offline`) TFDS is asked without downloading, which fails at once if it has
    no such set, and a download that fails leaves none of the folders it made
    (:func:`_removed_on_failure`); its urllib3 retry warnings are muted as its own log
    lines are, and the error line names ``--nodownload``.

    Returns: (list of example dicts of NumPy values, ``FeaturesDict``).
    Raises: DataError (one line) if tensorflow-datasets is missing or TFDS fails.
    """
    tfds = import_tfds()
    root = _tfds_root(tfds, data_dir)
    folder = name.split(":")[0].split("/")[0]  # "name[/config][:version]"
    fetches = download and not _tfds_prepared(folder, root)
    offline = _offline() if fetches else None
    try:
        # e.g. "W... has no dataset_info.json", urllib3's retries: the failure is our line
        with (
            _absl_quiet(),
            _removed_on_failure(root, folder) if fetches else contextlib.nullcontext(),
        ):
            # offline, only what TFDS has (fails at once; downloading retried for minutes)
            fetch = download and offline is None
            source = tfds.data_source(name, split=split, data_dir=data_dir, download=fetch)
        return [source[i] for i in range(len(source))], source.dataset_info.features
    except Exception as e:  # noqa: BLE001 - any TFDS failure becomes one line
        if offline is not None:
            raise DataError(
                f"TFDS {name!r} is not prepared in {root} and cannot be downloaded: no "
                f"network ({offline}); prepare it where there is one (tfds build {name} "
                f"--data_dir={root} --file_format=array_record, which needs TensorFlow), and "
                "pass --nodownload to read only a prepared set, failing at once without one"
            ) from None
        if not download and data_dir is not None and not _tfds_prepared(name, data_dir):
            raise DataError(  # TFDS's own message then speaks of a set prepared as tfrecord
                f"TFDS {name!r} is not prepared in {data_dir} (--nodownload: nothing is "
                f"fetched; prepare it as array_record, which needs TensorFlow: tfds build "
                f"{name} --data_dir={data_dir} --file_format=array_record)"
            ) from None
        message = " ".join(f"{type(e).__name__}: {e}".split())
        flag = "" if download else ", download=False"
        where = f"in {data_dir}" if data_dir is not None else "in TFDS's data directory"
        fetched = (  # the download failed: --nodownload is the quick way to that answer
            "; --nodownload reads only a prepared set, and fails at once without one"
            if fetches
            else ""
        )
        raise DataError(
            f"tfds.data_source({name!r}, split={split!r}{flag}) failed ({message}); TFDS "
            f"needs the set prepared as array_record {where}"
            f"{'' if download else ' (--nodownload: nothing is fetched)'} (preparing needs "
            f"TensorFlow: tfds build {name} --file_format=array_record){fetched}"
        ) from None


def batchify(tokens: np.ndarray, batch_size: int) -> np.ndarray:
    """Cut a token stream [N] into `batch_size` contiguous rows, dropping the remainder.

    Returns: int32 [batch_size, N // batch_size]; row b is tokens[b*L:(b+1)*L].
    Raises: ValueError if tokens is not 1-D, batch_size < 1 or N // batch_size < 2.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"batchify expects a 1-D token array, got shape {tokens.shape}")
    if batch_size < 1 or tokens.shape[0] // batch_size < 2:
        raise ValueError(
            f"batch_size={batch_size} invalid for {tokens.shape[0]} tokens: "
            "need 1 <= batch_size <= N // 2"
        )
    row_len = tokens.shape[0] // batch_size
    return tokens[: batch_size * row_len].reshape(batch_size, row_len).astype(np.int32)


def num_windows(row_len: int, num_steps: int) -> int:
    """Truncated-BPTT windows per epoch, (row_len - 1) // num_steps; window i has
    inputs rows[:, i*T:(i+1)*T] and targets rows[:, i*T+1:(i+1)*T+1].

    Raises: ValueError if num_steps < 1 or there is no full window.
    """
    if num_steps < 1 or (row_len - 1) // num_steps < 1:
        raise ValueError(
            f"no training window: rows of length {row_len} need row_len >= num_steps + 1 "
            f"with num_steps={num_steps} >= 1; use a smaller batch size or num_steps"
        )
    return (row_len - 1) // num_steps


def windows(rows: np.ndarray, num_steps: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (x, y), both int32 [B, num_steps], for each window of rows [B, L]; y is x shifted by
    one."""
    rows = np.asarray(rows, dtype=np.int32)
    for i in range(num_windows(rows.shape[1], num_steps)):
        start = i * num_steps
        yield rows[:, start : start + num_steps], rows[:, start + 1 : start + num_steps + 1]
