"""Fingerprints: stable across processes, sensitive to what changes a pipeline's output."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from asyncflow import Pipeline
from asyncflow.cache._cached import _description
from asyncflow.cache._fingerprint import (
    canonical,
    describe_change,
    describe_value,
    summarize,
    upstream_fingerprint,
)


def scale(x: Any, factor: float = 2.0) -> Any:
    return x * factor


class Decoder:
    def __init__(self, size: int) -> None:
        self.size = size
        self._calls = 0  # run-time state: not part of what it is

    def __call__(self, path: str) -> str:
        return f"{path}@{self.size}"


def test_canonical_removes_memory_addresses_and_non_json_values() -> None:
    obj = object()
    assert canonical({"a": (1, 2.5), "b": obj, 3: {2, 1}}) == {
        "a": [1, 2.5], "b": "<object object>", "3": [1, 2]}
    assert canonical(f"<x at {hex(id(obj))}>") == "<x>"
    assert canonical(float("nan")) == "nan"


def test_the_same_pipeline_has_the_same_fingerprint_in_another_process(tmp_path: Path) -> None:
    code = (
        "from asyncflow import Pipeline\n"
        "from asyncflow.cache._cached import _description\n"
        "from asyncflow.cache._fingerprint import upstream_fingerprint\n"
        "import functools, operator\n"
        "pipe = Pipeline([f'img/{i}.jpg' for i in range(300)]).map(functools.partial("
        "operator.add, 'x:')).batch(4)\n"
        "print(upstream_fingerprint(_description(pipe)))\n"
    )
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.strip() for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 16


def fp(pipe: Pipeline, key: Any = None) -> str:
    return upstream_fingerprint(_description(pipe), key)


def test_what_changes_the_fingerprint() -> None:
    files = [f"img/{i}.jpg" for i in range(100)]
    base = Pipeline(files).map(functools.partial(scale, factor=2.0)).batch(4)
    assert fp(base) == fp(Pipeline(list(files)).map(functools.partial(scale, factor=2.0)).batch(4))
    assert fp(base) != fp(Pipeline([*files[:-1], "img/x.jpg"]).map(
        functools.partial(scale, factor=2.0)).batch(4))  # the listing
    assert fp(base) != fp(Pipeline(files).map(functools.partial(scale, factor=3.0)).batch(4))
    assert fp(base) != fp(Pipeline(files).map(functools.partial(scale, factor=2.0)).batch(5))
    assert fp(base) != fp(base, key="v2")
    assert fp(Pipeline(files).map(Decoder(224))) != fp(Pipeline(files).map(Decoder(256)))
    assert fp(Pipeline(files).map(lambda x: x + 1)) != fp(Pipeline(files).map(lambda x: x + 2))


def test_describe_value_looks_inside_functions_objects_and_arrays() -> None:
    size = 224

    def decode(path: str) -> str:
        return f"{path}@{size}"

    what = describe_value(decode)
    assert what["function"].endswith("decode") and what["closure"] == [224]
    decoder = Decoder(5)
    decoder._calls = 7
    assert describe_value(decoder) == {"object": f"{__name__}.Decoder", "size": 5}
    # an array as a resume state's item token: its dtype, shape and bytes, whatever its size
    assert describe_value(np.arange(4, dtype=np.float32)).startswith("array(float32,[4],")
    assert describe_value(np.zeros(1 << 20)) != describe_value(np.ones(1 << 20))
    assert describe_value(torch.zeros(2, 3)).startswith("array(float32,[2, 3],")
    assert describe_value(torch.zeros(2, dtype=torch.bfloat16)) == "array(torch.bfloat16,[2])"
    assert describe_value(np.array([object()])) == "array(object,[1])"
    assert describe_value(list(range(1000)))["items"] == 1000
    assert describe_value(range(10**12)) == "range(0, 1000000000000)"


def test_objects_with_describe_are_described_by_it() -> None:
    class Listing:
        def __init__(self, seed: int) -> None:
            self.seed = seed

        def describe(self) -> dict[str, Any]:
            return {"files": 3}  # the seed is unused: left out

    assert describe_value(Listing(1)) == describe_value(Listing(2))


def test_summaries_stay_small_and_changes_are_described() -> None:
    description = [{"kind": "source", "listing": [f"f{i}" for i in range(5000)]},
                   {"kind": "map", "size": 224}]
    summary = summarize(description)  # the listing as a resume state identifies it
    assert len(str(summary)) < 4000 and summary[1] == {"kind": "map", "size": 224}
    assert summary[0]["listing"]["items"] == 5000
    assert summarize({"text": "x" * 1000})["text"]["items"] == 1000  # a long string: hashed
    assert summarize({"few": list(range(40))}) == {"few": list(range(40))}  # short: whole
    changed = summarize([description[0], {"kind": "map", "size": 256}])
    assert describe_change(summary, changed) == "upstream[1]['size']: 224 -> 256"
    longer = summarize([{"kind": "source", "listing": [f"f{i}" for i in range(5001)]},
                        description[1]])
    assert describe_change(summary, longer) == (
        "upstream[0]['listing']: 5001 items here, 5000 in the cache; the listing differs in "
        "items 4864-5000 (from \"'f4864'\"): their names differ")
    assert describe_change([1], [1, 2]) == "upstream went from 1 to 2 entries"
    assert describe_change({"a": 1}, {"a": 1, "b": 1}) == "upstream gained 'b'"
    assert describe_change({"a": 1, "b": 1}, {"b": 1}) == "upstream lost 'a'"


def test_summaries_mask_secrets() -> None:
    url = "https://user:pw@bucket.s3.amazonaws.com/a.jpg?X-Amz-Signature=abcdef"
    summary = summarize([{"kind": "source", "what": [url]}])
    assert "pw" not in str(summary) and "abcdef" not in str(summary)
    assert "bucket.s3.amazonaws.com/a.jpg" in str(summary)


def test_a_changed_listing_is_described_where_it_first_differs() -> None:
    def listing(root: str) -> Any:
        samples = [(f"{root}/cat/{i:04d}.jpg", i % 3) for i in range(500)]
        return summarize([{"kind": "source", "what": describe_value(samples)}])

    old, new = listing("/tmp/tmpAAAA/images"), listing("/tmp/tmpBBBB/images")
    assert describe_value([(1, 2)] * 100)["parts"][0][1] == "(1,2)"
    assert describe_change(old, new) == (  # a dataset moved: other paths
        "upstream[0]['what']: the listing differs from items 0-15: item 0 is "
        "\"('/tmp/tmpBBBB/images/cat/0000.jpg',0)\" here, "
        "\"('/tmp/tmpAAAA/images/cat/0000.jpg',0)\" in the cache")
    relabelled = [(f"/tmp/tmpAAAA/images/cat/{i:04d}.jpg", i % 3) for i in range(500)]
    relabelled[250] = (relabelled[250][0], 2)
    inside = summarize([{"kind": "source", "what": describe_value(relabelled)}])
    assert describe_change(old, inside) == (
        "upstream[0]['what']: the listing differs in items 240-255 (from "
        "\"('/tmp/tmpAAAA/images/cat/0240.jpg',0)\"): their names differ")
    long = describe_value([("x" * 300, 1)] * 100)
    assert len(long["parts"][0][1]) == 80 and "..." in long["parts"][0][1]


def test_the_entries_kept_of_a_long_listing_mask_secrets() -> None:
    urls = [f"https://user:pw@bucket.s3.amazonaws.com/{i}.jpg?X-Amz-Signature=abcdef"
            for i in range(100)]
    for summary in (summarize([{"kind": "source", "what": describe_value(urls)}]),
                    summarize([{"kind": "source", "listing": urls}])):
        text = str(summary)
        assert "pw@" not in text and "abcdef" not in text, text
        assert "bucket.s3.amazonaws.com/0.jpg" in text and "/96.jpg" in text


def _rewrite(file: Path, data: bytes) -> None:
    """Rewrite ``file`` in place, its modification time a second later than before."""
    before = file.stat()
    file.write_bytes(data)
    os.utime(file, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize("count", [3, 100])  # listed item by item, and digested
def test_a_file_rewritten_in_place_changes_the_fingerprint(tmp_path: Path, count: int) -> None:
    files = [tmp_path / f"{i}.jpg" for i in range(count)]
    for file in files:
        file.write_bytes(b"x" * 10)
    listing = [(str(file), i % 2) for i, file in enumerate(files)]

    def pipe() -> Pipeline:
        return Pipeline(list(listing)).map(functools.partial(scale, factor=2.0))

    base = fp(pipe())
    assert fp(pipe()) == base
    _rewrite(files[1], b"y" * 10)  # the same size, a new modification time
    same_size = fp(pipe())
    assert same_size != base
    _rewrite(files[1], b"y" * 11)  # another size
    assert fp(pipe()) not in (base, same_size)


def test_a_file_changed_in_place_is_described(tmp_path: Path) -> None:
    files = [tmp_path / f"{i:03d}.jpg" for i in range(100)]
    for file in files:
        file.write_bytes(b"x" * 10)
    listing = [(str(file), i % 2) for i, file in enumerate(files)]
    old = summarize(_description(Pipeline(listing)))
    _rewrite(files[70], b"y" * 10)  # the same size, a new modification time
    change = describe_change(old, summarize(_description(Pipeline(listing))))
    assert change.startswith(  # the name is cut to 80 characters where the path is long
        "upstream[0]['what']: the same names, but the content of a file in items 68-71 ")
    assert change.endswith("068.jpg',0)\") changed"), change


def test_a_short_listing_names_the_changed_file(tmp_path: Path) -> None:
    file = tmp_path / "a.jpg"
    file.write_bytes(b"x" * 10)
    old = summarize(_description(Pipeline([str(file)])))
    _rewrite(file, b"x" * 12)
    change = describe_change(old, summarize(_description(Pipeline([str(file)]))))
    assert change == "upstream[0]['what'][0]['bytes']: 10 -> 12"


def test_names_that_are_not_local_files_are_left_as_they_are(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    names = ["https://host/a.jpg", "s3://bucket/a.jpg", "no/such/file.jpg", str(tmp_path / "d")]
    assert describe_value(names) == names


def test_runs_of_the_upstream_do_not_change_the_fingerprint() -> None:
    """Issue 25, point 16: a sampler's epoch (set by each run) is where its runs are, not
    what it lists."""
    from asyncflow.sources import RandomSampler, SequentialSampler

    for sampler in (SequentialSampler(10), RandomSampler(10, seed=1)):
        pipe = Pipeline(sampler).map(float)
        before = upstream_fingerprint(_description(pipe))
        list(pipe)
        list(pipe)
        assert upstream_fingerprint(_description(pipe)) == before
        sampler.seed = 2  # what it lists: a change
        assert upstream_fingerprint(_description(pipe)) != before
