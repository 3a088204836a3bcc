"""The ``asyncflow`` command: demo, info, bench, cache info; console script and ``-m``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncflow.cli._command import check_pil, run
from asyncflow.image import sample_folder

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    return subprocess.run(
        [sys.executable, "-m", "asyncflow", *args],
        capture_output=True, text=True, timeout=timeout, env=env, **kw,  # type: ignore[call-overload]
    )


def test_help_lists_the_subcommands() -> None:
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    for command in ("demo", "info", "bench", "cache"):
        assert command in result.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "asyncflow"
    if not script.exists():
        pytest.skip("asyncflow is not installed into this interpreter's environment")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0
    assert result.stdout.startswith("asyncflow ")


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_info_reports_versions_and_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["info"]) == 0
    out = capsys.readouterr().out
    for label in ("asyncflow", "python", "torch", "CUDA", "PIL", "pillow-simd",
                  "libjpeg-turbo", "uvloop"):
        assert label in out


def test_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["asyncflow"]
    assert "cuda_available" in info["torch"]
    assert "libjpeg_turbo" in info["image"]


def test_setup_leaves_the_right_pil_in_place() -> None:
    # What `make` runs after installing: pillow-simd on Linux x86_64, alone.
    result = _cli("info", "--check-pil")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        ({"pil_version": "9", "pillow": None, "pillow_simd": "9.post0", "simd_expected": True},
         None),
        ({"pil_version": "10", "pillow": "10", "pillow_simd": None, "simd_expected": False},
         None),
        ({"pil_version": "10", "pillow": "10", "pillow_simd": None, "simd_expected": True},
         "pillow-simd is expected"),
        ({"pil_version": "10", "pillow": "10", "pillow_simd": "9", "simd_expected": True},
         "both pillow and pillow-simd"),
        ({"pil_version": None, "pillow": None, "pillow_simd": None, "simd_expected": True,
          "problems": ["the image backend cannot be loaded: ImportError"]},
         "cannot be loaded"),
    ],
)
def test_check_pil(status: dict[str, object], problem: str | None) -> None:
    message = check_pil(status)
    if problem is None:
        assert message is None
    else:
        assert message is not None and problem in message


@pytest.mark.slow
def test_demo_on_generated_data() -> None:
    result = _cli("demo", "--images", "24", "--batch-size", "8", "--size", "64")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "made 24 JPEGs from the sample photos" in out
    assert "24 images in" in out and "images/s" in out
    assert "(8, 3, 64, 64)" in out
    assert "bottleneck" in out
    assert "decode" in out  # the per-stage table
    assert "image.folder" in result.stderr  # the progress bar


@pytest.mark.slow
def test_demo_on_a_given_folder(tmp_path: Path) -> None:
    root = sample_folder(tmp_path / "data", 12)
    result = _cli("demo", "--data", str(root), "--batch-size", "4", "--size", "32",
                  "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "made" not in result.stdout
    assert "12 images in" in result.stdout
    assert "3 classes" in result.stdout


def test_demo_rejects_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["demo", "--data", str(tmp_path / "missing")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_demo_cuda_without_cuda_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    root = sample_folder(tmp_path / "data", 4)
    assert run(["demo", "--data", str(root), "--device", "cuda", "--no-progress"]) == 2
    assert "cuda" in capsys.readouterr().err.lower()


def test_sample_folder_layout(tmp_path: Path) -> None:
    from PIL import Image

    root = sample_folder(tmp_path / "x", 8)
    classes = sorted(p.name for p in root.iterdir())
    assert classes == ["astronaut", "chelsea", "coffee"]
    files = sorted(root.rglob("*.jpg"))
    assert len(files) == 8
    with Image.open(files[0]) as img:
        assert img.format == "JPEG" and img.mode == "RGB"
        assert 400 <= max(img.size) <= 640


def _bench_dir(tmp_path: Path) -> Path:
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "bench_fast.py").write_text("print('| row | 1.0x |')\n")
    (bench / "bench_fails.py").write_text("import sys\nsys.exit(3)\n")
    (bench / "_helper.py").write_text("raise SystemExit('not a benchmark')\n")
    return bench


def test_bench_lists_scripts(tmp_path: Path) -> None:
    bench = _bench_dir(tmp_path)
    result = _cli("bench", "--list", "--dir", str(bench))
    assert result.returncode == 0
    assert "fast" in result.stdout and "fails" in result.stdout
    assert "_helper" not in result.stdout


def test_bench_runs_the_named_script(tmp_path: Path) -> None:
    bench = _bench_dir(tmp_path)
    result = _cli("bench", "fast", "--dir", str(bench))
    assert result.returncode == 0, result.stderr
    assert "| row | 1.0x |" in result.stdout


def test_bench_reports_failure_and_unknown_names(tmp_path: Path) -> None:
    bench = _bench_dir(tmp_path)
    assert _cli("bench", "fails", "--dir", str(bench)).returncode == 3
    result = _cli("bench", "nope", "--dir", str(bench))
    assert result.returncode == 2
    assert "unknown benchmark" in result.stderr


def test_bench_quick_is_passed_to_scripts_that_take_it(tmp_path: Path) -> None:
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "bench_q.py").write_text(
        "import sys\n# accepts \"--quick\"\nprint('args', sys.argv[1:])\n"
    )
    (bench / "bench_plain.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    result = _cli("bench", "--quick", "--dir", str(bench))
    assert result.returncode == 0, result.stderr
    assert "args ['--quick']" in result.stdout and "args []" in result.stdout


def test_bench_all_skips_gpu_benchmarks_without_cuda(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "bench_transfer.py").write_text("raise SystemExit('needs CUDA')\n")
    (bench / "bench_cpu.py").write_text("print('ran')\n")
    result = _cli("bench", "--dir", str(bench))
    assert result.returncode == 0, result.stderr
    assert "skipping transfer" in result.stdout and "ran" in result.stdout


def test_bench_finds_the_repository_benchmarks() -> None:
    result = _cli("bench", "--list", cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_cache_info_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["cache", "info", str(tmp_path / "nothing")]) == 1
    assert str(tmp_path / "nothing") in capsys.readouterr().err


def test_cache_info_describes_a_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    from asyncflow import Pipeline

    path = tmp_path / "cache"
    pipe = Pipeline(range(10)).map(lambda i: (np.full((2, 3), i, np.uint8), i)).cache(path)
    assert sum(1 for _ in pipe) == 10
    assert run(["cache", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "usable" in out and "10" in out and "uint8" in out
    assert run(["cache", "info", "--json", str(path)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["usable"] is True and data["count"] == 10


def test_cache_info_of_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was: a raw ValueError traceback ("PosixPath('.') has an empty name"), for "." and "".
    from asyncflow import Pipeline

    path = tmp_path / "cache"
    assert sum(1 for _ in Pipeline(range(3)).map(lambda i: (i,)).cache(path)) == 3
    monkeypatch.chdir(path)
    assert run(["cache", "info", "."]) == 0
    assert "usable" in capsys.readouterr().out
    monkeypatch.chdir(tmp_path)
    assert run(["cache", "info", ""]) == 1
    assert "no cache at" in capsys.readouterr().err


def test_demo_table_counts_images_not_groups() -> None:
    """The demo's table as docs/profiling.md shows it: images in and out, internal hidden."""
    result = _cli("demo", "--images", "256", "--batch-size", "32", "--size", "64")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("stage "))
    assert lines[start].split() == [
        "stage", "kind", "conc", "in", "out", "items/s", "busy", "per", "item", "queue",
        "failures",
    ]
    rows = {line.split()[0]: [c for c in line.split() if c != "*"] for line in lines[start + 2:]
            if line and not line.startswith(("finished", "running"))
            and line.split()[0] in ("source", "decode", "batch", "claim", "rows")}
    assert sorted(rows) == ["batch", "decode", "source"]
    assert rows["source"][1:2] + rows["source"][3:5] == ["source", "0", "256"]
    assert rows["decode"][1] == "map" and rows["decode"][3:5] == ["256", "256"]
    assert rows["batch"][1] == "assemble" and rows["batch"][3:5] == ["256", "8"]
    assert "finished: 8 items in" in result.stdout
    assert "internal stages hidden: " in result.stdout and "rows" in result.stdout
