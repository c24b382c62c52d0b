"""rhnzoo.data.text: tokenizer, vocabulary, dev split, IMDB / AG News / 20NG loaders, TFDS."""

import hashlib
import io
import os
import pathlib
import sys
import tarfile
import urllib.error

import numpy as np
import pytest
from helpers import fake_fetch, write_files

from rhnzoo import data
from rhnzoo.data import common as data_common
from rhnzoo.data import text


def words(data_set, doc):
    return [data_set.vocab[i] for i in doc]


# ------------------------------------------------------------------ tokens and vocabulary


@pytest.mark.parametrize(
    "raw, tokens",
    [
        ("It's GREAT!<br />10/10", ["it's", "great", "!", "10", "/", "10"]),
        (
            "Don't  stop<br/>the 'music'...",
            ["don't", "stop", "the", "'", "music", "'", ".", ".", "."],
        ),
        ("a<br>b <BR /> c", ["a", "b", "c"]),  # lower-cased first, so <BR /> goes too
        ("Café déjà-vu, snake_case x2", ["café", "déjà", "-", "vu", ",", "snake_case", "x2"]),
        ("rock'n'roll o'", ["rock'n'roll", "o", "'"]),
        ("\t\n  ", []),
    ],
)
def test_tokenize(raw, tokens):
    assert text.tokenize(raw) == tokens


def test_build_vocab_coverage_and_order():
    # counts: a 5, b 3, c 1, d 1 (10 tokens); ties broken by word.
    docs = [["a", "b", "a", "d"], ["c", "a", "b", "a"], ["a", "b"]]
    assert text.build_vocab(docs, 1.0) == ("<pad>", "<unk>", "a", "b", "c", "d")
    assert text.build_vocab(docs, 0.8) == ("<pad>", "<unk>", "a", "b")  # 8/10 >= 0.8
    assert text.build_vocab(docs, 0.81) == ("<pad>", "<unk>", "a", "b", "c")  # needs 9
    assert text.build_vocab(docs, 0.5) == ("<pad>", "<unk>", "a")  # 5/10
    assert text.build_vocab(docs, 0.01) == ("<pad>", "<unk>", "a")
    assert text.build_vocab([["<unk>", "x", "<pad>"]], 1.0) == ("<pad>", "<unk>", "x")
    assert text.build_vocab([[]], 0.95) == ("<pad>", "<unk>")
    for bad in (0.0, -0.1, 1.01):
        with pytest.raises(ValueError, match="coverage"):
            text.build_vocab(docs, bad)


def test_encode_maps_unknown_words_to_unk():
    ids = text.encode([["b", "zz", "a"], []], ("<pad>", "<unk>", "a", "b"))
    np.testing.assert_array_equal(ids[0], [3, 1, 2])
    assert ids[1].shape == (0,) and ids[0].dtype == ids[1].dtype == np.int32


def test_dev_split():
    train, dev = text.dev_split(100)
    assert len(dev) == 15 and len(train) == 85
    assert sorted(np.concatenate([train, dev]).tolist()) == list(range(100))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(dev) > 0)
    np.testing.assert_array_equal(dev, text.dev_split(100)[1])  # fixed seed
    np.testing.assert_array_equal(dev, np.sort(np.random.default_rng(0).permutation(100)[:15]))
    assert not np.array_equal(dev, text.dev_split(100, seed=1)[1])
    assert len(text.dev_split(10, 0.3)[1]) == 3
    for n, fraction in ((100, 0.0), (100, 1.0), (3, 0.1), (1, 0.5)):
        with pytest.raises(ValueError, match="empty part"):
            text.dev_split(n, fraction)


# ------------------------------------------------------------------------------- IMDB

# (path in the archive, text). Sorted by path, train is: neg/0_2, neg/10_1, neg/1_4, pos/0_9, pos/3_8.
IMDB_REVIEWS = {
    "aclImdb/train/pos/3_8.txt": "Great fun.<br /><br />Loved it",
    "aclImdb/train/pos/0_9.txt": "A great, great film!",
    "aclImdb/train/neg/1_4.txt": "Not great. Boring",
    "aclImdb/train/neg/10_1.txt": "Awful film; boring boring",
    "aclImdb/train/neg/0_2.txt": "Dull — and long",
    "aclImdb/train/unsup/0_0.txt": "unlabelled: skipped",
    "aclImdb/test/neg/0_3.txt": "boring film",
    "aclImdb/test/pos/0_10.txt": "great zebra",
    "aclImdb/README": "not a review",
    "aclImdb/train/urls_pos.txt": "http://example.com",
}


def imdb_tar(reviews=IMDB_REVIEWS, prefix="", mode="w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        info = tarfile.TarInfo(prefix + "aclImdb")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        for name, body in reviews.items():
            payload = body if isinstance(body, bytes) else body.encode("utf-8")
            info = tarfile.TarInfo(prefix + name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def check_imdb_fixture(imdb: data.TextData) -> None:
    assert imdb.label_names == ("neg", "pos") and imdb.num_classes == 2
    np.testing.assert_array_equal(imdb.train_labels, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(imdb.test_labels, [0, 1])
    assert imdb.train_labels.dtype == np.int32
    # Train tokens: great 4, boring 3, film 2, '.' 2, ',' 1, '!' 1, ... (20 tokens in all).
    assert imdb.vocab[:5] == ("<pad>", "<unk>", "great", "boring", ".")
    assert imdb.vocab_size == len(set(imdb.vocab))
    assert words(imdb, imdb.train[0]) == ["dull", "—", "and", "long"]  # neg/0_2
    assert words(imdb, imdb.train[1]) == ["awful", "film", ";", "boring", "boring"]  # neg/10_1
    assert words(imdb, imdb.train[4]) == [
        "great",
        "fun",
        ".",
        "loved",
        "it",
    ]  # pos/3_8, <br /> gone
    assert words(imdb, imdb.test[1]) == ["great", "<unk>"]  # zebra is not a training word
    assert all(doc.dtype == np.int32 for doc in imdb.train + imdb.test)


def test_imdb_repacked_archive(tmp_path, clean_env):
    (tmp_path / "imdb").mkdir()
    (tmp_path / "imdb" / "aclImdb_train_test.tar.gz").write_bytes(imdb_tar(prefix="./"))
    check_imdb_fixture(data.load_imdb(tmp_path / "imdb", download=False, coverage=1.0))


def test_imdb_extracted_folder_and_plain_tar(tmp_path, clean_env):
    for name, body in IMDB_REVIEWS.items():
        path = tmp_path / "a" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    check_imdb_fixture(data.load_imdb(tmp_path / "a", download=False, coverage=1.0))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "mine.tar").write_bytes(imdb_tar(mode="w"))
    check_imdb_fixture(data.load_imdb(tmp_path / "b", download=False, coverage=1.0))


def test_imdb_original_name_is_checksummed(monkeypatch, tmp_path, clean_env):
    payload = imdb_tar()
    (tmp_path / "imdb").mkdir()
    (tmp_path / "imdb" / "aclImdb_v1.tar.gz").write_bytes(payload)
    with pytest.raises(data.DataError, match="sha256 mismatch"):
        data.load_imdb(tmp_path / "imdb", download=False)
    check_imdb_fixture(data.load_imdb(tmp_path / "imdb", verify=False, coverage=1.0))
    monkeypatch.setattr(
        text, "IMDB_SHA256", {"aclImdb_v1.tar.gz": hashlib.sha256(payload).hexdigest()}
    )
    check_imdb_fixture(data.load_imdb(tmp_path / "imdb", download=False, coverage=1.0))


def test_imdb_fake_download(monkeypatch, tmp_path, clean_env):
    payload = imdb_tar()
    urls = fake_fetch(monkeypatch, payload)
    with pytest.raises(data.DataError, match="sha256 mismatch"):  # always checked
        data.load_imdb(verify=False)
    assert not (clean_env / "imdb").exists()
    monkeypatch.setattr(
        text, "IMDB_SHA256", {"aclImdb_v1.tar.gz": hashlib.sha256(payload).hexdigest()}
    )
    check_imdb_fixture(data.load_imdb(coverage=1.0))
    assert urls[-1] == "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
    assert [p.name for p in (clean_env / "imdb").iterdir()] == ["aclImdb_v1.tar.gz"]


def test_imdb_missing_is_one_line(tmp_path, clean_env):
    with pytest.raises(data.DataError) as info:
        data.load_imdb(tmp_path / "nonexistent")
    message = str(info.value)
    assert "\n" not in message
    for part in (
        "aclImdb_v1.tar.gz",
        "download failed",
        "aclImdb/ folder",
        "DIR/imdb",
        "--data_dir",
    ):
        assert part in message
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize(
    "reviews, message",
    [
        (
            {**IMDB_REVIEWS, "aclImdb/train/pos/0_9.txt": b"caf\xe9"},
            r"train/pos/0_9.txt is not UTF-8 text \(byte 0xe9 at offset 3\)",
        ),
        ({**IMDB_REVIEWS, "aclImdb/test/neg/0_3.txt": ""}, "test/neg/0_3.txt is empty"),
        ({k: v for k, v in IMDB_REVIEWS.items() if "/test/" not in k}, r"no reviews aclImdb/test/"),
    ],
)
def test_imdb_bad_reviews(tmp_path, clean_env, reviews, message):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.tar.gz").write_bytes(imdb_tar(reviews))
    with pytest.raises(data.DataError, match=message) as info:
        data.load_imdb(tmp_path / "d", download=False)
    assert "\n" not in str(info.value) and "x.tar.gz" in str(info.value)


def test_imdb_ambiguous_or_corrupt_archives(tmp_path, clean_env):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "one.tar.gz").write_bytes(imdb_tar())
    (tmp_path / "d" / "two.tgz").write_bytes(imdb_tar())
    with pytest.raises(data.DataError, match="several archives"):
        data.load_imdb(tmp_path / "d", download=False)
    (tmp_path / "d" / "two.tgz").unlink()
    (tmp_path / "d" / "one.tar.gz").write_bytes(imdb_tar()[:200])
    with pytest.raises(data.DataError, match="not a readable tar archive"):
        data.load_imdb(tmp_path / "d", download=False)


def test_vocabulary_can_leave_out_the_dev_documents(tmp_path, clean_env):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.tar.gz").write_bytes(imdb_tar())
    full = data.load_imdb(tmp_path / "d", download=False, coverage=1.0)
    train_idx, dev_idx = text.dev_split(5, 0.4, seed=3)
    held = data.load_imdb(
        tmp_path / "d", download=False, coverage=1.0, dev_fraction=0.4, dev_seed=3
    )
    kept = {w for i in train_idx for w in words(full, full.train[i])}
    assert set(held.vocab) == kept | {"<pad>", "<unk>"}
    assert set(held.vocab) < set(full.vocab)  # the dev reviews hold words of their own
    assert len(held.train) == 5  # every training document is still returned
    for i in dev_idx:
        assert words(held, held.train[i]) == [
            w if w in kept else "<unk>" for w in words(full, full.train[i])
        ]


REAL_IMDB = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent")) / "imdb"


@pytest.fixture(scope="module")
def real_imdb():
    if not (REAL_IMDB / "aclImdb_train_test.tar.gz").is_file():
        pytest.skip(f"aclImdb_train_test.tar.gz not found in {REAL_IMDB} (set RHNZOO_DATA)")
    return data.load_imdb(REAL_IMDB, download=False)


@pytest.mark.slow
def test_real_imdb(real_imdb):
    imdb = real_imdb
    assert (len(imdb.train), len(imdb.test)) == (25000, 25000)
    np.testing.assert_array_equal(np.bincount(imdb.train_labels), [12500, 12500])
    np.testing.assert_array_equal(np.bincount(imdb.test_labels), [12500, 12500])
    # Order by path: train/neg first (0_3.txt, the "unnatural feelings for a pig" review),
    # then train/pos starting with 0_9.txt ("Bromwell High", SOURCES.md).
    assert words(imdb, imdb.train[0])[:9] == [
        "story",
        "of",
        "a",
        "man",
        "who",
        "has",
        "unnatural",
        "feelings",
        "for",
    ]
    assert imdb.train_labels[12499] == 0 and imdb.train_labels[12500] == 1
    assert words(imdb, imdb.train[12500])[:5] == [
        "<unk>",
        "high",
        "is",
        "a",
        "cartoon",
    ]  # rare name
    assert imdb.vocab[:4] == ("<pad>", "<unk>", "the", ".")
    assert "<br" not in imdb.vocab and "br" not in imdb.vocab[:1000]  # line breaks removed
    # Coverage 0.95: <unk> is at most 5 % of training tokens, and only just.
    train_ids = np.concatenate(imdb.train)
    unk = np.mean(train_ids == 1)
    assert 0.049 < unk <= 0.05
    assert not np.any(train_ids == 0) and train_ids.max() < imdb.vocab_size
    assert 5_000 < imdb.vocab_size < 20_000
    assert 200 < np.mean([len(d) for d in imdb.train]) < 350


# ---------------------------------------------------------------------------- AG News

AG_TRAIN = (
    '"3","Wall St. Bears Claw Back","Reuters - Short-sellers, Wall Street\'s dwindling\\band of '
    'ultra-cynics, are seeing green again."\n'
    '"4","Title with ""quotes""","\\\\Paragraph one.\\\\Two"\n'
    '"1","World news","Talks in Najaf"\n'
    '"2","Sports","Phelps wins gold"\n'
)
AG_TEST = '"2","Phelps","Gold in Athens"\n'


def write_ag(directory, train=AG_TRAIN, test=AG_TEST):
    return write_files(directory, {"train.csv": train, "test.csv": test})


def check_ag_fixture(ag: data.TextData) -> None:
    assert ag.label_names == ("World", "Sports", "Business", "Sci/Tech")
    np.testing.assert_array_equal(ag.train_labels, [2, 3, 0, 1])
    np.testing.assert_array_equal(ag.test_labels, [1])
    assert words(ag, ag.train[0])[:8] == [
        "wall",
        "st",
        ".",
        "bears",
        "claw",
        "back",
        "reuters",
        "-",
    ]
    assert "dwindling" in words(ag, ag.train[0]) and "band" in words(ag, ag.train[0])
    assert words(ag, ag.train[1]) == [
        "title",
        "with",
        '"',
        "quotes",
        '"',
        "paragraph",
        "one",
        ".",
        "two",
    ]
    assert words(ag, ag.test[0]) == ["phelps", "gold", "in", "<unk>"]


def test_agnews_generated_files(tmp_path, clean_env):
    directory = write_ag(tmp_path / "ag")
    check_ag_fixture(data.load_agnews(directory, download=False, verify=False, coverage=1.0))
    with pytest.raises(data.DataError, match="train.csv: sha256 mismatch"):
        data.load_agnews(directory, download=False)


@pytest.mark.parametrize(
    "train, message",
    [
        ('"5","t","d"\n', "line 1 is not"),
        ('"1","t","d"\n"2","only two"\n', "line 2 is not"),
        ("", "train.csv is empty"),
        (
            '"1","caf\xe9","d"\n'.encode("latin-1"),
            r"train.csv is not UTF-8 text \(byte 0xe9 at offset 8\)",
        ),
    ],
)
def test_agnews_bad_rows(tmp_path, clean_env, train, message):
    directory = write_ag(tmp_path / "ag")
    (directory / "train.csv").write_bytes(train if isinstance(train, bytes) else train.encode())
    with pytest.raises(data.DataError, match=message) as info:
        data.load_agnews(directory, download=False, verify=False)
    assert "\n" not in str(info.value) and "train.csv" in str(info.value)


def test_agnews_download_falls_back_to_the_fastai_archive(monkeypatch, tmp_path, clean_env):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, body in (
            ("train.csv", AG_TRAIN),
            ("test.csv", AG_TEST),
            ("classes.txt", "World\n"),
        ):
            info = tarfile.TarInfo(f"ag_news_csv/{name}")
            info.size = len(body.encode())
            tar.addfile(info, io.BytesIO(body.encode()))
    urls = []

    def fake_fetch(url, dest, timeout=60.0):
        urls.append(url)
        if url.endswith(".csv"):
            raise urllib.error.URLError("raw.githubusercontent.com unreachable")
        pathlib.Path(dest).write_bytes(buffer.getvalue())

    monkeypatch.setattr(data_common, "fetch", fake_fetch)
    monkeypatch.setattr(
        text,
        "AGNEWS_SHA256",
        {
            "train.csv": hashlib.sha256(AG_TRAIN.encode()).hexdigest(),
            "test.csv": hashlib.sha256(AG_TEST.encode()).hexdigest(),
        },
    )
    check_ag_fixture(data.load_agnews(coverage=1.0))
    assert urls == [
        "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/train.csv",
        "https://s3.amazonaws.com/fast-ai-nlp/ag_news_csv.tgz",
    ]
    assert sorted(p.name for p in (clean_env / "ag_news").iterdir()) == ["test.csv", "train.csv"]
    assert [p.name for p in clean_env.iterdir()] == ["ag_news"]


def test_agnews_missing_is_one_line(tmp_path, clean_env):
    with pytest.raises(data.DataError) as info:
        data.load_agnews(tmp_path / "nowhere")
    message = str(info.value)
    assert "\n" not in message and "train.csv, test.csv" in message and "DIR/ag_news" in message
    assert "fast-ai-nlp/ag_news_csv.tgz" in message
    assert list(tmp_path.iterdir()) == []  # nothing half-written


# ---------------------------------------------------------------------- 20 Newsgroups

NG_TRAIN = (
    "sci.space\tnasa launch orbit nasa\n"
    "alt.atheism\tgod belief\n"
    "comp.graphics\timage render image\n"
    "sci.space\t\n"  # a document with no terms
)
NG_TEST = "comp.graphics\timage nasa pixel\nalt.atheism\tbelief\n"


def write_20ng(directory, train=NG_TRAIN, test=NG_TEST):
    return write_files(
        directory, {"20ng-train-all-terms.txt": train, "20ng-test-all-terms.txt": test}
    )


def check_20ng_fixture(ng: data.TextData) -> None:
    assert ng.label_names == ("alt.atheism", "comp.graphics", "sci.space")
    np.testing.assert_array_equal(ng.train_labels, [2, 0, 1, 2])
    np.testing.assert_array_equal(ng.test_labels, [1, 0])
    assert ng.vocab[:4] == ("<pad>", "<unk>", "image", "nasa")  # 2, 2, then 1 each by word
    assert words(ng, ng.train[0]) == ["nasa", "launch", "orbit", "nasa"]
    assert ng.train[3].shape == (0,)
    assert words(ng, ng.test[0]) == ["image", "nasa", "<unk>"]


def test_20ng_generated_files(tmp_path, clean_env):
    # No checksum exists for these files: verify=True accepts them.
    check_20ng_fixture(data.load_20ng(write_20ng(tmp_path / "ng"), download=False, coverage=1.0))


@pytest.mark.parametrize(
    "train, test, message",
    [
        (NG_TRAIN, "rec.autos\tcar\n", "newsgroup 'rec.autos' is not in the training file"),
        ("sci.space nasa\n", NG_TEST, "20ng-train-all-terms.txt: line 1 is not"),
        (NG_TRAIN, "\n", "20ng-test-all-terms.txt is empty"),
    ],
)
def test_20ng_bad_files(tmp_path, clean_env, train, test, message):
    with pytest.raises(data.DataError, match=message) as info:
        data.load_20ng(write_20ng(tmp_path / "ng", train, test), download=False)
    assert "\n" not in str(info.value)


def test_20ng_download_tries_the_mirrors(monkeypatch, tmp_path, clean_env):
    urls = []
    bodies = {"20ng-train-all-terms.txt": NG_TRAIN, "20ng-test-all-terms.txt": NG_TEST}

    def fake_fetch(url, dest, timeout=60.0):
        urls.append(url)
        if "utl.pt" in url:
            raise urllib.error.URLError("gone")
        pathlib.Path(dest).write_text(bodies[url.rsplit("/", 1)[1]])

    monkeypatch.setattr(data_common, "fetch", fake_fetch)
    check_20ng_fixture(data.load_20ng(coverage=1.0))
    assert urls[:2] == [
        "http://web.ist.utl.pt/acardoso/datasets/20ng-train-all-terms.txt",
        "https://www.cs.umb.edu/~smimarog/textmining/datasets/20ng-train-all-terms.txt",
    ]
    assert sorted(p.name for p in (clean_env / "20ng").iterdir()) == sorted(bodies)


# ------------------------------------------------------------------------------- TFDS


@pytest.mark.parametrize("name, num_classes", [("imdb_reviews", 2), ("ag_news_subset", 4)])
def test_tfds_text_with_mock_data(name, num_classes):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=5):
        got = data.load_tfds_text(name, coverage=1.0)
        first = tfds.data_source(name, split="train")[0]
    assert "tensorflow" not in sys.modules
    assert len(got.train) == len(got.test) == 5 and got.num_classes == num_classes
    raw = first["text"] if name == "imdb_reviews" else f"{first['title']} {first['description']}"
    raw = raw.decode() if isinstance(raw, bytes) else raw
    assert words(got, got.train[0]) == text.tokenize(raw.replace("\\", " "))
    assert got.train_labels[0] == int(first["label"])


def test_tfds_text_errors(monkeypatch):
    with pytest.raises(ValueError, match="imdb_reviews"):
        data.load_tfds_text("yelp")
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(data.DataError, match="tensorflow-datasets"):
        data.load_tfds_text("imdb_reviews")
