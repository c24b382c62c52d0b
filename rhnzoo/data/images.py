"""Image classification sets: MNIST (LeCun et al. 1998), CIFAR-100 (Krizhevsky 2009),
the TFDS route to both, and MNIST as pixel sequences (sequential / permuted MNIST).

MNIST is read from the four original idx files (gzip), CIFAR-100 from the authors'
``cifar-100-python.tar.gz``. Both follow the data-directory protocol of
`rhnzoo.data.common.resolve_data_dir` (``--data_dir``, else ``$RHNZOO_DATA/<name>``,
else the user cache), download from the standard source when absent, and check
pinned sha256 sums. Pixels stay ``uint8`` (0..255); models divide by 255.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import pathlib
import pickle
import tarfile
import zlib

import numpy as np

from rhnzoo.data import common
from rhnzoo.data.common import DataDir, DataError


@dataclasses.dataclass(frozen=True, eq=False)
class ImageData(common.Labelled):
    """A labelled image set: ``uint8`` images ``[N, H, W]`` (grey) or ``[N, H, W, C]``
    (colour), ``int32`` labels ``[N]`` in ``0 .. num_classes - 1``; ``label_names[k]``
    names class k."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    label_names: tuple[str, ...]


def _image_data(where, train_images, train_labels, test_images, test_labels, label_names):
    """ImageData after checking that images and labels agree; a DataError names
    ``where[0]`` (train) or ``where[1]`` (test), the file holding the labels."""
    for split_where, images, labels in (
        (where[0], train_images, train_labels),
        (where[1], test_images, test_labels),
    ):
        if len(images) != len(labels):
            raise DataError(f"{split_where}: {len(images)} images but {len(labels)} labels")
        if len(labels) and not 0 <= labels.min() <= labels.max() < len(label_names):
            raise DataError(
                f"{split_where}: labels span {labels.min()}..{labels.max()}, "
                f"outside 0..{len(label_names) - 1}"
            )
    return ImageData(
        train_images=np.ascontiguousarray(train_images, np.uint8),
        train_labels=np.asarray(train_labels, np.int32),
        test_images=np.ascontiguousarray(test_images, np.uint8),
        test_labels=np.asarray(test_labels, np.int32),
        label_names=tuple(label_names),
    )


# ------------------------------------------------------------------------------ MNIST

# shared/data/SOURCES.md (mnist section); the md5s of these files are the canonical
# ones published for the LeCun files (f68b3c2d..., d53e105e..., 9fb629c4..., ec29112d...),
# the values torchvision checks.
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",  # noqa: E501
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",  # noqa: E501
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
# Mirrors tried in order (yann.lecun.com no longer serves the files reliably): the
# one torchvision uses first, then Google's CVDF copy.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension
IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions


def read_idx(path: str | os.PathLike, magic: int) -> np.ndarray:
    """Read a gzip-compressed idx file of unsigned bytes (LeCun's MNIST format).

    The header is a big-endian uint32 magic number ``0x0000080D`` (``08`` = unsigned
    byte, ``D`` = number of dimensions: 2049 for labels, 2051 for images), then D
    big-endian uint32 sizes, then the bytes in row-major order.

    Returns: uint8 array of the header's shape (``[N]`` labels, ``[N, 28, 28]`` images).
    Raises: DataError (one line naming the file) if it is not gzip, is truncated,
      has another magic number than `magic`, or its payload is not the header's size.
    """
    path = pathlib.Path(path)
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path} is not a complete gzip file ({e})") from None
    ndim = magic & 0xFF
    if len(raw) < 4 or int.from_bytes(raw[:4], "big") != magic:
        found = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else "none"
        raise DataError(f"{path}: idx magic number {found}, expected {magic}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: idx header truncated ({len(raw)} bytes)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    size = int(np.prod(shape))
    if len(raw) - header != size:
        raise DataError(
            f"{path}: idx payload is {len(raw) - header} bytes, header {shape} says {size}"
        )
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def _download_mnist(tmp: pathlib.Path) -> None:
    for name in MNIST_SHA256:
        common.fetch_first([mirror + name for mirror in MNIST_MIRRORS], tmp / name)


MNIST_ORIGIN = common.Origin("mnist", _download_mnist, f"they are at {MNIST_MIRRORS[0]}<file>")


def load_mnist(
    data_dir: DataDir = None, *, download: bool = True, verify: bool = True
) -> ImageData:
    """Load MNIST from the idx files in `resolve_data_dir('mnist', data_dir)`.

    Files ``{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``; when missing and
    `download` is true they are fetched from MNIST_MIRRORS (each file from the first
    mirror that answers) and checked against MNIST_SHA256. `verify=False` skips the
    check of files already on disk (your own copies or test fixtures).

    Returns:
      ImageData with uint8 images ``[N, 28, 28]`` (0 = background, 255 = ink), int32
      labels, label_names ``'0'..'9'``. Real data: 60,000 train / 10,000 test.
    Raises:
      DataError: missing files (and no download or it failed: the message names the
        files and where to put them), checksum mismatch, a file that is not a valid
        idx file, or image and label counts that differ.
    """
    directory = MNIST_ORIGIN.ensure(data_dir, MNIST_SHA256, download=download, verify=verify)
    return _image_data(
        (directory / "train-labels-idx1-ubyte.gz", directory / "t10k-labels-idx1-ubyte.gz"),
        read_idx(directory / "train-images-idx3-ubyte.gz", IDX_IMAGES_MAGIC),
        read_idx(directory / "train-labels-idx1-ubyte.gz", IDX_LABELS_MAGIC),
        read_idx(directory / "t10k-images-idx3-ubyte.gz", IDX_IMAGES_MAGIC),
        read_idx(directory / "t10k-labels-idx1-ubyte.gz", IDX_LABELS_MAGIC),
        tuple(str(k) for k in range(10)),
    )


# -------------------------------------------------------------------------- CIFAR-100

CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_FILE = "cifar-100-python.tar.gz"
# The archive (169,001,437 bytes; the authors publish md5 eb9058c3a382ffc7106e4002c42a8d85)
# is cached as is and its sha256 pinned. The value is the one pinned by torchvision
# (pytorch/vision torchvision/prototype/datasets/_builtin/cifar.py, Cifar100._SHA256,
# commit c7c60ea2) and by TensorFlow's Keras loader (keras/datasets/cifar100.py,
# ``get_file(..., file_hash=...)``).
CIFAR100_SHA256 = {
    CIFAR100_FILE: "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7"
}
_CIFAR100_MEMBERS = ("train", "test", "meta")  # under cifar-100-python/

# The pickles (Python 2 cPickle) hold NumPy arrays; `_ArraysOnlyUnpickler` allows the
# globals that rebuild them, under their NumPy 1 and NumPy 2 module names, and no other.
_RECONSTRUCT = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
}


def _reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct  # NumPy >= 2
    except ImportError:  # pragma: no cover - NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Unpickler that allows only the globals that rebuild NumPy arrays (``_reconstruct``,
    ``ndarray``, ``dtype``), so a tampered file cannot run code."""

    def find_class(self, module: str, name: str):
        if (module, name) in _RECONSTRUCT:
            return _reconstruct()
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")


def _download_cifar100(tmp: pathlib.Path) -> None:
    common.fetch(CIFAR100_URL, tmp / CIFAR100_FILE)


CIFAR100_ORIGIN = common.Origin(
    "cifar100", _download_cifar100, f"it is {CIFAR100_URL} (keep the .tar.gz, do not extract it)"
)


def _read_cifar_archive(path: pathlib.Path) -> dict[str, dict]:
    """Stream the archive once and unpickle members ``cifar-100-python/{train,test,meta}``
    (``encoding='bytes'``: keys and strings stay bytes, as written by Python 2)."""
    found: dict[str, dict] = {}
    member = None
    try:
        with tarfile.open(path, "r:gz") as tar:
            for member in tar:
                parts = pathlib.PurePosixPath(member.name).parts
                if (
                    member.isfile()
                    and parts[-2:-1] == ("cifar-100-python",)
                    and parts[-1] in _CIFAR100_MEMBERS
                ):
                    with tar.extractfile(member) as f:
                        found[parts[-1]] = _ArraysOnlyUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, KeyError) as e:
        raise DataError(f"{path}: member {member.name} is not a CIFAR pickle ({e})") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path} is not a readable tar.gz archive ({e})") from None
    missing = [f"cifar-100-python/{m}" for m in _CIFAR100_MEMBERS if m not in found]
    if missing:
        raise DataError(f"{path} has no member {', '.join(missing)}")
    return found


def _cifar_split(path: pathlib.Path, split: str, raw) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 32, 32, 3], fine labels [N]) of one unpickled split."""
    where = f"{path}: cifar-100-python/{split}"
    if not isinstance(raw, dict) or b"data" not in raw or b"fine_labels" not in raw:
        raise DataError(f"{where} is not a dict with b'data' and b'fine_labels'")
    pixels, labels = raw[b"data"], np.asarray(raw[b"fine_labels"])
    if (
        not isinstance(pixels, np.ndarray)
        or pixels.dtype != np.uint8
        or pixels.ndim != 2
        or pixels.shape[1] != 3072
    ):
        shape = getattr(pixels, "shape", type(pixels).__name__)
        raise DataError(f"{where}: b'data' is {shape}, expected uint8 [N, 3072]")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{where}: b'fine_labels' is not a list of integers")
    # Each row is the 1024 red, then 1024 green, then 1024 blue values of a 32x32 image.
    return pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


def load_cifar100(
    data_dir: DataDir = None, *, download: bool = True, verify: bool = True
) -> ImageData:
    """Load CIFAR-100 (Krizhevsky 2009), python version, fine labels.

    Looks for ``cifar-100-python.tar.gz`` in `resolve_data_dir('cifar100', data_dir)`;
    the archive itself is the cached file (members are read from it on each load,
    about a second of gunzip). When it is missing and `download` is true it is
    fetched from CIFAR100_URL (161 MB) and checked against CIFAR100_SHA256;
    `verify=False` skips the check of an archive already on disk. Members
    ``cifar-100-python/{train,test,meta}`` are unpickled with an unpickler that allows
    only NumPy array globals (``encoding='bytes'``): ``b'data'`` (uint8 [N, 3072], the
    R, G and B planes of a 32x32 image), ``b'fine_labels'`` and meta's
    ``b'fine_label_names'``.

    Returns:
      ImageData with uint8 images ``[N, 32, 32, 3]`` (height, width, RGB), int32 fine
      labels 0..99, label_names from meta (``'apple'``, ``'aquarium_fish'``, ...).
      Real data: 50,000 train / 10,000 test (500 / 100 per class).
    Raises:
      DataError: archive missing (and no download, or it failed), checksum mismatch,
        not a readable tar.gz, members missing or not of this format.
    """
    directory = CIFAR100_ORIGIN.ensure(data_dir, CIFAR100_SHA256, download=download, verify=verify)
    path = directory / CIFAR100_FILE
    members = _read_cifar_archive(path)
    names = members["meta"].get(b"fine_label_names") if isinstance(members["meta"], dict) else None
    if not isinstance(names, list) or not all(isinstance(n, bytes) for n in names):
        raise DataError(f"{path}: cifar-100-python/meta has no list b'fine_label_names'")
    train_images, train_labels = _cifar_split(path, "train", members["train"])
    test_images, test_labels = _cifar_split(path, "test", members["test"])
    return _image_data(
        (f"{path}: cifar-100-python/train", f"{path}: cifar-100-python/test"),
        train_images,
        train_labels,
        test_images,
        test_labels,
        tuple(n.decode("ascii", "replace") for n in names),
    )


# ------------------------------------------------------------------------------- TFDS

TFDS_IMAGE_SETS = ("mnist", "cifar100")


def load_tfds_images(name: str, data_dir: DataDir = None, *, download: bool = True) -> ImageData:
    """Load ``'mnist'`` or ``'cifar100'`` through TensorFlow Datasets (``--data_source=tfds``).

    Reads the ``train`` and ``test`` splits with ``tfds.data_source`` (needs the extra
    ``rhnzoo[tfds]``; TensorFlow is not imported). `data_dir` is TFDS's data directory
    (default TFDS's own). The set must be prepared there in TFDS's array_record format;
    preparing needs TensorFlow (see `rhnzoo.data.common.tfds_examples`), reading does not.
    ``download=False`` (``--nodownload``): a set not prepared there fails at once
    (TFDS neither downloads nor prepares it).

    Returns: ImageData as `load_mnist` / `load_cifar100` (MNIST ``[N, 28, 28]``, the
      channel axis of TFDS's ``[28, 28, 1]`` dropped; CIFAR-100 ``[N, 32, 32, 3]`` with
      TFDS's ``label``, the fine label), label_names from TFDS's ClassLabel.
    Raises: ValueError for another name; DataError if tensorflow-datasets is not
      installed or TFDS fails.
    """
    if name not in TFDS_IMAGE_SETS:
        raise ValueError(f"load_tfds_images: name must be one of {TFDS_IMAGE_SETS}, got {name!r}")
    arrays = {}
    for split in ("train", "test"):
        examples, features = common.tfds_examples(name, split, data_dir, download=download)
        images = np.stack([np.asarray(e["image"], np.uint8) for e in examples])
        arrays[split] = (
            images[..., 0] if name == "mnist" else images,
            np.array([int(e["label"]) for e in examples], np.int32),
        )
    where = tuple(f"tfds {name} {split}" for split in ("train", "test"))
    return _image_data(where, *arrays["train"], *arrays["test"], tuple(features["label"].names))


# --------------------------------------------------------- sequential / permuted MNIST

# The seed of the one fixed pixel permutation of permuted MNIST (P-MNIST, Le, Jaitly &
# Hinton 2015, "A Simple Way to Initialize Recurrent Networks of Rectified Linear
# Units"): ``np.random.default_rng(PMNIST_PERMUTATION_SEED).permutation(784)``.
PMNIST_PERMUTATION_SEED = 0


def pixel_sequences(
    images: np.ndarray, *, permute: bool, seed: int = PMNIST_PERMUTATION_SEED
) -> np.ndarray:
    """MNIST images as sequences of 784 pixels (sequential MNIST, or permuted MNIST).

    Args:
      images: uint8 ``[N, 28, 28]``.
      permute: if true, reorder every sequence by the same fixed permutation
        ``np.random.default_rng(seed).permutation(784)`` (P-MNIST); else keep the
        row-major (scan-line) order.
      seed: the permutation's seed (default PMNIST_PERMUTATION_SEED = 0).

    Returns: float32 ``[N, 784]`` in [0, 1] (pixel / 255); entry t is pixel
      ``(t // 28, t % 28)``, or pixel ``perm[t]`` of the flattened image if `permute`.
    Raises: ValueError if images is not ``[N, 28, 28]``.
    """
    images = np.asarray(images)
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"pixel_sequences expects images [N, 28, 28], got {images.shape}")
    pixels = images.reshape(len(images), 784)
    if permute:
        pixels = pixels[:, np.random.default_rng(seed).permutation(784)]
    return pixels.astype(np.float32) / np.float32(255)
