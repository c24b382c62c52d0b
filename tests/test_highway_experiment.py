"""experiments/highway.py as a user runs it: bad flags, a small sweep end to end on real
MNIST (every figure and the table written; a rerun skips the finished runs), one net."""

import functools
import json
import re
import subprocess
import sys

import matplotlib.image
import pytest

from helpers import DATA, ROOT, needs_data, run_script
from rhnzoo.engine import workdir as workdir_lib

MNIST_DIR = DATA / "mnist"
needs_mnist = needs_data("mnist", "train-images-idx3-ubyte.gz", what="MNIST")
# A CPU-sized sweep: depth 3 (plain and highway), 20 steps each, small analyses.
SMALL = [
    "--depths=3",
    "--plain_lrs=3:1e-3",
    "--max_steps=20",
    "--noprogress",
    "--heatmap_examples=300",
    "--lesion_examples=300",
    "--diagnostics_depth=4",
    "--log_every=10",
]


highway = functools.partial(run_script, "highway.py")


def png_shape(path):
    return matplotlib.image.imread(path).shape


@pytest.mark.parametrize(
    "flags,message",
    [
        # flag values alone and a missing data directory: tests/test_bad_inputs.py's table
        # (one subprocess a script), test_config_round_trip_and_one_line_errors and
        # tests/test_config_contract.py; here what only the real data refute
        pytest.param(  # the data's (the fast tier: the bad-input table's data rows)
            ["--valid_size=60000"], "--valid_size must be in [1, 59999]", marks=pytest.mark.slow
        ),
    ],
)
def test_bad_flags_fail_with_one_line_before_writing(tmp_path, flags, message):
    if "valid_size" in flags[0] and not MNIST_DIR.exists():
        pytest.skip("needs the real MNIST files")
    result = highway(*[f.format(tmp=tmp_path) for f in flags], f"--workdir={tmp_path / 'w'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and message in lines[0], lines[0]
    assert not (tmp_path / "w").exists() and not (tmp_path / "nothing").exists()


@needs_mnist
@pytest.mark.slow
def test_small_sweep_writes_table_and_figures_and_resumes(tmp_path):
    root = tmp_path / "sweep"
    result = highway("--sweep", *SMALL, f"--workdir={root}")
    assert result.returncode == 0, result.stderr[-3000:]
    for name in (
        "results.md",
        "analysis.json",
        "training_curves.png",
        "plain_diagnostics.png",
        "gate_heatmaps_d3.png",
        "lesion_d3.png",
    ):
        assert (root / name).is_file(), name
    for kind in ("plain", "highway"):
        results = json.loads((root / f"{kind}_d3" / "results.json").read_text())
        assert results["step"] == 20 and 0 <= results["test_acc"] <= 1
    rows = [
        line for line in (root / "results.md").read_text().splitlines() if line.startswith("| 3 ")
    ]
    assert len(rows) == 1 and "—" not in rows[0], rows
    assert png_shape(root / "training_curves.png")[:2] == (300, 320)  # 1 panel of 3.2 x 3 in
    assert png_shape(root / "gate_heatmaps_d3.png")[:2] == (300, 1280)
    numbers = json.loads((root / "analysis.json").read_text())
    assert len(numbers["lesions"]["3"]["lesioned"]) == 2  # depth 3: two highway layers
    assert numbers["plain_diagnostics"]["depth"] == 4 and len(numbers["plain_diagnostics"]) == 7

    again = highway("--sweep", *SMALL, "--diagnostics_depth=0", f"--workdir={root}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": final (") == 2  # the runner's lines; the runs' in sweep.log
    for kind in ("plain", "highway"):
        assert "already finished: final (" in (root / f"{kind}_d3" / "sweep.log").read_text()
    changed = highway("--sweep", *SMALL, "--activation=relu", f"--workdir={root}")
    assert changed.returncode == 1 and "incompatible" in changed.stderr


@pytest.mark.slow
@needs_mnist
def test_single_highway_run_writes_its_figures(tmp_path):
    result = highway(
        "--depth=2",
        "--max_steps=10",
        "--noprogress",
        "--lesion_examples=100",
        "--heatmap_examples=100",
        f"--workdir={tmp_path / 'w'}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "highway net, depth 2, width 50: 44,860 parameters" in result.stdout
    for name in ("results.json", "gate_heatmaps.png", "lesion.png"):
        assert (tmp_path / "w" / name).is_file(), name
    # analyze.py reads the data set and the net from the run's config.json.
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "experiments" / "analyze.py"),
            f"--workdir={tmp_path / 'w'}",
            f"--out={tmp_path / 'a'}",
            "--lesion_examples=100",
            "--heatmap_examples=100",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("gate_heatmaps.png", "lesion.png", "analysis.json"):
        assert (tmp_path / "a" / name).is_file(), name


@pytest.mark.slow
def test_sweep_with_two_jobs_and_two_seeds_on_generated_mnist(tmp_path):
    """--jobs=2 --seeds=2: four runs in child processes, seed 1 in <kind>_d<depth>_s1, the
    table showing mean ± sd (n=2) of the two seeds' test accuracies."""
    import statistics

    from helpers import write_random_mnist

    mnist = write_random_mnist(tmp_path / "mnist", train=200, test=40)
    root = tmp_path / "sweep"
    result = highway(
        "--sweep",
        "--depths=3",
        "--plain_lrs=3:1e-3",
        "--max_steps=6",
        "--batch_size=20",
        "--valid_size=40",
        "--noprogress",
        "--log_every=3",
        "--heatmap_examples=20",
        "--lesion_examples=20",
        "--diagnostics_depth=0",
        f"--data_dir={mnist}",
        "--noverify_data",
        "--nodownload",
        "--jobs=2",
        "--seeds=2",
        "--seed=3",
        f"--workdir={root}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 runs, 2 at a time in child processes" in result.stdout
    (row,) = [
        line for line in (root / "results.md").read_text().splitlines() if line.startswith("| 3 ")
    ]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    for kind, column in (("plain", 5), ("highway", 10)):
        accs = [
            100 * json.loads((root / name / "results.json").read_text())["test_acc"]
            for name in (f"{kind}_d3", f"{kind}_d3_s1")
        ]
        seeds = [
            json.loads((root / name / "config.json").read_text())["seed"]
            for name in (f"{kind}_d3", f"{kind}_d3_s1")
        ]
        assert seeds == [3, 4]
        expected = f"{statistics.mean(accs):.2f} ± {statistics.stdev(accs):.2f}% (n=2)"
        assert cells[column] == expected, row
    assert (root / "gate_heatmaps_d3.png").is_file() and "seeds 3-4" in result.stdout + (
        root / "results.md"
    ).read_text()


@pytest.mark.slow
def test_stacked_seeds_write_what_separate_seeds_write(tmp_path):
    """Issue 47: --stack_seeds trains a row's --seeds as one program; every seed's
    results.json, metrics (timings aside) and config.json (its own workdir) are those of
    the same sweep without it, exactly (issue 62 item 8: the stacked validation was a vmap,
    its losses off in the 8th digit), and the stacked state lies in the first seed's
    workdir."""
    from helpers import write_random_mnist

    mnist = write_random_mnist(tmp_path / "mnist", train=200, test=40)
    common = (
        "--sweep",
        "--depths=3",
        "--plain_lrs=3:1e-3",
        "--max_steps=6",
        "--batch_size=20",
        "--valid_size=40",
        "--noprogress",
        "--log_every=3",
        "--heatmap_examples=20",
        "--lesion_examples=20",
        "--diagnostics_depth=0",
        f"--data_dir={mnist}",
        "--noverify_data",
        "--nodownload",
        "--seeds=2",
        "--seed=3",
    )
    for root, extra in (("separate", ()), ("stacked", ("--stack_seeds",))):
        result = highway(*common, f"--workdir={tmp_path / root}", *extra)
        assert result.returncode == 0, result.stderr[-3000:]
    timing = lambda r: {k: v for k, v in r.items() if not k.endswith(("_per_s", "_s"))}
    for name in ("plain_d3", "plain_d3_s1", "highway_d3", "highway_d3_s1"):
        separate, stacked = tmp_path / "separate" / name, tmp_path / "stacked" / name
        got, want = (
            timing(_json(stacked / "results.json")),
            timing(_json(separate / "results.json")),
        )
        assert got == want
        assert [timing(r) for r in workdir_lib.read_metrics(stacked)] == [
            timing(r) for r in workdir_lib.read_metrics(separate)
        ]
        assert [timing(r) for r in workdir_lib.read_metrics(stacked, "train")] == [
            timing(r) for r in workdir_lib.read_metrics(separate, "train")
        ]
        config = _json(stacked / "config.json")
        assert config["workdir"] == str(stacked) and config["seed"] == 3 + name.endswith("_s1")
        assert config == {**_json(separate / "config.json"), "workdir": str(stacked)}
    assert _json(tmp_path / "stacked" / "plain_d3" / "stacked" / "seeds.json") == [3, 4]


def _json(path):
    return json.loads(path.read_text())


def test_in_process_sweep_prints_two_lines_per_run(tmp_path):
    """Issue 48: the in-process sweep printed every run's training log (about 4,800 lines
    at --preset=cpu). Each run's lines go to its sweep.log; the terminal gets the runner's
    start and end lines (the run's final line in it), whatever --log_every."""
    import numpy as np

    from rhnzoo.configs import highway as configs
    from rhnzoo.studies import highway as highway_study
    from rhnzoo import evaluation

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (240, 784), np.uint8), rng.integers(0, 10, 240)
    splits = evaluation.split_data(images[:200], labels[:200], images[200:], labels[200:], 40)
    cfg = configs.HighwayConfig(
        sweep=True,
        depths=("3",),
        plain_lrs={3: 1e-3},
        max_steps=6,
        batch_size=20,
        log_every=1,
        progress=False,
        diagnostics_depth=0,
        workdir=str(tmp_path / "sweep"),
    )
    lines = []
    highway_study.sweep(cfg, splits, log=lines.append)
    assert len(lines) == 4, lines
    assert lines[1].startswith("[1/2] plain_d3 done in ") and ": final (best checkpoint" in lines[1]
    assert (
        lines[2]
        == f"[2/2] highway_d3 -> {tmp_path / 'sweep' / 'highway_d3'} (its lines: sweep.log)"
    )
    for name in ("plain_d3", "highway_d3"):
        log = (tmp_path / "sweep" / name / "sweep.log").read_text()
        assert log.count("  step ") == 6 and "final (best checkpoint" in log


# ------------------------------------------------------------------ the config, in process

# config.json as experiments/highway.py wrote it at commit 0016358 (before HighwayConfig):
# `--sweep --depths=3 --plain_lrs=3:1e-3 --max_steps=4 --seeds=2 --seed=3 --batch_size=20
# --valid_size=40 --noprogress --log_every=3 --data_dir=/tmp/hw-mnist --noverify_data
# --nodownload --workdir=/tmp/hw-old/sweep`, its run plain_d3_s1 (seed 3 + 1).
CONFIG_0016358 = {
    "activation": "tanh",
    "batch_size": 20,
    "checkpoint_every_steps": 0,
    "data_dir": "/tmp/hw-mnist",
    "data_source": "files",
    "dataset": "mnist",
    "depth": 3,
    "divergence_factor": 3.0,
    "download": False,
    "epochs": 400,
    "eval_batch_size": 1000,
    "input_size": 784,
    "kernel_init": "glorot_uniform",
    "kind": "plain",
    "log_every": 3,
    "lr": 0.001,
    "lr_decay_rate": 0.96,
    "lr_decay_steps": 100000,
    "matmul_precision": "default",
    "max_epochs": None,
    "max_steps": 4,
    "momentum": 0.9,
    "num_classes": 10,
    "patience": None,
    "preset": None,
    "progress": False,
    "seed": 4,
    "tensorboard": False,
    "transform_bias": -4.0,
    "valid_size": 40,
    "verify_data": False,
    "width": 71,
    "workdir": "/tmp/hw-old/sweep",
}


def old_sweep_config(**changes):
    """The HighwayConfig of CONFIG_0016358's command line (the matmul precision its flag's
    default then, not the test session's ``highest``; its ``--seeds=2``: :func:`old_runs`),
    with ``changes``."""
    from rhnzoo.configs.highway import HighwayConfig

    settings = {
        "sweep": True,
        "depths": ("3",),
        "plain_lrs": {3: 1e-3},
        "seed": 3,
        "batch_size": 20,
        "valid_size": 40,
        "data_dir": "/tmp/hw-mnist",
        "verify_data": False,
        "download": False,
        "workdir": "/tmp/hw-old/sweep",
        "max_steps": 4,
        "progress": False,
        "log_every": 3,
        "matmul_precision": "default",
    }
    return HighwayConfig(**{**settings, **changes})


def old_runs(**changes):
    """``{name: config}``: the runs of CONFIG_0016358's sweep (``--seeds=2``), with
    ``changes`` to its config."""
    from rhnzoo.studies import highway as highway_study

    return dict(highway_study.runs(old_sweep_config(**changes), seeds=2))


def old_workdir(path, **changes):
    """A workdir holding a run, its config.json CONFIG_0016358 with ``changes``."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**CONFIG_0016358, **changes}))
    (path / "results.json").write_text("{}")  # the workdir holds a run
    return path


def test_a_workdir_written_before_the_config_class_resumes(tmp_path):
    """The old config.json (hand-picked keys, no depths/plain_lrs/analyses) resumes the
    same command's run, and the same sweep rerun with more depths; the run's config.json
    is then rewritten with every field."""
    from rhnzoo.engine.workdir import prepare_workdir

    runs = old_runs()
    assert list(runs) == ["plain_d3", "plain_d3_s1", "highway_d3", "highway_d3_s1"]
    run = runs["plain_d3_s1"]
    assert (run.kind, run.depth, run.width, run.lr, run.seed) == ("plain", 3, 71, 0.001, 4)
    wd = old_workdir(tmp_path / "plain_d3_s1")
    assert prepare_workdir(wd, run, check_only=True) == wd
    more = old_runs(depths=("3", "5"), plain_lrs={3: 1e-3, 5: 1e-4}, diagnostics_depth=0)
    assert len(more) == 8 and more["plain_d3_s1"].depths == ("3",)
    prepare_workdir(wd, more["plain_d3_s1"], check_only=True)
    assert json.loads((wd / "config.json").read_text()) == CONFIG_0016358  # only checked
    prepare_workdir(wd, run)
    written = json.loads((wd / "config.json").read_text())
    assert written["init"] == "glorot_uniform" and written["depths"] == ["3"]
    assert written["workdir"] == "/tmp/hw-old/sweep/plain_d3_s1" and "kernel_init" not in written


def test_a_structural_difference_from_an_old_workdir_is_refused(tmp_path):
    from rhnzoo.engine.workdir import prepare_workdir

    wd = old_workdir(tmp_path / "plain_d3_s1")
    runs = old_runs()
    for other, shown in (
        (runs["plain_d3_s1"].replace(activation="relu"), "activation='tanh' there vs 'relu'"),
        (runs["plain_d3"], "seed=4 there vs 3"),
        (
            old_runs(plain_lrs={3: 1e-2})["plain_d3_s1"],
            "lr=0.001 there vs 0.01",
        ),
        (
            runs["plain_d3_s1"].replace(init="he_normal"),
            "init='glorot_uniform' there vs 'he_normal'",
        ),
        (runs["highway_d3_s1"], "kind='plain' there vs 'highway'"),
    ):
        with pytest.raises(ValueError, match=r"holds an incompatible run \(.*" + re.escape(shown)):
            prepare_workdir(wd, other, check_only=True)


def test_the_net_of_a_runs_config_json_old_or_new():
    import dataclasses

    from rhnzoo.analysis.highway import net_from_config
    from rhnzoo.models.highway import FeedForwardNet

    old = FeedForwardNet("plain", 3, 71, 784, 10, "tanh", "glorot_uniform", -4.0)
    assert net_from_config(CONFIG_0016358) == old
    he = net_from_config({**CONFIG_0016358, "init": "he_normal"})
    assert he == dataclasses.replace(old, kernel_init="he_normal")
    run = old_runs(dataset="cifar100")["highway_d3"]
    assert net_from_config(json.loads(json.dumps(run.to_dict()))) == FeedForwardNet(
        "highway", 3, 50, 3072, 100, "tanh", "glorot_uniform", -4.0
    )
    with pytest.raises(ValueError, match="not a highway-net run's config .*--dataset must be"):
        net_from_config({"dataset": "ptb", "depth": 10, "hidden_size": 830})


def test_config_round_trip_and_one_line_errors():
    from rhnzoo.configs.highway import HighwayConfig

    cfg = HighwayConfig(kind="plain", depth=20, sweep=True, depths=("10", "20"))
    assert HighwayConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["depths"] == ("10", "20") and cfg.replace(seed=5).seed == 5
    with pytest.raises(ValueError, match="unknown HighwayConfig setting.*: nonsense"):
        HighwayConfig.from_dict({"depth": 10, "nonsense": 1})
    for values, message in (
        ({"kind": "plain", "plain_lrs": ("10-1e-3",)}, "--plain_lrs must be depth:rate pairs"),
        ({"plain_lrs": {"x": 1e-3}}, "--plain_lrs must be depth:rate pairs, got {'x': 0.001}"),
        ({"kind": "plain", "depth": 30}, "no plain learning rate for depth 30"),
        ({"kind": "resnet"}, "--kind must be one of highway, plain, got 'resnet'"),
        ({"depth": 1}, "--depth must be >= 2, got 1"),
        ({"lr": 0.0}, "--lr must be > 0, got 0.0"),
        ({"momentum": 1.0}, "--momentum must be in [0, 1), got 1.0"),
        ({"lr_decay_steps": 0}, "--lr_decay_steps must be >= 1, got 0"),
        ({"batch_size": 2.5}, "--batch_size must be an integer, got 2.5"),
        ({"heatmap_examples": 0}, "--heatmap_examples must be >= 1, got 0"),
        ({"diagnostics_depth": 1}, "--diagnostics_depth must be 0 or >= 2"),
        ({"dataset": "ptb"}, "--dataset must be one of mnist, cifar100, got 'ptb'"),
        ({"data_source": "web"}, "--data_source must be one of files, tfds, got 'web'"),
        ({"max_steps": 0}, "--max_steps must be >= 1, got 0"),  # the run settings
        ({"epochs": 0}, "--epochs must be >= 1, got 0"),
        ({"matmul_precision": "fast"}, "--matmul_precision: "),
    ):
        with pytest.raises(ValueError, match=re.escape(message)) as error:
            HighwayConfig.from_dict(values)
        assert "\n" not in str(error.value)


def test_plain_lrs_is_a_mapping_parsed_once_from_the_flags_pairs():
    """Issue 70: ``plain_lrs`` is ``{depth: rate}``, parsed from the flag's depth:rate
    pairs (``--plain_lrs=10:0.1,20:0.05``); config.json holds the mapping (its keys
    strings) and one written before, the pairs; both read back as the mapping."""
    from rhnzoo.configs import highway as configs
    from rhnzoo.configs.highway import HighwayConfig

    assert configs.parse_plain_lrs("10:0.1,20:0.05") == {10: 0.1, 20: 0.05}
    assert configs.parse_plain_lrs(["10:0.1", "20:5e-2"]) == {10: 0.1, 20: 0.05}
    assert configs.format_plain_lrs({10: 0.1, 20: 0.05}) == "10:0.1,20:0.05"
    for bad, shown in (("10-0.1", "['10-0.1']"), (["3:x"], "['3:x']"), ("1:2:3", "['1:2:3']")):
        with pytest.raises(ValueError, match=re.escape(f"must be depth:rate pairs, got {shown}")):
            configs.parse_plain_lrs(bad)
    cfg = HighwayConfig(kind="plain", depth=3, plain_lrs={3: 0.02})
    assert cfg.learning_rate("plain", 3) == 0.02 and cfg.narrow().lr == 0.02
    on_disk = json.loads(json.dumps(workdir_lib.strict(cfg.to_dict())))
    assert on_disk["plain_lrs"] == {"3": 0.02}
    assert HighwayConfig.from_dict(on_disk) == cfg
    assert HighwayConfig.from_dict({**on_disk, "plain_lrs": ["3:0.02"]}) == cfg  # before
    assert cfg.conflicts({**on_disk, "plain_lrs": ["3:1"]}) == []  # resumable
    assert configs.get_config().plain_lrs == {10: 1e-3, 20: 1e-3, 50: 1e-5, 100: 1e-5}
    with pytest.raises(ValueError, match=re.escape("in --plain_lrs (3:0.02); pass --lr or add")):
        cfg.replace(depth=4)


def test_the_study_holds_the_sweeps_runs_and_checks_them():
    """The sweep's structure is the study's (issue 70): its runs, depth-major, plain
    before highway, seeds in turn, each narrowed to its net, seed and workdir; the sweep's
    flags that do not go together are one line naming the flag."""
    from rhnzoo.configs.highway import HighwayConfig
    from rhnzoo.studies import highway as highway_study

    cfg = HighwayConfig(sweep=True, depths=("10", "20"), seed=5, workdir="/tmp/s")
    assert highway_study.plan(cfg) == [
        ("plain", 10),
        ("highway", 10),
        ("plain", 20),
        ("highway", 20),
    ]
    runs = highway_study.runs(cfg, seeds=2)
    assert [name for name, _ in runs][:4] == [
        "plain_d10",
        "plain_d10_s1",
        "highway_d10",
        "highway_d10_s1",
    ]
    plain = runs[1][1]
    assert (plain.kind, plain.depth, plain.width, plain.lr, plain.seed) == (
        "plain",
        10,
        71,
        1e-3,
        6,
    )
    assert (plain.sweep, plain.depths, plain.workdir) == (False, ("10",), "/tmp/s/plain_d10_s1")
    one = HighwayConfig(kind="plain", depth=20, workdir="/tmp/one")
    assert highway_study.runs(one) == [("plain_d20", one.narrow())]
    assert one.narrow().workdir == "/tmp/one" and one.narrow().lr == 1e-3
    for values, seeds, jobs, message in (
        ({}, 2, 1, "--jobs and --seeds are for --sweep"),
        ({}, 1, 2, "--jobs and --seeds are for --sweep"),
        ({"sweep": True, "depths": ("10", "x")}, 1, 1, "--depths must be integers, got 10,x"),
        ({"sweep": True, "depths": ("30",)}, 1, 1, "no plain learning rate for depth 30"),
        ({"sweep": True, "depths": ("1",)}, 1, 1, "depth must be an integer >= 2"),
        ({"sweep": True, "lr": -1.0}, 1, 1, "--lr must be > 0, got -1.0"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)) as error:
            highway_study.check(HighwayConfig(**values), seeds, jobs)
        assert "\n" not in str(error.value)
    highway_study.check(HighwayConfig(sweep=True), 3, 2)


def test_presets_hold_the_reproductions_settings():
    """Yarali & Kostic (the ECBM4040 reproduction of Srivastava et al. 2015): highway nets
    T bias -4, momentum 0.9, lr 0.1, decay 0.96 every 100,000 steps; plain nets lr 0.001 at
    depths 10 and 20, 0.00001 at 50 and 100; 50 highway / 71 plain units; depths 10-100."""
    from rhnzoo.configs import highway as configs

    d = configs.get_config()
    assert (d.transform_bias, d.momentum, d.lr_decay_rate, d.lr_decay_steps) == (-4, 0.9, 0.96, 1e5)
    assert (d.activation, d.init, d.epochs, d.depths) == (
        "tanh",
        "glorot_uniform",
        400,
        ("10", "20", "50", "100"),
    )
    assert [d.learning_rate("highway", k) for k in (10, 20, 50, 100)] == [0.1] * 4
    assert [d.learning_rate("plain", k) for k in (10, 20, 50, 100)] == [1e-3, 1e-3, 1e-5, 1e-5]
    assert (d.net("highway", 50).width, d.net("plain", 50).width) == (50, 71)
    assert d.net("highway", 10).num_params() == 39_250 + 9 * 5_100 + 510  # docs/highway.md
    cpu = configs.get_config("cpu")
    assert (cpu.epochs, cpu.preset, cpu.transform_bias) == (120, "cpu", -4)
    assert [cpu.learning_rate("plain", k) for k in (10, 20, 50, 100)] == [1e-3, 1e-3, 1e-5, 1e-5]
    assert set(configs.PRESETS) == {"cpu"}
    with pytest.raises(ValueError, match="--preset must be one of cpu, got 'gpu'"):
        configs.get_config("gpu")


@pytest.mark.slow  # the fast tier: tests/test_scripts.py's ptb.py --help
def test_help_lists_one_flag_per_setting_with_its_help():
    """Every HighwayConfig field is a flag of the script, its help the field's; --preset,
    and the runner's --seeds, --jobs and --sweep_run too."""
    import dataclasses

    from rhnzoo.config import meta
    from rhnzoo.configs.highway import HighwayConfig

    result = highway("--help")  # absl: the usage, exit status 1 (the script's one --help run)
    assert result.returncode == 1 and "(default:" in result.stdout
    assert "Feed-forward Highway Networks" in result.stdout and not result.stderr
    assert "--logtostderr" not in result.stdout  # absl's own flags stay in --helpfull
    text = " ".join(result.stdout.split())
    for f in dataclasses.fields(HighwayConfig):
        if f.name == "preset":
            continue
        flag = f"--[no]{f.name}:" if isinstance(f.default, bool) else f"--{f.name}:"
        assert flag in text, f.name
        assert " ".join(meta(f)["help"].split()[:6]) in text, f.name
    assert "--preset: <cpu>:" in text and "--sweep_run:" in text
    assert "--seeds:" in text and "--jobs:" in text


@pytest.mark.slow
def test_a_run_takes_the_preset_under_the_flags_given_and_resumes(tmp_path):
    """--preset=cpu with flags over it: the run's config.json is its own (its lr from
    --plain_lrs at its depth, the preset's epochs); a rerun is finished, another
    activation refused."""
    from helpers import write_random_mnist

    mnist = write_random_mnist(tmp_path / "mnist", train=100, test=20)
    wd = tmp_path / "w"
    args = [
        "--preset=cpu",
        "--kind=plain",
        "--depth=3",
        "--plain_lrs=3:0.02,10:1",
        "--seed=7",
        "--max_steps=3",
        "--batch_size=20",
        "--valid_size=40",
        "--noprogress",
        f"--data_dir={mnist}",
        "--noverify_data",
        "--nodownload",
        f"--workdir={wd}",
    ]
    result = highway(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plain net, depth 3, width 71: " in result.stdout
    written = json.loads((wd / "config.json").read_text())
    expected = {
        "preset": "cpu",
        "epochs": 120,
        "transform_bias": -4.0,
        "kind": "plain",
        "depth": 3,
        "width": 71,
        "lr": 0.02,
        "seed": 7,
        "depths": ["3"],
        "sweep": False,
        "batch_size": 20,
        "max_steps": 3,
        "workdir": str(wd),
        "init": "glorot_uniform",
    }
    assert {k: written[k] for k in expected} == expected
    again = highway(*args)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stderr[-3000:]
    changed = highway(*args, "--activation=relu")
    lines = changed.stderr.strip().splitlines()
    assert changed.returncode == 1 and len(lines) == 1, changed.stderr
    assert "incompatible run (activation='tanh' there vs 'relu')" in lines[0]


def test_a_plain_single_run_draws_its_learning_curves_and_its_lesions(tmp_path, monkeypatch):
    """Issue 62 item 7: a single run writes learning_curves.png (highway.py wrote none),
    its training curve from the training-log records (a one-epoch run had one point);
    analyze on a plain net removes each plain layer in turn (it raised "lesioning needs
    a highway net")."""
    from helpers import write_random_mnist

    from rhnzoo.analysis import plots, report
    from rhnzoo.apps import highway as app
    from rhnzoo.configs.highway import HighwayConfig

    mnist = write_random_mnist(tmp_path / "mnist", train=200, test=40)
    drawn = []
    real = plots.plot_learning_curves
    monkeypatch.setattr(
        plots,
        "plot_learning_curves",
        lambda curves, *a, **k: drawn.append(curves) or real(curves, *a, **k),
    )
    cfg = HighwayConfig(
        kind="plain",
        depth=3,
        lr=1e-3,
        epochs=1,
        batch_size=20,
        valid_size=40,
        log_every=2,
        progress=False,
        data_dir=str(mnist),
        download=False,
        verify_data=False,
        workdir=str(tmp_path / "w"),
    )
    app.train_and_evaluate(cfg)
    assert png_shape(tmp_path / "w" / "learning_curves.png")[:2] == (400, 640)
    (curves,) = drawn
    assert [r["step"] for r in curves["training"]] == [2, 4, 6, 8]  # 8 steps, logged every 2
    assert [r["step"] for r in curves["validation"]] == [8]
    assert all(r["xent"] > 0 for r in curves["training"] + curves["validation"])
    numbers = report.analyze(
        tmp_path / "w",
        tmp_path / "a",
        report.AnalysisOptions(lesion_examples=30, progress=False, verify=False),
    )
    assert numbers["phases"]["lesion"]["status"] == "done"
    assert "gate_heatmaps" not in numbers["phases"]  # a plain net has no gates
    assert len(numbers["lesion"]["nll"]) == 2 and numbers["lesion"]["num_images"] == 30
    assert (tmp_path / "a" / "lesion.png").is_file()
