"""list_objects on local folders, local and HTTP manifests (S3 listings are in test_s3.py)."""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import pytest

import asyncflow
from asyncflow import Pipeline, SourceError, SourceNotFound, SourcePermissionError, sources
from asyncflow.sources import ObjectInfo
from tests.servers import FaultServer, generated

pytestmark = pytest.mark.usefixtures("warm_executor", "async_leak_check")


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    for name in ["b/2.jpg", "b/10.jpg", "a.jpg", "c/d/e.png", "cat_1.jpg", "cat_2.jpg"]:
        path = tmp_path / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode())
    return tmp_path / "data"


async def collect(it: object) -> list[object]:
    return [x async for x in it]  # type: ignore[attr-defined]


async def test_local_folder_is_walked_sorted(tree: pathlib.Path) -> None:
    listed = await collect(sources.list_objects(tree))
    names = ["a.jpg", "b/10.jpg", "b/2.jpg", "c/d/e.png", "cat_1.jpg", "cat_2.jpg"]
    assert listed == [str(tree / n) for n in names]
    assert all(isinstance(x, str) for x in listed)


async def test_file_url_lists_file_urls_with_detail(tree: pathlib.Path) -> None:
    infos = await collect(sources.list_objects(tree.as_uri() + "/b", detail=True))
    assert infos == [ObjectInfo((tree / "b/10.jpg").as_uri(), 8),
                     ObjectInfo((tree / "b/2.jpg").as_uri(), 7)]
    assert await asyncflow.read_bytes(infos[0]) == b"b/10.jpg"  # type: ignore[arg-type]


async def test_a_path_prefix_lists_like_an_s3_prefix(tree: pathlib.Path) -> None:
    assert await collect(sources.list_objects(tree / "cat_")) == [
        str(tree / "cat_1.jpg"), str(tree / "cat_2.jpg")]
    with pytest.raises(SourceNotFound, match="zzz: nothing is listed there"):
        await collect(sources.list_objects(tree / "zzz"))
    assert await collect(sources.list_objects(tree / "zzz", allow_empty=True)) == []


async def test_a_prefix_in_the_working_folder(
    tree: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A prefix with no folder part was matched against "./cat_1.jpg": nothing was listed.
    monkeypatch.chdir(tree)
    assert await collect(sources.list_objects("cat_")) == ["cat_1.jpg", "cat_2.jpg"]
    assert await collect(sources.list_objects("a", detail=True)) == [ObjectInfo("a.jpg", 5)]


async def test_missing_folder(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SourceNotFound):
        await collect(sources.list_objects(tmp_path / "nope" / "deeper"))


async def test_an_unreadable_subfolder_is_an_error_naming_it(
    tree: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not chmod: the tests may run as root, who reads any folder.
    scandir = os.scandir

    def refusing(path: Any = ".") -> Any:
        if os.fspath(path) == str(tree / "c"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(SourcePermissionError, match=f"^{re.escape(str(tree / 'c'))}: permission"):
        await collect(sources.list_objects(tree))


async def test_a_single_file_lists_itself(tree: pathlib.Path) -> None:
    assert await collect(sources.list_objects(tree / "a.jpg")) == [str(tree / "a.jpg")]


async def test_local_manifest(tree: pathlib.Path) -> None:
    manifest = tree / "train.txt"
    manifest.write_text("# training images\n\na.jpg\n  b/2.jpg  \n/abs/x.jpg\ns3://bkt/k.jpg\n")
    assert await collect(sources.list_objects(manifest)) == [
        str(tree / "a.jpg"), str(tree / "b/2.jpg"), "/abs/x.jpg", "s3://bkt/k.jpg"]


async def test_http_manifest_resolves_relative_urls(
    http_server: FaultServer, unique: str
) -> None:
    lines = f"# shard list\n/gen/10/{unique}-a\n../../gen/20/{unique}-b\nhttps://other.invalid/x\n"
    url = http_server.put(f"{unique}/list.txt", lines.encode())
    listed = await collect(sources.list_objects(url))
    assert listed == [http_server.url(f"/gen/10/{unique}-a"),
                      http_server.url(f"/gen/20/{unique}-b"), "https://other.invalid/x"]
    bodies = [b async for b in Pipeline(listed[:2]).map(asyncflow.read_bytes, concurrency=2)]
    assert bodies == [generated(f"/gen/10/{unique}-a", 10), generated(f"/gen/20/{unique}-b", 20)]


async def test_remote_manifest_may_not_name_local_files(
    http_server: FaultServer, unique: str
) -> None:
    url = http_server.put(f"{unique}/evil.txt", b"/gen/1/ok\nfile:///etc/passwd\n")
    with pytest.raises(SourcePermissionError, match="line 2 names a local file"):
        await collect(sources.list_objects(url))


async def test_missing_manifest(http_server: FaultServer, unique: str) -> None:
    with pytest.raises(SourceNotFound, match="404"):
        await collect(sources.list_objects(http_server.url(f"/store/{unique}/none.txt")))


async def test_disabled_scheme_is_refused_at_the_call(http_server: FaultServer) -> None:
    with pytest.raises(SourcePermissionError):
        sources.list_objects(http_server.url("/x.txt"), schemes={"file"})
    with pytest.raises(SourcePermissionError):
        sources.list_objects("s3://bucket/prefix/", schemes={"http", "https"})


async def test_a_listing_is_a_pipeline_source(tree: pathlib.Path) -> None:
    pipe = Pipeline(lambda: sources.list_objects(tree / "b")).map(asyncflow.read_bytes)
    for _ in range(2):  # a factory source: a fresh listing every epoch
        assert [b async for b in pipe] == [b"b/10.jpg", b"b/2.jpg"]


APACHE_INDEX = b"""<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 3.2 Final//EN">
<html><head><title>Index of /train</title></head><body>
<h1>Index of /train</h1>
<a href="0001.jpg">0001.jpg</a>
</body></html>
"""


@pytest.mark.parametrize("page", [
    APACHE_INDEX,
    b"\xef\xbb\xbf\n\n  <html><body><a href='a.jpg'>a.jpg</a></body></html>",
    b'<?xml version="1.0"?><ListBucketResult></ListBucketResult>',
    b'{"urls": ["a.jpg", "b.jpg"]}',
    b'["a.jpg", "b.jpg"]',
])
async def test_a_document_is_refused_not_turned_into_urls(
    http_server: FaultServer, unique: str, page: bytes
) -> None:
    url = http_server.put(f"{unique}/index.html", page) + "?sig=s3cr3t"
    with pytest.raises(SourceError, match="not a list of URLs") as info:
        await collect(sources.list_objects(url))
    message = str(info.value)
    assert f"/store/{unique}/index.html?sig=***" in message and "s3cr3t" not in message
    assert "one URL per line" in message


@pytest.mark.parametrize(("body", "bad"), [
    (b"a.jpg\nb.jpg\nIndex of /train\n", 3),
    (b"# list\n\na.jpg\n<a href='b.jpg'>b</a>\n", 4),
    (b'a.jpg\n"b.jpg"\n', 2),
    (b"a.jpg\nb\x00.jpg\n", 2),
])
async def test_a_line_that_is_not_a_url_is_refused(
    http_server: FaultServer, unique: str, body: bytes, bad: int
) -> None:
    url = http_server.put(f"{unique}/list.txt", body)
    with pytest.raises(SourceError, match=f"line {bad} is not a URL.*one URL per line"):
        await collect(sources.list_objects(url))


async def test_a_local_html_page_is_refused(tree: pathlib.Path) -> None:
    page = tree / "index.txt"
    page.write_bytes(APACHE_INDEX)
    with pytest.raises(SourceError, match="an HTML or XML page, not a list of URLs"):
        await collect(sources.list_objects(page))


async def test_local_paths_may_begin_with_brackets(tree: pathlib.Path) -> None:
    manifest = tree / "odd.txt"
    manifest.write_text("[2020] a.jpg\n<b>.jpg\n")
    assert await collect(sources.list_objects(manifest)) == [
        str(tree / "[2020] a.jpg"), str(tree / "<b>.jpg")]


async def test_manifest_with_a_bom_and_percent_encoded_names(
    http_server: FaultServer, unique: str
) -> None:
    url = http_server.put(f"{unique}/list.txt", "\ufeffa%20b.jpg\r\nc\u00e9.jpg\r\n".encode())
    assert await collect(sources.list_objects(url)) == [
        http_server.url(f"/store/{unique}/a%20b.jpg"),
        http_server.url(f"/store/{unique}/c\u00e9.jpg"),
    ]
