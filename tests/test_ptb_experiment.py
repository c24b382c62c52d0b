"""experiments/ptb.py as a user runs it: the headline command, bad flags, SIGTERM.

The headline command and the blow-up's chance level (PTB's vocabulary) read the real PTB;
the rest, whose contract is the script's behaviour, not the data, the generated PTB of
``tests/corpus.py`` (the ``generated_ptb`` fixture), so they also run without the data.
"""

import functools
import json
import signal
import subprocess
import sys

import pytest

from corpus import flags as on
from helpers import DATA, ROOT, needs_data, run_script

SCRIPT = ROOT / "experiments" / "ptb.py"
PTB_DIR = DATA / "ptb"
needs_ptb = needs_data("ptb", "ptb.train.txt", what="PTB")
TINY = [
    "--hidden_size=16",
    "--depth=2",
    "--batch_size=4",
    "--num_steps=10",
    "--noprogress",
    "--eval_batch_size=20",
    "--eval_num_steps=200",
]


ptb = functools.partial(run_script, "ptb.py")


@pytest.mark.slow  # the fast tier: tests/test_bad_inputs.py's --eval_batch_size row
def test_a_batch_larger_than_the_data_fails_fast_with_one_line(tmp_path, generated_ptb):
    """Refuted by the data only (flag values alone: tests/test_bad_inputs.py's table and
    tests/test_config_contract.py)."""
    flag, message = "--batch_size=600000", "batch"
    result = ptb(*TINY, *on(generated_ptb), flag, f"--workdir={tmp_path / 'w'}")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not (tmp_path / "w").exists(), "nothing may be written for invalid flags"


@pytest.mark.slow  # the fast tier: tests/test_bad_inputs.py's missing-data row
def test_missing_data_names_the_files(tmp_path):
    result = ptb(
        *TINY, f"--data_dir={tmp_path / 'nothing'}", "--nodownload", f"--workdir={tmp_path / 'w'}"
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    for name in (
        "ptb.train.txt",
        "ptb.valid.txt",
        "ptb.test.txt",
        str(tmp_path / "nothing"),
        "RHNZOO_DATA",
    ):
        assert name in lines[0]
    assert not (tmp_path / "nothing").exists() and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_incompatible_workdir_fails_before_work(tmp_path, generated_ptb):
    tiny = [*TINY, *on(generated_ptb)]
    first = ptb(*tiny, "--max_steps=2", f"--workdir={tmp_path / 'w'}")
    assert first.returncode == 0, first.stderr
    second = ptb(*tiny, "--max_steps=2", "--depth=3", f"--workdir={tmp_path / 'w'}")
    assert second.returncode != 0
    assert second.stderr.strip().splitlines() == [second.stderr.strip()]
    assert "incompatible" in second.stderr and "depth=2 there vs 3" in second.stderr


@pytest.mark.slow
@needs_ptb
def test_an_exploding_learning_rate_stops_within_the_first_log_window(tmp_path):
    """--lr=100: finite losses of tens of nats above chance (gradient clipping keeps them
    finite) stop the run as a blow-up within its first steps, long before the first log
    line (step 100) and the first judged window (steps 21-70), with one error line; no
    checkpoint was written (issue 48: once it trained on until step 70)."""
    workdir = tmp_path / "w"
    result = ptb(
        *TINY, "--lr=100", "--max_steps=300", "--checkpoint_every_steps=20", f"--workdir={workdir}"
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    step = int(lines[0].removeprefix("error: training loss at step ").split()[0])
    assert (
        step <= 10
        and "more than 20 above the chance level (a uniform guess), 9.21: a "
        "blow-up: the run diverged; no checkpoint was written; try a lower --lr"
        in lines[0]
    )
    assert "  step " not in result.stdout
    assert not any(p.name.isdigit() for p in (workdir / "checkpoints").iterdir())


@needs_ptb
@pytest.mark.slow
def test_headline_command_depth40_hsg_runs_on_real_ptb(tmp_path):
    """`python experiments/ptb.py --depth=40 --hsg --max_steps=...` at a CPU-sized width."""
    result = ptb(
        "--depth=40",
        "--hsg",
        "--hidden_size=32",
        "--max_steps=3",
        "--noprogress",
        "--eval_batch_size=20",
        "--eval_num_steps=200",
        f"--workdir={tmp_path / 'w'}",
    )
    assert result.returncode == 0, result.stderr
    assert "valid ppl" in result.stdout and "final (best checkpoint" in result.stdout
    assert (tmp_path / "w" / "results.json").exists()


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_the_run_resumes(tmp_path, generated_ptb):
    """Waits for the first training-loss line (no sleeping past compilation), then SIGTERM."""
    workdir = tmp_path / "w"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            *TINY,
            *on(generated_ptb),
            "--max_steps=100000",
            "--log_every=1",
            f"--workdir={workdir}",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:
        if line.startswith("  step "):
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("stopped by signal 15 in training at step ") and err.strip() == "", err
    saved = [int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit()]
    assert saved and max(saved) > 0 and f"at step {max(saved)};" in last
    resumed = ptb(
        *TINY, *on(generated_ptb), f"--max_steps={max(saved) + 2}", f"--workdir={workdir}"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"step {max(saved) + 2:7d}" in resumed.stdout


def test_unusable_workdir_is_one_line(tmp_path, generated_ptb):
    (tmp_path / "file").write_text("not a directory")
    for workdir, message in [
        (tmp_path / "file", "exists and is not a directory"),
        (tmp_path / "file" / "sub", "cannot create workdir"),
    ]:
        result = ptb(*TINY, *on(generated_ptb), "--max_steps=1", f"--workdir={workdir}")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1 and message in lines[0], result.stderr


@pytest.mark.slow
def test_a_run_cut_short_evaluates_batched_and_says_so(tmp_path, generated_ptb):
    tiny = [a for a in TINY if not a.startswith("--eval_batch_size")]
    result = ptb(*tiny, *on(generated_ptb), "--max_steps=3", f"--workdir={tmp_path / 'w'}")
    assert result.returncode == 0, result.stderr
    final = [l for l in result.stdout.splitlines() if l.startswith("final")]
    assert final and "eval batch 4, batched because the run was cut short" in final[0]
    results = json.loads((tmp_path / "w" / "results.json").read_text())
    assert results["eval_batch_size"] == 4 and results["eval_protocol"] == "batched"


@pytest.mark.parametrize(
    "flags_,bias",
    [
        (["--hsg"], -2.5),  # the one ptb.py run kept fast
        pytest.param(["--nohsg"], -2.0, marks=pytest.mark.slow),
        pytest.param(["--hsg", "--init_bias=-1.0"], -1.0, marks=pytest.mark.slow),
    ],
)
def test_hsg_runs_use_the_papers_rhn_gate_bias(tmp_path, generated_ptb, flags_, bias):
    """Shoham & Permuter: "An initial bias of -2.5 was used for both the RHN and the HSG gates"."""
    result = ptb(*TINY, *on(generated_ptb), *flags_, "--max_steps=1", f"--workdir={tmp_path / 'w'}")
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["init_bias"] == bias and config["hsg_init_bias"] == -2.5


@pytest.mark.slow
def test_any_registered_cell_trains_on_ptb_and_analyze_reads_it(tmp_path, generated_ptb):
    """--cell picks any cell of the registry (reference scan); --hsg wraps it; the run's
    config names it and analysis.load_run rebuilds that model."""
    from rhnzoo import analysis, cells

    tiny = [*(a for a in TINY if a != "--depth=2"), *on(generated_ptb)]
    result = ptb(*tiny, "--cell=gru", "--hsg", "--max_steps=2", f"--workdir={tmp_path / 'w'}")
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "w" / "config.json").read_text())
    assert config["cell"] == "gru" and config["hsg"]
    model, _, _ = analysis.load_run(tmp_path / "w")
    assert (
        model.cell == cells.HSG(cells.GRU(16), init_scale=0.04) and model.scan_impl == "reference"
    )
    from rhnzoo.analysis import report

    options = report.AnalysisOptions(max_eval_tokens=200, verify=False)  # the generated files
    numbers = report.analyze(tmp_path / "w", tmp_path / "a", options)
    assert numbers["model"] == "GRU+HSG" and numbers["dataset"] == "ptb"
    assert (tmp_path / "a" / "analysis.json").is_file()
    for flags_, message in [
        (["--cell=lstm", "--depth=3"], "--depth does not apply to --cell=lstm"),
        (["--cell=lstm", "--hsg"], "HSG needs a cell whose carry is one"),
    ]:
        result = ptb(*tiny, *flags_, f"--workdir={tmp_path / 'x'}")
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "x").exists()
