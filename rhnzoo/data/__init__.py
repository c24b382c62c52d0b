"""Data sets: loaders that find, download, verify and cache their files.

Each loader looks in ``--data_dir``, else ``$RHNZOO_DATA/<name>``, else the user
cache, downloads from the standard source when the files are absent, checks
sha256 sums, and otherwise fails with one line naming the missing files.
"""

from rhnzoo.data.common import (
    Corpus,
    DataError,
    batchify,
    ensure_files,
    fetch,
    num_windows,
    resolve_data_dir,
    sha256_file,
    windows,
)
from rhnzoo.data.char import load_enwik8, load_ptb_char, load_text8
from rhnzoo.data.music import load_jsb
from rhnzoo.data.ptb import EOS, PTB_SHA256, PTB_URL, load_ptb

__all__ = [
    "Corpus",
    "DataError",
    "batchify",
    "ensure_files",
    "fetch",
    "num_windows",
    "resolve_data_dir",
    "sha256_file",
    "windows",
    "EOS",
    "PTB_SHA256",
    "PTB_URL",
    "load_ptb",
    "load_enwik8",
    "load_text8",
    "load_ptb_char",
    "load_jsb",
]
