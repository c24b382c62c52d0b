"""The installed package is the library: built as a wheel and imported module by module
outside the checkout, in one process (issue 70)."""

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import importlib, pathlib, pkgutil, sys
import rhnzoo
where = pathlib.Path(rhnzoo.__file__).resolve()
assert pathlib.Path(sys.argv[1]).resolve() in where.parents, where  # the wheel's copy
failed = []
for m in pkgutil.walk_packages(rhnzoo.__path__, "rhnzoo."):
    try:
        importlib.import_module(m.name)
    except Exception as e:  # noqa: BLE001 - every failure is reported
        failed.append(f"{m.name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
print(len(sys.modules))
assert not failed, failed
"""


@pytest.mark.slow  # builds a wheel (setuptools, no isolation: no download)
def test_the_wheel_imports_every_module_in_one_process_outside_the_checkout(tmp_path):
    pytest.importorskip("setuptools")
    # Built from a copy of what git sees (tracked and untracked-not-ignored files): an
    # in-tree build would pack stale modules left in the checkout's build/lib/.
    src, dist = tmp_path / "src", tmp_path / "dist"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    for rel in filter(None, listed.decode().split("\0")):
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(src)],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = dist.glob("rhnzoo-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(site)
    assert "rhnzoo/cells/kernels/verified.json" in names  # package data travels
    assert not any(n.startswith(("tests/", "experiments/", "docs/", "tools/")) for n in names)
    # The project's own tools live beside the package (issue 70), not in the wheel.
    assert not {"rhnzoo/studies/harvest.py", "rhnzoo/bench/render.py"} & set(names)
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, str(site)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
