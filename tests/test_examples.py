"""Each example runs, on tiny inputs, in a child process with a deadline."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asyncflow.image import sample_folder

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _example(
    name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", str(EXAMPLES / name), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    return result


def test_examples_use_only_public_names() -> None:
    # issue 25.13: the notebook imported the private asyncflow._demo
    for path in EXAMPLES.iterdir():
        if path.suffix in (".py", ".ipynb"):
            private = re.findall(r"asyncflow\._\w+", path.read_text())
            assert not private, f"{path.name} uses {private}"


def test_every_example_is_tested() -> None:
    source = Path(__file__).read_text()
    for path in EXAMPLES.iterdir():
        if path.suffix in (".py", ".ipynb"):
            covered = path.name in source or (
                path.suffix == ".ipynb" and (ROOT / "tests" / "test_notebook.py").exists()
            )
            assert covered, f"{path.name} has no smoke test"


def test_train_image_folder_generated() -> None:
    out = _example(
        "train_image_folder.py", "--images", "24", "--epochs", "2", "--batch-size", "8",
        "--size", "32",
    ).stdout
    assert "3 classes: astronaut, chelsea, coffee" in out
    assert re.search(r"epoch 0: loss \d+\.\d+", out) and "epoch 1:" in out
    assert "images/s" in out and "decode" in out


def test_cached_epochs_decode_once_then_replay(tmp_path: Path) -> None:
    root = sample_folder(tmp_path / "data", 16)
    args = ("--data", str(root), "--cache", str(tmp_path / "cache"), "--epochs", "2",
            "--batch-size", "4", "--size", "32")
    first = _example("cached_epochs.py", *args)
    assert "does not exist yet" in first.stderr and "written: 16 samples" in first.stderr
    assert re.search(r"epoch 1: loss \d+\.\d+, [\d,]+ images/s", first.stdout)
    assert "status       usable" in first.stdout
    second = _example("cached_epochs.py", *args)  # nothing left to decode
    assert "written" not in second.stderr and "rebuilding" not in second.stderr
    assert "epoch 0:" in second.stdout and "epoch 1:" in second.stdout


def test_train_image_folder_given_data(tmp_path: Path) -> None:
    root = sample_folder(tmp_path / "data", 16)
    out = _example(
        "train_image_folder.py", "--data", str(root), "--epochs", "1", "--batch-size", "4",
        "--size", "32", "--max-steps", "2",
    ).stdout
    assert "epoch 0:" in out


def test_migrate_from_dataloader() -> None:
    out = _example(
        "migrate_from_dataloader.py", "--items", "64", "--batch-size", "16", "--workers", "2"
    ).stdout
    assert "torch DataLoader" in out and "asyncflow.DataLoader" in out
    assert "asyncflow Pipeline" in out
    assert out.count("identical batches") == 2


def _jpeg(i: int) -> bytes:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    pixels = np.full((48, 64, 3), (i * 37) % 256, np.uint8)
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def s3_bucket() -> object:
    pytest.importorskip("aiobotocore")
    pytest.importorskip("moto.server")
    import botocore.session

    from tests.servers import moto_server

    with moto_server() as server:
        client = botocore.session.get_session().create_client(
            "s3", endpoint_url=server.endpoint_url, region_name=server.region,
            aws_access_key_id=server.access_key, aws_secret_access_key=server.secret_key,
        )
        client.create_bucket(Bucket="photos")
        for i in range(20):
            client.put_object(Bucket="photos", Key=f"train/{i:03d}.jpg", Body=_jpeg(i))
        client.put_object(Bucket="photos", Key="train/README.txt", Body=b"not an image")
        client.close()
        yield server


def _s3_env(server: object) -> dict[str, str]:
    env = server.env()  # type: ignore[attr-defined]
    del env["AWS_ENDPOINT_URL"]  # the example's --endpoint-url must be enough on its own
    return env


def test_s3_ingest_decodes_images(s3_bucket: object) -> None:
    out = _example(
        "s3_ingest.py", "s3://photos/train/", "--endpoint-url",
        s3_bucket.endpoint_url,  # type: ignore[attr-defined]
        "--batch-size", "8", "--size", "32", "--concurrency", "16", "--decode-threads", "2",
        env=_s3_env(s3_bucket),
    ).stdout
    assert "20 objects in" in out and "objects/s" in out
    assert "(3 batches)" in out
    assert "read" in out and "decode" in out


def test_s3_ingest_raw(s3_bucket: object) -> None:
    out = _example(
        "s3_ingest.py", "s3://photos/train/", "--raw", "--batch-size", "64",
        env=s3_bucket.env(),  # type: ignore[attr-defined]
    ).stdout
    assert "21 objects in" in out and "bytes read" in out


def test_readme_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Example\n+```python\n(.*?)```", readme, flags=re.S)
    assert block, "README has an example"
    root = sample_folder(tmp_path / "imgs", 10)
    urls = [str(p) for p in sorted(root.rglob("*.jpg"))]
    script = tmp_path / "readme_example.py"
    script.write_text(
        f"urls = {urls!r}\n"
        "steps = []\n"
        "def train_step(batch):\n"
        "    steps.append(len(batch))\n"
        + textwrap.dedent(block.group(1))
        + "assert sum(steps) == len(urls), steps\n"
        "print('steps', steps)\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "steps [10]" in result.stdout
    assert "bottleneck" in result.stdout
