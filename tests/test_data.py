"""Tests for rhnzoo.data (PTB loading, checksums/download, batching)."""

import hashlib
import os
import pathlib
import tarfile
import urllib.error

import numpy as np
import pytest
from helpers import fake_fetch, simple_examples_tgz, write_files

from rhnzoo import data
from rhnzoo.data import common as data_common
from rhnzoo.data import ptb as ptb_data

PTB_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")

# Tiny corpus. train counts (with one <eos> per line): a:4, <eos>:3, b:2, c:1, <unk>:1
# -> ids by (-count, word): a=0, <eos>=1, b=2, <unk>=3, c=4  ('<' sorts before 'c').
FIXTURE = {
    "ptb.train.txt": " a b a\n a c <unk>\nb a\n",  # last line: no leading space
    "ptb.valid.txt": " c a\n",
    "ptb.test.txt": " b\n <unk> a",  # no trailing newline: still one <eos> per line
}
FIXTURE_VOCAB = ("a", "<eos>", "b", "<unk>", "c")
FIXTURE_TRAIN = [0, 2, 0, 1, 0, 4, 3, 1, 2, 0, 1]
FIXTURE_VALID = [4, 0, 1]
FIXTURE_TEST = [2, 1, 3, 0, 1]


def write_fixture(directory: pathlib.Path, contents=FIXTURE) -> pathlib.Path:
    return write_files(directory, contents)


def check_fixture_corpus(corpus: data.Corpus) -> None:
    assert corpus.vocab == FIXTURE_VOCAB
    assert corpus.vocab_size == 5
    for split, expected in [
        ("train", FIXTURE_TRAIN),
        ("valid", FIXTURE_VALID),
        ("test", FIXTURE_TEST),
    ]:
        ids = getattr(corpus, split)
        assert ids.dtype == np.int32 and ids.ndim == 1
        np.testing.assert_array_equal(ids, expected)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No RHNZOO_DATA, cache under tmp_path/cache."""
    monkeypatch.delenv("RHNZOO_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "rhnzoo" / "ptb"


def test_real_ptb():
    root = os.environ.get("RHNZOO_DATA")
    ptb_dir = pathlib.Path(root or "$RHNZOO_DATA") / "ptb"
    if not root or not all((ptb_dir / f).is_file() for f in PTB_FILES):
        pytest.skip(f"real PTB files not found in {ptb_dir} (set RHNZOO_DATA)")
    corpus = data.load_ptb(download=False)
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (929589, 73760, 82430)
    assert corpus.vocab_size == 10000 == len(set(corpus.vocab))
    assert "<eos>" in corpus.vocab and "<unk>" in corpus.vocab
    for ids in (corpus.train, corpus.valid, corpus.test):
        assert ids.dtype == np.int32
        assert ids.min() >= 0 and ids.max() < corpus.vocab_size
    # One <eos> per line.
    with open(ptb_dir / "ptb.valid.txt", encoding="utf-8") as f:
        num_lines = sum(1 for _ in f)
    assert int(np.sum(corpus.valid == corpus.vocab.index("<eos>"))) == num_lines


def test_resolve_data_dir_order(monkeypatch, tmp_path, clean_env):
    assert data.resolve_data_dir("ptb") == clean_env
    monkeypatch.setenv("RHNZOO_DATA", str(tmp_path / "env"))
    assert data.resolve_data_dir("ptb") == tmp_path / "env" / "ptb"
    assert data.resolve_data_dir("ptb", tmp_path / "x") == tmp_path / "x"


def test_fixture_via_data_dir(tmp_path, clean_env):
    directory = write_fixture(tmp_path / "mine")
    check_fixture_corpus(data.load_ptb(directory, download=False, verify=False))


def test_fixture_via_env(monkeypatch, tmp_path, clean_env):
    write_fixture(tmp_path / "root" / "ptb")
    monkeypatch.setenv("RHNZOO_DATA", str(tmp_path / "root"))
    check_fixture_corpus(data.load_ptb(download=False, verify=False))


def test_unknown_eval_word(tmp_path, clean_env):
    directory = write_fixture(tmp_path / "mine", {**FIXTURE, "ptb.test.txt": " a zebra\n"})
    with pytest.raises(data.DataError, match="zebra"):
        data.load_ptb(directory, download=False, verify=False)


def test_missing_and_download_fails(monkeypatch, tmp_path, clean_env):
    def offline(url, dest, timeout=60.0):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(data_common, "fetch", offline)
    target = tmp_path / "target"
    target.mkdir()
    for kwargs in ({"download": True}, {"download": False}):
        with pytest.raises(data.DataError) as info:
            data.load_ptb(target, **kwargs)
        message = str(info.value)
        assert "\n" not in message
        for name in PTB_FILES + (str(target), "RHNZOO_DATA", "--data_dir"):
            assert name in message
        assert list(tmp_path.iterdir()) == [target]  # no temp dirs next to it
        assert list(target.iterdir()) == []


def test_corrupt_file(tmp_path, clean_env):
    directory = write_fixture(tmp_path / "mine")  # fixture content != canonical hashes
    with pytest.raises(data.DataError, match="ptb.train.txt"):
        data.load_ptb(directory, download=False)


def test_corrupt_file_among_canonical(monkeypatch, tmp_path, clean_env):
    hashes = {name: sha256_text(text) for name, text in FIXTURE.items()}
    monkeypatch.setattr(ptb_data, "PTB_SHA256", hashes)
    directory = write_fixture(tmp_path / "mine", {**FIXTURE, "ptb.valid.txt": " c b\n"})
    with pytest.raises(data.DataError) as info:
        data.load_ptb(directory, download=False)
    assert "ptb.valid.txt" in str(info.value) and "ptb.train.txt" not in str(info.value)
    assert hashes["ptb.valid.txt"][:12] in str(info.value)


def test_fake_download(monkeypatch, tmp_path, clean_env):
    urls = fake_fetch(monkeypatch, simple_examples_tgz(FIXTURE))
    monkeypatch.setattr(ptb_data, "PTB_SHA256", {n: sha256_text(t) for n, t in FIXTURE.items()})
    check_fixture_corpus(data.load_ptb())
    assert urls == ["http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"]
    assert sorted(p.name for p in clean_env.iterdir()) == sorted(PTB_FILES)
    assert list(clean_env.parent.iterdir()) == [clean_env]  # temp dir removed
    check_fixture_corpus(data.load_ptb())  # second call uses the cache
    assert len(urls) == 1


def test_fake_download_bad_checksum(monkeypatch, tmp_path, clean_env):
    fake_fetch(monkeypatch, simple_examples_tgz(FIXTURE))
    with pytest.raises(data.DataError, match="sha256"):
        data.load_ptb(verify=False)  # downloads are checked regardless of verify
    assert not clean_env.exists()
    assert not (tmp_path / "cache").exists()  # the folders this call made are removed too


def test_batchify_layout():
    rows = data.batchify(np.arange(11), 3)  # 11 // 3 = 3 per row, token 9, 10 dropped
    assert rows.dtype == np.int32
    np.testing.assert_array_equal(rows, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])


@pytest.mark.parametrize("batch_size", [0, -1, 6, 100])
def test_batchify_errors(batch_size):
    with pytest.raises(ValueError, match="batch_size"):
        data.batchify(np.arange(11), batch_size)  # 11 // 6 = 1 < 2


def test_windows():
    rows = data.batchify(np.arange(20), 2)  # [[0..9], [10..19]]
    assert data.num_windows(10, 3) == 3  # inputs 0..8, targets 1..9
    assert data.num_windows(10, 9) == 1
    out = list(data.windows(rows, 3))
    assert len(out) == 3
    np.testing.assert_array_equal(out[1][0], [[3, 4, 5], [13, 14, 15]])
    np.testing.assert_array_equal(out[1][1], [[4, 5, 6], [14, 15, 16]])
    for x, y in out:
        assert x.shape == y.shape == (2, 3) and x.dtype == y.dtype == np.int32
        np.testing.assert_array_equal(y, x + 1)  # targets are inputs shifted by one


def test_num_windows_errors():
    with pytest.raises(ValueError, match="num_steps"):
        data.num_windows(10, 10)
    with pytest.raises(ValueError, match="num_steps"):
        data.num_windows(10, 0)
    rows = data.batchify(np.arange(20), 10)  # rows of length 2
    with pytest.raises(ValueError):
        next(data.windows(rows, 2))


# --- one-line errors for bad files (issue 11 §2) --------------------------------------


def test_missing_hint_names_the_data_set_subdirectory(tmp_path, clean_env):
    """--data_dir=/somewhere/nonexistent: the RHNZOO_DATA hint says DIR/ptb, not DIR/nonexistent."""
    with pytest.raises(data.DataError) as info:
        data.load_ptb(tmp_path / "nonexistent", download=False)
    message = str(info.value)
    assert "RHNZOO_DATA=DIR with them in DIR/ptb" in message
    assert "DIR/nonexistent" not in message


@pytest.mark.parametrize("name", PTB_FILES)
@pytest.mark.parametrize("content", [b"", b" \n\n"])
def test_empty_file_is_reported_as_empty(tmp_path, clean_env, name, content):
    directory = write_fixture(tmp_path / "mine")
    (directory / name).write_bytes(content)
    with pytest.raises(data.DataError) as info:
        data.load_ptb(directory, download=False, verify=False)
    assert str(info.value) == f"{directory / name} is empty"


def test_non_utf8_file_names_the_file_byte_and_offset(tmp_path, clean_env):
    directory = write_fixture(tmp_path / "mine")
    (directory / "ptb.valid.txt").write_bytes(b" c a\n \x93quoted\x94 a\n")  # cp1252 quotes
    with pytest.raises(data.DataError) as info:
        data.load_ptb(directory, download=False, verify=False)
    assert str(info.value) == (
        f"{directory / 'ptb.valid.txt'} is not UTF-8 text (byte 0x93 at offset 6)"
    )


def test_encode_splits_ids_dtype_and_unknown_symbol(tmp_path):
    paths = {s: tmp_path / f"{s}.txt" for s in ("train", "valid", "test")}
    splits = {"train": ["b", "a", "b"], "valid": ["a"], "test": []}
    corpus = data_common.encode_splits(splits, ("b", "a"), paths, np.uint8, "word")
    assert corpus.vocab == ("b", "a") and corpus.train.dtype == np.uint8
    ids = [corpus.train.tolist(), corpus.valid.tolist(), corpus.test.tolist()]
    assert ids == [[0, 1, 0], [1], []]
    with pytest.raises(data.DataError) as info:
        data_common.encode_splits({**splits, "test": ["z"]}, ("b", "a"), paths, np.int32, "symbol")
    assert str(info.value) == (
        f"{paths['test']}: symbol 'z' is not in the train vocabulary; "
        "the files do not belong together"
    )


def test_fetch_members_deletes_the_archive_even_when_a_member_is_missing(monkeypatch, tmp_path):
    urls = fake_fetch(monkeypatch, simple_examples_tgz({"ptb.train.txt": " a b\n"}))
    wanted = {"simple-examples/data/ptb.train.txt": tmp_path / "train.txt"}
    data_common.fetch_members("http://x/simple-examples.tgz", tmp_path / "a.tgz", wanted)
    assert (tmp_path / "train.txt").read_text() == " a b\n"
    assert urls == ["http://x/simple-examples.tgz"]
    assert not (tmp_path / "a.tgz").exists()
    wanted = {"simple-examples/data/ptb.test.txt": tmp_path / "test.txt"}
    with pytest.raises(tarfile.TarError, match="http://x/simple-examples.tgz has no member"):
        data_common.fetch_members("http://x/simple-examples.tgz", tmp_path / "a.tgz", wanted)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.txt"]


def test_a_failed_download_leaves_no_folders_it_made(monkeypatch, tmp_path, clean_env):
    """Old: ``directory.parent.mkdir(parents=True)`` before the download, so a failed one
    left ``nd/`` (and every folder above) behind, empty."""

    def offline(url, dest, timeout=60.0):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(data_common, "fetch", offline)
    (tmp_path / "kept").mkdir()
    with pytest.raises(data.DataError, match="download failed"):
        data.load_ptb(tmp_path / "kept" / "nd" / "deeper" / "sub")
    assert list(tmp_path.iterdir()) == [tmp_path / "kept"]
    assert list((tmp_path / "kept").iterdir()) == []
