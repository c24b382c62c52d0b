"""The notebooks: committed clean, and executed on CPU with tiny parameters.

papermill runs them: it replaces the cell tagged ``parameters`` (the full-size values a
Colab TPU / GPU runs) by the tiny values below, and fails on the first cell that raises.
"""

import json
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
DATA = pathlib.Path(os.environ.get("RHNZOO_DATA", "/nonexistent"))

# Tiny sizes: each notebook runs in well under a minute on 2 CPU cores.
TINY = {
    "quickstart": dict(
        INSTALL=False,
        DEPTH=2,
        HSG=True,
        MAX_STEPS=4,
        ANALYZE=True,
        BATCH_SIZE=4,
        EXTRA_FLAGS=["--hidden_size=16", "--num_steps=10", "--eval_batch_size=20", "--log_every=2"],
    ),
    "custom_scan": dict(
        INSTALL=False, CELLS=["lstm", "hsg_rhn"], HIDDEN=8, T=12, TRAIN_STEPS=3, BATCH=8
    ),
    "papers": dict(INSTALL=False, HIGHWAY_DEPTH=10, HIGHWAY_STEPS=4, RNN_HIDDEN=4, RNN_STEPS=2),
}
NEEDS = {"quickstart": "ptb/ptb.train.txt", "papers": "mnist/train-images-idx3-ubyte.gz"}
RUNS_PARAM = {"quickstart": "WORKDIR", "papers": "ROOT"}  # where a notebook's runs go


def test_every_notebook_is_committed_clean_with_a_parameters_cell():
    assert {p.stem for p in NOTEBOOKS} == set(TINY)
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), path
        tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name}: one cell tagged 'parameters'"
        names = {
            line.split("=")[0].strip()
            for line in "".join(tagged[0]["source"]).splitlines()
            if "=" in line and not line.startswith("#")
        }
        assert set(TINY[path.stem]) <= names, f"{path.name}: unknown parameters"


def execute(name, tmp_path, **overrides):
    """The notebook ``name`` executed by papermill with its tiny parameters (and
    ``overrides``); fails on the first cell that raises. Returns the executed notebook."""
    papermill = pytest.importorskip("papermill")
    if name in NEEDS and not (DATA / NEEDS[name]).is_file():
        pytest.skip(f"{DATA / NEEDS[name]} not found (set RHNZOO_DATA)")
    params = {**TINY[name], **overrides}
    if name in RUNS_PARAM:  # the notebook's runs go to the test's directory
        params[RUNS_PARAM[name]] = str(tmp_path / "runs")
    out = papermill.execute_notebook(
        str(ROOT / "notebooks" / f"{name}.ipynb"),
        str(tmp_path / f"{name}.out.ipynb"),
        parameters=params,
        cwd=str(ROOT),
        kernel_name="python3",
        progress_bar=False,
        log_output=False,
    )
    errors = [o for c in out["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(TINY) - {"quickstart"}))  # quickstart: below
def test_notebook_runs_on_cpu_with_tiny_parameters(name, tmp_path):
    execute(name, tmp_path)


@pytest.mark.slow
def test_quickstart_runs_on_eight_devices_with_the_default_batch(tmp_path, monkeypatch):
    """A TPU v2-8's 8 cores (virtual CPU devices here): the paper's batch of 20 does not
    split over 8, so the notebook rounds it up to 24 and the run trains on all 8; the
    evaluation batch of 20 is split over the 8 with 4 zero-weight rows appended; then the
    notebook's analysis. (The notebook's one run: on one device it is the same code.)"""
    monkeypatch.setenv(
        "XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8"
    )
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    out = execute("quickstart", tmp_path, BATCH_SIZE=None)
    text = "".join(o.get("text", "") for c in out["cells"] for o in c.get("outputs", []))
    assert "8 cpu device(s); training in float32, batch 24" in text
    assert (tmp_path / "runs" / "results.json").is_file()
