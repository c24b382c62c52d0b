"""Tests for rhnzoo.data.char (enwik8, text8, PTB-char) and experiments/char.py."""

import hashlib
import io
import math
import os
import pathlib
import re
import string
import subprocess
import sys
import tracemalloc
import urllib.error
import zipfile

import numpy as np
import pytest
from helpers import fake_fetch, simple_examples_tgz, write_files

from rhnzoo import data
from rhnzoo.data import char
from rhnzoo.data import common as data_common

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "char.py"
PTB_CHAR_FILES = ("ptb.char.train.txt", "ptb.char.valid.txt", "ptb.char.test.txt")
REAL_PTB_CHAR = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "ptb_char"
needs_ptb_char = pytest.mark.skipif(
    not all((REAL_PTB_CHAR / f).is_file() for f in PTB_CHAR_FILES),
    reason=f"real PTB-char files not found in {REAL_PTB_CHAR} (set RHNZOO_DATA)",
)

# Wikipedia-like pieces, including 2-, 3- and 4-byte UTF-8 characters.
PIECES = ["<page>", "[[Zürich]]", " 日本語 ", "😀", "&amp;", "\n", "The ", "cat", "'''"]


def wiki_bytes(n: int, seed: int = 0) -> bytes:
    """About `n` bytes (exactly n) of random concatenated PIECES."""
    rng = np.random.default_rng(seed)
    encoded = [p.encode("utf-8") for p in PIECES]
    out = b"".join(encoded[i] for i in rng.integers(0, len(encoded), min(n // 3, 50_000) + 10))
    while len(out) < n:
        out += out
    return out[:n]


def zip_bytes(member: str, payload: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, payload)
    return buffer.getvalue()


def decode(corpus: data.Corpus, ids: np.ndarray) -> bytes:
    """Bytes of `ids` by the documented rule: vocab[i] is chr(byte)."""
    return np.array([ord(c) for c in corpus.vocab], np.uint8)[ids].tobytes()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No RHNZOO_DATA, cache under tmp_path/cache; returns the cache root."""
    monkeypatch.delenv("RHNZOO_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "rhnzoo"


# --- enwik8 / text8 -----------------------------------------------------------------


def test_enwik8_split_vocab_and_round_trip(tmp_path, clean_env):
    raw = wiki_bytes(30_000)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "enwik8").write_bytes(raw)
    corpus = char.load_enwik8(
        tmp_path / "mine", download=False, verify=False, num_test_symbols=4_000
    )
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (22_000, 4_000, 4_000)
    distinct = sorted(set(raw))  # byte values; includes UTF-8 lead/continuation bytes
    assert any(b >= 0xF0 for b in distinct) and any(0x80 <= b < 0xC0 for b in distinct)
    assert corpus.vocab == tuple(chr(b) for b in distinct)
    assert corpus.vocab_size == len(distinct)
    for ids in (corpus.train, corpus.valid, corpus.test):
        assert ids.dtype == np.uint8 and ids.ndim == 1
    assert decode(corpus, corpus.train) == raw[:22_000]
    assert decode(corpus, corpus.valid) == raw[22_000:26_000]
    assert decode(corpus, corpus.test) == raw[26_000:]
    assert decode(corpus, np.concatenate([corpus.train, corpus.valid, corpus.test])).decode(
        "utf-8"
    ) == raw.decode("utf-8")
    # ids are ranks of the byte values: id order == byte order.
    assert int(corpus.train[raw.index(b"<")]) == distinct.index(ord("<"))
    rows = data.batchify(corpus.train, 4)
    assert rows.dtype == np.int32 and rows[1, 0] == corpus.train[22_000 // 4]


def test_default_split_is_the_reference_one(tmp_path, clean_env):
    raw = wiki_bytes(10_000_100, seed=1)
    (tmp_path / "enwik8").write_bytes(raw)
    corpus = char.load_enwik8(tmp_path, download=False, verify=False)
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (100, 5_000_000, 5_000_000)
    assert decode(corpus, corpus.test[-50:]) == raw[-50:]


def test_no_python_object_per_byte(tmp_path, clean_env):
    n = 8_000_000
    (tmp_path / "enwik8").write_bytes(wiki_bytes(n, seed=2))
    tracemalloc.start()
    try:
        corpus = char.load_enwik8(tmp_path, download=False, verify=False, num_test_symbols=10_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(corpus.train) == n - 20_000
    # A Python list of n ids alone would take 8 bytes per element; numpy buffers are traced too.
    assert peak < 3 * n, f"peak {peak / 1e6:.1f} MB for {n / 1e6:.0f} MB of data"


def test_own_file_fails_the_checksum_unless_verify_is_off(tmp_path, clean_env):
    (tmp_path / "enwik8").write_bytes(wiki_bytes(1000))
    with pytest.raises(data.DataError, match="enwik8: sha256 mismatch"):
        char.load_enwik8(tmp_path, download=False, num_test_symbols=100)


def test_too_short_file(tmp_path, clean_env):
    (tmp_path / "text8").write_bytes(b"ab cd")
    with pytest.raises(data.DataError, match="too short"):
        char.load_text8(tmp_path, download=False, verify=False, num_test_symbols=2)


def test_text8_fake_download_caches_only_the_member(monkeypatch, tmp_path, clean_env):
    rng = np.random.default_rng(3)
    alphabet = np.frombuffer((" " + string.ascii_lowercase).encode(), np.uint8)
    raw = alphabet[rng.integers(0, 27, 5_000)].tobytes()
    urls = fake_fetch(monkeypatch, zip_bytes("text8", raw))
    monkeypatch.setattr(char, "TEXT8_SHA256", {"text8": hashlib.sha256(raw).hexdigest()})
    corpus = char.load_text8(num_test_symbols=500)
    assert urls == ["http://mattmahoney.net/dc/text8.zip"]
    assert corpus.vocab == tuple(" " + string.ascii_lowercase)
    assert decode(corpus, corpus.valid) == raw[4_000:4_500]
    assert [p.name for p in clean_env.iterdir()] == ["text8"]  # no temp dir left
    assert [p.name for p in (clean_env / "text8").iterdir()] == ["text8"]  # no zip
    char.load_text8(num_test_symbols=500)  # now from the cache, checksummed
    assert len(urls) == 1


def test_enwik8_fake_download_bad_checksum_and_bad_zip(monkeypatch, tmp_path, clean_env):
    payload = {"bytes": zip_bytes("enwik8", wiki_bytes(3_000))}
    monkeypatch.setattr(
        data_common, "fetch", lambda url, dest, timeout=60.0: dest.write_bytes(payload["bytes"])
    )
    with pytest.raises(data.DataError, match="sha256 mismatch"):
        char.load_enwik8(verify=False)  # downloads are checked regardless of verify
    payload["bytes"] = b"this is not a zip file"
    with pytest.raises(data.DataError, match="download failed.*enwik8.zip"):
        char.load_enwik8()
    payload["bytes"] = zip_bytes("enwik9", b"x")
    with pytest.raises(data.DataError, match="download failed.*enwik8"):
        char.load_enwik8()
    assert not (clean_env / "enwik8").exists()
    assert not clean_env.exists()  # nor the cache folder the failed downloads made


def test_offline_error_is_one_line(monkeypatch, tmp_path, clean_env):
    def offline(url, dest, timeout=60.0):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(data_common, "fetch", offline)
    target = tmp_path / "target"
    for kwargs in ({"download": True}, {"download": False}):
        with pytest.raises(data.DataError) as info:
            char.load_enwik8(target, **kwargs)
        message = str(info.value)
        assert "\n" not in message
        for part in ("enwik8", str(target), "http://mattmahoney.net/dc/enwik8.zip", "--data_dir"):
            assert part in message
    assert not target.exists()


# --- PTB-char -----------------------------------------------------------------------


def char_file(word_lines) -> str:
    """Mikolov's char format (SOURCES.md): words joined by '_', then every character,
    the newline included, followed by one space."""
    return "".join(c + " " for line in word_lines for c in "_".join(line.split()) + "\n")


FIXTURE = {
    "ptb.char.train.txt": char_file([" a b a", " a c <unk>", " b a"]),
    "ptb.char.valid.txt": char_file([" c a"]),
    "ptb.char.test.txt": char_file([" b"]) + "< u n k > _ a",  # last line: no newline
}
FIXTURE_VOCAB = ("\n", "<", ">", "_", "a", "b", "c", "k", "n", "u")  # code-point order


def write_fixture(directory: pathlib.Path, contents=FIXTURE) -> pathlib.Path:
    return write_files(directory, contents)


def check_fixture(corpus: data.Corpus) -> None:
    assert corpus.vocab == FIXTURE_VOCAB and char.PTB_CHAR_EOL == "\n"
    text = lambda ids: "".join(corpus.vocab[i] for i in ids)
    assert text(corpus.train) == "a_b_a\na_c_<unk>\nb_a\n"
    assert text(corpus.valid) == "c_a\n"
    assert text(corpus.test) == "b\n<unk>_a\n"
    for ids in (corpus.train, corpus.valid, corpus.test):
        assert ids.dtype == np.uint8


def test_ptb_char_fixture_format(tmp_path, clean_env):
    assert FIXTURE["ptb.char.train.txt"].startswith("a _ b _ a \n a _ c")
    assert FIXTURE["ptb.char.train.txt"].endswith("b _ a \n ")  # as the real files end
    check_fixture(char.load_ptb_char(write_fixture(tmp_path / "d"), download=False, verify=False))


def test_ptb_char_unknown_symbol(tmp_path, clean_env):
    directory = write_fixture(tmp_path / "d", {**FIXTURE, "ptb.char.valid.txt": "a z \n "})
    with pytest.raises(data.DataError, match="'z'"):
        char.load_ptb_char(directory, download=False, verify=False)


def test_ptb_char_fake_download(monkeypatch, tmp_path, clean_env):
    urls = fake_fetch(monkeypatch, simple_examples_tgz(FIXTURE))
    hashes = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in FIXTURE.items()}
    monkeypatch.setattr(char, "PTB_CHAR_SHA256", hashes)
    check_fixture(char.load_ptb_char())
    assert urls == ["http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"]
    assert sorted(p.name for p in (clean_env / "ptb_char").iterdir()) == sorted(PTB_CHAR_FILES)
    assert [p.name for p in clean_env.iterdir()] == ["ptb_char"]


@needs_ptb_char
def test_real_ptb_char():
    corpus = char.load_ptb_char(REAL_PTB_CHAR, download=False)  # sha256-verified
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (5_017_482, 393_042, 442_423)
    assert corpus.vocab_size == 50 and "_" in corpus.vocab and "\n" in corpus.vocab
    eol = corpus.vocab.index("\n")
    lines = [3_370, 3_761]  # SOURCES.md: one end-of-line per line
    assert [int(np.sum(s == eol)) for s in (corpus.valid, corpus.test)] == lines
    assert corpus.train.dtype == np.uint8


# --- experiments/char.py --------------------------------------------------------------

TINY = ["--hidden_size=16", "--depth=2", "--noprogress", "--max_steps=3", "--eval_num_steps=1000"]


def run_char(*args, timeout=300):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def final_bpc(stdout: str) -> tuple[float, float]:
    number = r"([\d.]+|inf|nan)"
    match = re.search(rf"^final \(.*valid bpc {number} \| test bpc {number}", stdout, re.MULTILINE)
    assert match, stdout
    return float(match.group(1)), float(match.group(2))


@needs_ptb_char
@pytest.mark.slow
def test_experiment_ptb_char_prints_finite_bpc(tmp_path):
    result = run_char(
        "--dataset=ptb_char",
        f"--data_dir={REAL_PTB_CHAR}",
        "--nodownload",
        "--batch_size=64",
        "--num_steps=20",
        "--eval_batch_size=64",
        f"--workdir={tmp_path / 'w'}",
    )
    assert result.returncode == 0, result.stderr
    assert "valid bpc" in result.stdout
    valid, test = final_bpc(result.stdout)
    # 3 steps of a tiny model: finite, and no better than a perfect model nor far from uniform.
    assert 0 < valid < 2 * math.log2(50) and 0 < test < 2 * math.log2(50)


@pytest.mark.slow
def test_experiment_on_own_enwik8_file(tmp_path):
    directory = tmp_path / "own"
    directory.mkdir()
    raw = wiki_bytes(10_000_000 + 51_200, seed=4)  # train: 51,200 bytes
    (directory / "enwik8").write_bytes(raw)
    common = [f"--data_dir={directory}", "--nodownload", "--dataset=enwik8"]
    checked = run_char(*common, f"--workdir={tmp_path / 'w1'}")
    lines = checked.stderr.strip().splitlines()
    assert checked.returncode != 0 and len(lines) == 1, checked.stderr
    assert lines[0].startswith("error: ") and "sha256 mismatch" in lines[0]
    result = run_char(
        *common,
        "--noverify_data",
        "--batch_size=512",  # per-epoch validation runs at the training batch size
        "--num_steps=20",
        "--eval_batch_size=512",
        f"--workdir={tmp_path / 'w2'}",
    )
    assert result.returncode == 0, result.stderr
    valid, test = final_bpc(result.stdout)
    vocab = len(set(raw))
    assert 0 < valid < 2 * math.log2(vocab) and 0 < test < 2 * math.log2(vocab)


# --- one-line errors for bad files (issue 11 §2) --------------------------------------


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_ptb_char_empty_file_is_reported_as_empty(tmp_path, clean_env, name):
    directory = write_fixture(tmp_path / "d", {**FIXTURE, name: ""})
    with pytest.raises(data.DataError) as info:  # was: "symbol 'c' is not in the train vocabulary"
        char.load_ptb_char(directory, download=False, verify=False)
    assert str(info.value) == f"{directory / name} is empty"


def test_ptb_char_non_utf8_file(tmp_path, clean_env):
    directory = write_fixture(tmp_path / "d")
    (directory / "ptb.char.train.txt").write_bytes(b"a _ b \n \xff \n ")  # 0xff: byte 8
    with pytest.raises(data.DataError) as info:
        char.load_ptb_char(directory, download=False, verify=False)
    assert str(info.value) == (
        f"{directory / 'ptb.char.train.txt'} is not UTF-8 text (byte 0xff at offset 8)"
    )


def test_missing_hint_names_the_data_set_subdirectory(tmp_path, clean_env):
    with pytest.raises(data.DataError, match="with them in DIR/ptb_char$"):
        char.load_ptb_char(tmp_path / "nonexistent", download=False)
    with pytest.raises(data.DataError, match="with them in DIR/text8$"):
        char.load_text8(tmp_path / "elsewhere", download=False)
