"""rhnzoo.data.images: MNIST (idx files), CIFAR-100 (python pickles), TFDS, pixel sequences."""

import gzip
import hashlib
import io
import os
import pathlib
import pickle
import struct
import sys
import tarfile
import urllib.error

import numpy as np
from helpers import fake_fetch, idx_bytes, write_mnist
import pytest

from rhnzoo import data
from rhnzoo.data import common as data_common
from rhnzoo.data import images

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


# ------------------------------------------------------------------------------ MNIST


def small_mnist(rng=None):
    rng = rng or np.random.default_rng(1)
    return {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (7, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte.gz": np.array([5, 0, 4, 1, 9, 2, 1], np.uint8),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte.gz": np.array([7, 2, 1], np.uint8),
    }


def test_real_mnist():
    root = os.environ.get("RHNZOO_DATA")
    directory = pathlib.Path(root or "$RHNZOO_DATA") / "mnist"
    if not root or not all((directory / f).is_file() for f in MNIST_FILES):
        pytest.skip(f"real MNIST files not found in {directory} (set RHNZOO_DATA)")
    mnist = data.load_mnist(download=False)  # verify=True: the pinned sha256 sums
    assert mnist.train_images.shape == (60000, 28, 28)
    assert mnist.test_images.shape == (10000, 28, 28)
    assert mnist.train_images.dtype == mnist.test_images.dtype == np.uint8
    assert mnist.train_labels.dtype == mnist.test_labels.dtype == np.int32
    assert mnist.num_classes == 10 and mnist.label_names == tuple("0123456789")
    # Label histograms and first labels from shared/data/SOURCES.md.
    np.testing.assert_array_equal(
        np.bincount(mnist.train_labels),
        [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949],
    )
    np.testing.assert_array_equal(
        np.bincount(mnist.test_labels), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    )
    np.testing.assert_array_equal(mnist.train_labels[:10], [5, 0, 4, 1, 9, 2, 1, 3, 1, 4])
    assert mnist.train_images.max() == 255 and mnist.train_images.min() == 0
    assert abs(mnist.train_images.mean() - 33.32) < 0.01
    assert abs(mnist.test_images.mean() - 33.79) < 0.01


def test_mnist_generated_idx_files(monkeypatch, tmp_path, clean_env):
    arrays = small_mnist()
    write_mnist(tmp_path / "m", arrays)
    mnist = data.load_mnist(tmp_path / "m", download=False, verify=False)
    np.testing.assert_array_equal(mnist.train_images, arrays["train-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(mnist.test_images, arrays["t10k-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(mnist.train_labels, [5, 0, 4, 1, 9, 2, 1])
    np.testing.assert_array_equal(mnist.test_labels, [7, 2, 1])
    assert mnist.train_labels.dtype == np.int32 and mnist.train_images.dtype == np.uint8
    # Via $RHNZOO_DATA/mnist too.
    write_mnist(tmp_path / "root" / "mnist", arrays)
    monkeypatch.setenv("RHNZOO_DATA", str(tmp_path / "root"))
    np.testing.assert_array_equal(data.load_mnist(verify=False).test_labels, [7, 2, 1])


def test_mnist_checksum_is_checked_unless_verify_false(tmp_path, clean_env):
    write_mnist(tmp_path / "m", small_mnist())
    with pytest.raises(data.DataError, match="sha256 mismatch"):
        data.load_mnist(tmp_path / "m", download=False)


def _gz(payload):
    """Gzip with a fixed mtime, so the bytes (and test ids) do not depend on the clock."""
    return gzip.compress(payload, mtime=0)


@pytest.mark.parametrize(
    "name, payload, message",
    [
        (
            "train-labels-idx1-ubyte.gz",
            _gz(idx_bytes(np.zeros((7, 1), np.uint8))),
            "magic number 2050, expected 2049",
        ),
        (
            "t10k-images-idx3-ubyte.gz",
            _gz(idx_bytes(np.zeros((3, 28, 28)))[:-5]),
            "payload is 2347 bytes",
        ),
        (
            "t10k-images-idx3-ubyte.gz",
            _gz(idx_bytes(np.zeros((3, 28, 28))))[:-9],
            "not a complete gzip",
        ),
        ("train-images-idx3-ubyte.gz", b"not gzip at all", "not a complete gzip"),
        ("train-labels-idx1-ubyte.gz", _gz(b"\x00\x00\x08"), "magic number none"),
        ("train-labels-idx1-ubyte.gz", _gz(idx_bytes(np.zeros(6, np.uint8))), "6 labels"),
        (
            "train-labels-idx1-ubyte.gz",
            _gz(idx_bytes(np.full(7, 10, np.uint8))),
            r"outside 0\.\.9",
        ),
    ],
    ids=[
        "bad-magic",
        "short-payload",
        "truncated-gzip",
        "not-gzip",
        "short-header",
        "count-mismatch",
        "label-range",
    ],
)
def test_mnist_bad_files_are_one_line_errors(tmp_path, clean_env, name, payload, message):
    write_mnist(tmp_path / "m", small_mnist())
    (tmp_path / "m" / name).write_bytes(payload)
    with pytest.raises(data.DataError, match=message) as info:
        data.load_mnist(tmp_path / "m", download=False, verify=False)
    assert "\n" not in str(info.value) and name in str(info.value)


def test_mnist_missing_names_files_and_the_fixes(tmp_path, clean_env):
    for kwargs in ({"download": True}, {"download": False}):
        with pytest.raises(data.DataError) as info:
            data.load_mnist(tmp_path / "nowhere", **kwargs)
        message = str(info.value)
        assert "\n" not in message
        for part in MNIST_FILES + ("--data_dir", "RHNZOO_DATA=DIR with them in DIR/mnist"):
            assert part in message
        assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_mnist_download_tries_the_mirrors_in_order(monkeypatch, tmp_path, clean_env):
    payloads = write_mnist(tmp_path / "src", small_mnist())
    urls = []

    def fake_fetch(url, dest, timeout=60.0):
        urls.append(url)
        if url.startswith(images.MNIST_MIRRORS[0]):
            raise urllib.error.URLError("first mirror down")
        pathlib.Path(dest).write_bytes(payloads[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(data_common, "fetch", fake_fetch)
    with pytest.raises(data.DataError, match="sha256 mismatch"):  # downloads are always checked
        data.load_mnist(verify=False)
    assert not (clean_env / "mnist").exists()
    monkeypatch.setattr(
        images, "MNIST_SHA256", {n: hashlib.sha256(p).hexdigest() for n, p in payloads.items()}
    )
    urls.clear()
    mnist = data.load_mnist()
    np.testing.assert_array_equal(mnist.test_labels, [7, 2, 1])
    assert urls[:2] == [
        "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz",
        "https://storage.googleapis.com/cvdf-datasets/mnist/train-images-idx3-ubyte.gz",
    ]
    assert len(urls) == 8
    assert sorted(p.name for p in (clean_env / "mnist").iterdir()) == sorted(MNIST_FILES)
    assert list(clean_env.iterdir()) == [clean_env / "mnist"]  # temp dir removed
    data.load_mnist()  # from the cache
    assert len(urls) == 8


# -------------------------------------------------------------------- pixel sequences


def test_pixel_sequences_sequential_is_the_row_major_flatten():
    imgs = np.random.default_rng(0).integers(0, 256, (4, 28, 28), dtype=np.uint8)
    seq = data.pixel_sequences(imgs, permute=False)
    assert seq.shape == (4, 784) and seq.dtype == np.float32
    for t in (0, 27, 28, 100, 783):  # entry t is pixel (t // 28, t % 28)
        np.testing.assert_array_equal(seq[:, t], imgs[:, t // 28, t % 28] / np.float32(255))
    assert seq.min() >= 0.0 and seq.max() <= 1.0


def test_pixel_sequences_permuted_uses_one_fixed_bijection():
    imgs = np.random.default_rng(0).integers(0, 256, (2, 28, 28), dtype=np.uint8)
    index_images = np.stack([np.arange(784) // 4] * 2).reshape(2, 28, 28).astype(np.uint8)
    perm_seq = data.pixel_sequences(index_images, permute=True)
    plain = data.pixel_sequences(index_images, permute=False)
    expected_perm = np.random.default_rng(data.PMNIST_PERMUTATION_SEED).permutation(784)
    assert data.PMNIST_PERMUTATION_SEED == 0
    np.testing.assert_array_equal(perm_seq, plain[:, expected_perm])
    # Bijection: same multiset of pixels, every position used once.
    assert sorted(expected_perm) == list(range(784))
    np.testing.assert_array_equal(np.sort(perm_seq, axis=1), np.sort(plain, axis=1))
    assert not np.array_equal(perm_seq, plain)  # not the identity
    # Fixed across calls and across batches (the same permutation for every image).
    np.testing.assert_array_equal(
        data.pixel_sequences(imgs, permute=True)[1], data.pixel_sequences(imgs[1:], permute=True)[0]
    )
    np.testing.assert_array_equal(perm_seq, data.pixel_sequences(index_images, permute=True))
    assert not np.array_equal(perm_seq, data.pixel_sequences(index_images, permute=True, seed=1))


def test_pixel_sequences_rejects_other_shapes():
    with pytest.raises(ValueError, match=r"\[N, 28, 28\]"):
        data.pixel_sequences(np.zeros((2, 32, 32, 3), np.uint8), permute=False)


# -------------------------------------------------------------------------- CIFAR-100


class Py2Pickler(pickle._Pickler):
    """Writes str and bytes as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING) and NumPy's
    ``_reconstruct`` under its NumPy 1 module name, as Python 2 cPickle wrote the files."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[str] = save_py2_str
    dispatch[bytes] = save_py2_str


def py2_pickle(obj) -> bytes:
    buffer = io.BytesIO()
    Py2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


CIFAR_NAMES = [b"apple", b"aquarium_fish", b"baby", b"bear", b"beaver"]


def cifar_split(n, seed):
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"training batch 1 of 1",
        b"filenames": [b"img_%d.png" % i for i in range(n)],
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"fine_labels": [int(v) for v in rng.integers(0, 5, n)],
        b"coarse_labels": [0] * n,
    }


def cifar_tgz(members: dict, prefix="cifar-100-python/") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, obj in members.items():
            payload = obj if isinstance(obj, bytes) else py2_pickle(obj)
            info = tarfile.TarInfo(prefix + name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def cifar_members():
    return {
        "meta": {b"fine_label_names": CIFAR_NAMES, b"coarse_label_names": [b"x"]},
        "train": cifar_split(6, 0),
        "test": cifar_split(4, 1),
    }


def write_cifar(directory, payload):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cifar-100-python.tar.gz").write_bytes(payload)
    return directory


def test_cifar_fixture_writer_is_a_python2_style_pickle(cifar_members):
    raw = py2_pickle(cifar_members["train"])
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in raw and b"X" not in raw[:3]  # no BINUNICODE
    back = pickle.loads(raw, encoding="bytes")
    np.testing.assert_array_equal(back[b"data"], cifar_members["train"][b"data"])
    assert back[b"filenames"][0] == b"img_0.png"


def test_cifar100_generated_archive(tmp_path, clean_env, cifar_members):
    directory = write_cifar(tmp_path / "c", cifar_tgz(cifar_members))
    cifar = data.load_cifar100(directory, download=False, verify=False)
    assert cifar.label_names == ("apple", "aquarium_fish", "baby", "bear", "beaver")
    assert cifar.num_classes == 5
    assert cifar.train_images.shape == (6, 32, 32, 3) and cifar.test_images.shape == (4, 32, 32, 3)
    assert cifar.train_images.dtype == np.uint8 and cifar.train_labels.dtype == np.int32
    np.testing.assert_array_equal(cifar.train_labels, cifar_members["train"][b"fine_labels"])
    np.testing.assert_array_equal(cifar.test_labels, cifar_members["test"][b"fine_labels"])
    # Row layout: 1024 red, 1024 green, 1024 blue values, each plane row-major 32x32.
    for split, got in (("train", cifar.train_images), ("test", cifar.test_images)):
        rows = cifar_members[split][b"data"]
        for i, y, x, c in [
            (0, 0, 0, 0),
            (1, 5, 7, 1),
            (2, 31, 0, 2),
            (3, 31, 31, 2),
            (0, 0, 31, 1),
        ]:
            assert got[i, y, x, c] == rows[i, c * 1024 + y * 32 + x]
    with pytest.raises(data.DataError, match="sha256 mismatch"):
        data.load_cifar100(directory, download=False)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"test": None}, "has no member cifar-100-python/test"),
        ({"meta": {b"other": 1}}, "no list b'fine_label_names'"),
        (
            {"train": {b"data": np.zeros((2, 3072), np.uint8), b"fine_labels": [0, 1, 2]}},
            "2 images but 3 labels",
        ),
        (
            {"train": {b"data": np.zeros((2, 1024), np.uint8), b"fine_labels": [0, 1]}},
            r"\(2, 1024\), expected uint8",
        ),
        (
            {"test": {b"data": np.zeros((1, 3072), np.uint8), b"fine_labels": [5]}},
            r"outside 0\.\.4",
        ),
        ({"train": {b"fine_labels": [0]}}, "not a dict with b'data'"),
        ({"train": b"cos\nsystem\n(S'echo hi'\ntR."}, "global os.system is not allowed"),
    ],
)
def test_cifar100_bad_members(tmp_path, clean_env, cifar_members, change, message):
    members = {**cifar_members, **change}
    members = {k: v for k, v in members.items() if v is not None}
    directory = write_cifar(tmp_path / "c", cifar_tgz(members))
    with pytest.raises(data.DataError, match=message) as info:
        data.load_cifar100(directory, download=False, verify=False)
    assert "\n" not in str(info.value) and "cifar-100-python.tar.gz" in str(info.value)


def test_cifar100_not_an_archive_and_missing(tmp_path, clean_env):
    directory = write_cifar(tmp_path / "c", b"\x1f\x8b garbage")
    with pytest.raises(data.DataError, match="not a readable tar.gz") as info:
        data.load_cifar100(directory, download=False, verify=False)
    assert "\n" not in str(info.value)
    with pytest.raises(data.DataError) as info:
        data.load_cifar100(tmp_path / "nowhere")  # download fails (no network)
    for part in ("cifar-100-python.tar.gz", "download failed", "DIR/cifar100", images.CIFAR100_URL):
        assert part in str(info.value)
    assert not (tmp_path / "nowhere").exists()


def test_cifar100_download_is_checked_and_cached(monkeypatch, tmp_path, clean_env, cifar_members):
    payload = cifar_tgz(cifar_members)
    urls = fake_fetch(monkeypatch, payload)
    monkeypatch.setattr(
        images, "CIFAR100_SHA256", {"cifar-100-python.tar.gz": hashlib.sha256(payload).hexdigest()}
    )
    assert data.load_cifar100().num_classes == 5
    assert urls == ["https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"]
    assert [p.name for p in (clean_env / "cifar100").iterdir()] == ["cifar-100-python.tar.gz"]
    data.load_cifar100()
    assert len(urls) == 1


# ------------------------------------------------------------------------------- TFDS


@pytest.mark.parametrize(
    "name, shape, num_classes", [("mnist", (28, 28), 10), ("cifar100", (32, 32, 3), 100)]
)
def test_tfds_images_with_mock_data(name, shape, num_classes):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        got = data.load_tfds_images(name)
        expected = tfds.data_source(name, split="test")
        first_test = (np.asarray(expected[0]["image"]), int(expected[0]["label"]))
    assert "tensorflow" not in sys.modules  # tfds.data_source works without TensorFlow
    assert got.train_images.shape == (6, *shape) and got.test_images.shape == (6, *shape)
    assert got.train_images.dtype == np.uint8 and got.test_labels.dtype == np.int32
    assert got.num_classes == num_classes
    np.testing.assert_array_equal(got.test_images[0], first_test[0].reshape(shape))
    assert got.test_labels[0] == first_test[1]


def test_tfds_images_errors(monkeypatch):
    with pytest.raises(ValueError, match="mnist"):
        data.load_tfds_images("svhn")
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # not installed
    with pytest.raises(data.DataError, match=r"pip install 'rhnzoo\[tfds\]'") as info:
        data.load_tfds_images("mnist")
    assert "\n" not in str(info.value)
