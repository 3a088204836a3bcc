"""Tar shards never yield damaged data: each class of damage is an error naming the offset.

Truncation is swept over every byte offset of a shard through the sans-I/O decoder (fast),
then each offset class is checked once through ``tar_samples`` end to end.
"""

from __future__ import annotations

import asyncio
import gzip
import io
import pathlib
import re
import tarfile
import threading
import zlib
from typing import Any

import pytest

from asyncflow import Pipeline, SourceError, sources
from asyncflow.sources._tarstream import Event, ShardDecoder, parse_pax

pytestmark = pytest.mark.usefixtures("warm_executor", "async_leak_check")

MAX = 1 << 20


def make_tar(members: list[tuple[str, bytes]], *, fmt: int = tarfile.PAX_FORMAT,
             pax: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if pax is not None:
                info.pax_headers = dict(pax)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def header(name: str, *, size: bytes | int = 0, kind: bytes = tarfile.REGTYPE) -> bytes:
    """One ustar header block; ``size`` may be a raw 12-byte field (base-256, signed...)."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size if isinstance(size, int) else 0
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    if isinstance(size, bytes):
        block[124:136] = size
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\x00 " % sum(block)
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + b"\x00" * (-len(data) % 512)


def pax_header(records: bytes, *, size: bytes | int | None = None) -> bytes:
    return header("././@PaxHeader", size=len(records) if size is None else size,
                  kind=tarfile.XHDTYPE) + padded(records)


def rec(key: str, value: str) -> bytes:
    """One well-formed pax record (its length counts its own digits)."""
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


END = b"\x00" * 1024
SAMPLES = [("s/0.jpg", b"J0" * 300), ("s/0.cls", b"0"), ("s/1.jpg", b"J1" * 700),
           ("s/1.cls", b"1")]
# Where things lie in make_tar(SAMPLES, fmt=USTAR_FORMAT): four headers, then the end blocks.
H0, H1, H2, H3 = 0, 1536, 2560, 4608
EOA = H3 + 1024


def decode(raw: bytes, chunk: int = 1 << 20) -> tuple[list[tuple[str, bytes]], Exception | None]:
    """The members a decoder returns for ``raw`` fed ``chunk`` bytes at a time, and its error."""
    decoder = ShardDecoder("shard.tar", MAX)
    events: list[Event] = []
    for pos in range(0, len(raw), chunk):
        decoder.push(raw[pos:pos + chunk])
        more = True
        while more:
            got, more = decoder.pump()
            events += got
    decoder.finish()
    more = True
    while more:
        got, more = decoder.pump()
        events += got
    return [(n, d) for n, d in events if d is not None], decoder.error


async def samples_and_error(path: pathlib.Path) -> tuple[list[dict[str, Any]], Exception | None]:
    seen: list[dict[str, Any]] = []
    try:
        async for sample in sources.tar_samples(path):
            seen.append(sample)
    except SourceError as exc:
        return seen, exc
    return seen, None


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("chunk", [1, 511, 513, 1 << 20])
def test_a_valid_shard_yields_every_member_however_it_is_chunked(fmt: int, chunk: int) -> None:
    long_name = "/".join(["deep"] * 30) + "/x.jpg" if fmt != tarfile.USTAR_FORMAT else "a.jpg"
    members = [*SAMPLES, (long_name, b"L"), ("empty.txt", b"")]
    assert decode(make_tar(members, fmt=fmt), chunk) == (members, None)


def test_truncation_at_every_offset_is_an_error_and_never_yields_damage() -> None:
    members = [("ü/" + "n" * 120 + ".jpg", b"x" * 700), *SAMPLES]  # a pax header first
    raw = make_tar(members)
    end = raw.index(b"s/1.cls") + 1024 + 1024  # just past the end-of-archive blocks
    for cut in range(end):
        got, error = decode(raw[:cut], chunk=509)
        assert error is not None, f"cut at {cut} accepted"
        assert f"at byte {cut}" in str(error) or cut == 0, (cut, error)
        assert got == members[:len(got)], cut  # a prefix of the true members, never damage
    assert decode(raw[:end]) == (members, None)


@pytest.mark.parametrize(
    ("cut", "message", "keys"),
    [
        (0, "empty shard", []),
        (H0 + 100, "inside a tar header", []),
        (H0 + 512 + 599, r"'s/0.jpg' \(header at byte 0\) ends inside its data", []),
        (H1, "no end-of-archive marker after a member", []),
        (H2 + 511, "inside a tar header", []),
        (H2 + 1000, r"'s/1.jpg' \(header at byte 2560\) ends inside its data", ["s/0"]),
        (H3 - 10, "'s/1.jpg' .* ends inside its padding", ["s/0"]),
        (H3 + 512 + 1, "'s/1.cls' .* ends inside its padding", ["s/0"]),
        (EOA, "no end-of-archive marker after a member", ["s/0"]),
        (EOA + 512, "inside the end-of-archive marker", ["s/0"]),
        (EOA + 700, "inside the end-of-archive marker", ["s/0"]),
    ],
)
async def test_each_truncation_class_yields_only_whole_samples(
    tmp_path: pathlib.Path, cut: int, message: str, keys: list[str]
) -> None:
    raw = make_tar(SAMPLES, fmt=tarfile.USTAR_FORMAT)
    assert raw[EOA:EOA + 1024] == END and raw[H3:H3 + 100].startswith(b"s/1.cls")
    shard = tmp_path / "cut.tar"
    shard.write_bytes(raw[:cut])
    seen, error = await samples_and_error(shard)
    assert error is not None and str(shard) in str(error)
    assert f"at byte {cut}" in str(error)
    assert re.search(message, str(error)), str(error)
    assert [s["__key__"] for s in seen] == keys
    assert all(s == {"__key__": "s/0", "__url__": str(shard), "jpg": b"J0" * 300, "cls": b"0"}
               for s in seen)


async def test_a_whole_shard_with_record_padding_yields_everything(tmp_path: pathlib.Path) -> None:
    shard = tmp_path / "ok.tar"
    shard.write_bytes(make_tar(SAMPLES) + b"\x00" * 20000)
    seen, error = await samples_and_error(shard)
    assert error is None and [s["__key__"] for s in seen] == ["s/0", "s/1"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty shard"),
        (gzip.compress(b""), "empty shard"),
        (END, "empty archive"),
        (END + b"\x00" * 9216, "empty archive"),
        (header("a.txt") + b"\x00" * 512 + header("b.txt") + END, "lone zero block"),
        (header("a.txt") + b"\x00" * 512, "inside the end-of-archive marker"),
    ],
)
def test_empty_shards_and_bad_end_markers(raw: bytes, message: str) -> None:
    _, error = decode(raw)
    assert error is not None and message in str(error)


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (b"\xff" + (256 ** 11 - 5).to_bytes(11, "big"), "negative size -5"),  # base-256
        (b"-0000000777\x00", "negative size"),  # octal digits after a minus sign
        (b"\x80" + (1 << 40).to_bytes(11, "big"), "over max_member_bytes"),  # base-256, huge
        (b"0000000012x\x00", "corrupt header"),
    ],
)
def test_bad_header_sizes_are_refused(size: bytes, message: str) -> None:
    raw = header("a.jpg", size=5) + padded(b"AAAAA") + header("b.jpg", size=size) \
        + padded(b"data follows and must not swallow the next member") + header("c.jpg") + END
    got, error = decode(raw)
    assert got == [("a.jpg", b"AAAAA")]
    assert error is not None and message in str(error) and "at byte 1024" in str(error)


@pytest.mark.parametrize(
    ("records", "message"),
    [
        (rec("size", "-5"), "bad pax size '-5'"),
        (rec("size", "+5"), "bad pax size"),
        (rec("size", " 5"), "bad pax size"),
        (rec("size", "1_0"), "bad pax size"),
        (rec("size", "9" * 30), "bad pax size"),
        (rec("size", "9"), "disagrees with its header's 5"),
        (b"99 path=a.jpg\n", "length 99 disagrees"),
        (b"3 path=a.jpg\n", "length 3 disagrees"),
        (b"0 path=a.jpg\n", "length 0 disagrees"),
        (b"-13 path=a.jpg\n", "without a decimal length"),
        (b"x path=a.jpg\n", "without a decimal length"),
        (b"13 path=a.jpgX", "disagrees"),
        (b"12 pathajpg\n", "without a key"),
        (b"9 =a.jpg\n", "without a key"),
        (b"30 GNU.sparse.major=1\n", "disagrees"),
        (b"22 GNU.sparse.major=1\n", "sparse file"),
    ],
)
def test_bad_pax_records_are_refused(records: bytes, message: str) -> None:
    raw = header("a.jpg", size=1) + padded(b"A") + pax_header(records) \
        + header("b.jpg", size=5) + padded(b"BBBBB") + END
    got, error = decode(raw)
    assert got == [("a.jpg", b"A")]
    assert error is not None and message in str(error), error
    assert "at byte 1536" in str(error) or "at byte 2048" in str(error)


@pytest.mark.parametrize(
    "size", [b"\xff" + (256 ** 11 - 1).to_bytes(11, "big"), (1 << 20) + 1, b"\x80" + b"\xff" * 11]
)
def test_bad_extended_header_sizes_are_refused(size: bytes | int) -> None:
    for kind in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME):
        raw = header("a.jpg") + header("././@LongLink", size=size, kind=kind) + b"x" * 2048 + END
        got, error = decode(raw)
        assert got == [("a.jpg", b"")]
        assert error is not None and "extended header size" in str(error)
        assert "at byte 512" in str(error)


def test_a_pax_header_of_many_tiny_records_is_read_in_linear_time() -> None:
    # One pax header may hold a megabyte of 6-byte records; the check for NUL fill after the
    # last record once copied the rest of the header at every record (quadratic: seconds of
    # CPU for each such member). Counted in bytes copied, not timed: each byte once or so.
    copied = [0]

    class Counted(bytes):
        def __getitem__(self, key: Any) -> Any:
            out = super().__getitem__(key)
            if isinstance(key, slice):
                copied[0] += len(out)
            return out

    data = Counted(b"6 a=b\n" * 4096 + b"\x00" * 100)
    assert parse_pax(data, lambda why, at: SourceError(why)) == {"a": "b"}
    assert copied[0] <= 2 * len(data)


def test_pax_size_overrides_a_zero_header_size() -> None:
    raw = pax_header(rec("size", "700")) + header("big.jpg") + padded(b"b" * 700) + END
    assert decode(raw) == ([("big.jpg", b"b" * 700)], None)


def test_an_extended_header_without_a_member_is_refused() -> None:
    _, error = decode(header("a.jpg") + pax_header(rec("path", "b.jpg")) + END)
    assert error is not None and "extended header with no member" in str(error)


def test_gnu_long_names_and_global_headers() -> None:
    name = "g/" + "n" * 300 + ".jpg"
    long = header("././@LongLink", size=len(name) + 1, kind=tarfile.GNUTYPE_LONGNAME)
    comment = rec("comment", "a commit id")
    glob = header("pax_global_header", size=len(comment), kind=tarfile.XGLTYPE) + padded(comment)
    raw = glob + long + padded(name.encode() + b"\x00") + header("short.jpg", size=1) \
        + padded(b"x") + END
    assert decode(raw) == ([(name, b"x")], None)
    long_evil = header("././@LongLink", size=12, kind=tarfile.GNUTYPE_LONGNAME) \
        + padded(b"../../x.jpg\x00")
    _, error = decode(long_evil + header("x.jpg") + END)
    assert error is not None and "'..' component" in str(error)


@pytest.mark.parametrize(
    ("kind", "pax", "message"),
    [
        (tarfile.GNUTYPE_SPARSE, None, "sparse file"),
        (tarfile.REGTYPE, {"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}, "sparse file"),
        (tarfile.REGTYPE, {"GNU.sparse.size": "100"}, "sparse file"),
        (b"V", None, "unsupported type b'V'"),
        (tarfile.CONTTYPE, {"path": "../up.jpg"}, "'..' component"),
        (tarfile.REGTYPE, {"path": "/abs.jpg"}, "absolute path"),
        (tarfile.SYMTYPE, {"linkpath": "ok.jpg"}, "is a link"),
    ],
)
def test_refused_member_kinds(kind: bytes, pax: dict[str, str] | None, message: str) -> None:
    info = tarfile.TarInfo("x/bad.jpg")
    info.type = kind
    if pax:
        info.pax_headers = pax
    raw = header("ok.jpg", size=2) + padded(b"ok") \
        + info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + END
    got, error = decode(raw)
    assert got == [("ok.jpg", b"ok")]
    assert error is not None and message in str(error) and "refused" in str(error)


@pytest.mark.parametrize("where", ["mid-stream", "at a member boundary", "in the trailer"])
async def test_gzip_shards_cut_short(tmp_path: pathlib.Path, where: str) -> None:
    raw = make_tar(SAMPLES, fmt=tarfile.USTAR_FORMAT)
    data = gzip.compress(raw)
    if where == "mid-stream":
        data = data[: len(data) // 2]
    elif where == "at a member boundary":
        data = gzip.compress(raw[:H2])  # a whole gzip stream of a tar without its end
    else:
        data = data[:-4]  # the length field of the gzip trailer is missing
    shard = tmp_path / "cut.tar.gz"
    shard.write_bytes(data)
    seen, error = await samples_and_error(shard)
    assert error is not None and str(shard) in str(error)
    assert re.search(r"truncated|corrupt gzip|ends early", str(error))
    assert all(s["jpg"] == b"J0" * 300 for s in seen)


def test_a_gzip_bomb_is_inflated_a_slice_at_a_time() -> None:
    raw = make_tar([(f"z/{i}.bin", b"\x00" * (4 << 20)) for i in range(8)])
    decoder = ShardDecoder("bomb.tar.gz", 8 << 20)
    decoder.push(gzip.compress(raw))
    sizes = []
    more = True
    while more:
        events, more = decoder.pump()
        sizes.append(sum(len(d) for _, d in events if d is not None))
    assert decoder.error is None and sum(sizes) == 32 << 20
    assert len(sizes) > 1 and max(sizes) <= 20 << 20


async def test_a_cut_mid_member_still_yields_the_whole_sample_before_it(
    tmp_path: pathlib.Path,
) -> None:
    members = [(f"k/{i}.{ext}", bytes([i]) * 2000) for i in range(5) for ext in ("jpg", "cls")]
    raw = make_tar(members)
    at = raw.index(b"k/3.jpg")  # the header of sample 3's first member (after a pax header)
    shard = tmp_path / "cut.tar"
    shard.write_bytes(raw[: at + 512 + 100])
    seen, error = await samples_and_error(shard)
    assert [s["__key__"] for s in seen] == ["k/0", "k/1", "k/2"]
    assert error is not None and "'k/3.jpg'" in str(error)


async def test_decoding_runs_off_the_event_loop(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[str, set[threading.Thread]] = {"frombuf": set(), "inflate": set()}
    real_frombuf = tarfile.TarInfo.frombuf.__func__  # type: ignore[attr-defined]
    real_decompressobj = zlib.decompressobj

    def frombuf(cls: Any, *args: Any) -> Any:
        threads["frombuf"].add(threading.current_thread())
        return real_frombuf(cls, *args)

    class Inflater:
        def __init__(self, **kwargs: Any) -> None:
            self._real = real_decompressobj(**kwargs)

        def decompress(self, *args: Any) -> bytes:
            threads["inflate"].add(threading.current_thread())
            return self._real.decompress(*args)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

    monkeypatch.setattr(tarfile.TarInfo, "frombuf", classmethod(frombuf))
    monkeypatch.setattr(zlib, "decompressobj", Inflater)
    shard = tmp_path / "s.tar.gz"
    shard.write_bytes(gzip.compress(make_tar(SAMPLES)))
    seen, error = await samples_and_error(shard)
    assert error is None and len(seen) == 2
    loop_thread = threading.current_thread()
    assert threads["frombuf"] and loop_thread not in threads["frombuf"]
    assert threads["inflate"] and loop_thread not in threads["inflate"]


async def test_a_slow_decode_does_not_block_the_loop(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_pump = ShardDecoder.pump

    def stuck_pump(self: ShardDecoder) -> Any:
        release.wait(10)
        return real_pump(self)

    monkeypatch.setattr(ShardDecoder, "pump", stuck_pump)
    shard = tmp_path / "s.tar"
    shard.write_bytes(make_tar(SAMPLES))
    task = asyncio.create_task(samples_and_error(shard))
    await asyncio.sleep(0)
    ticks = 0
    for _ in range(5):  # the loop keeps running while the decoder is held up
        await asyncio.sleep(0.01)
        ticks += 1
    assert not task.done() and ticks == 5
    release.set()
    async with asyncio.timeout(10):
        seen, error = await task
    assert error is None and len(seen) == 2


async def test_under_a_failure_budget_whole_samples_are_kept_and_the_damage_counted(
    tmp_path: pathlib.Path,
) -> None:
    good = tmp_path / "good.tar"
    good.write_bytes(make_tar(SAMPLES, fmt=tarfile.USTAR_FORMAT))
    cut = tmp_path / "cut.tar"
    cut.write_bytes(good.read_bytes()[:EOA])  # at a member boundary, no end marker
    pipe = Pipeline([str(good), str(cut), str(good)]).flat_map(
        sources.tar_samples, name="shards", max_failures=1)
    keys = [(s["__url__"], s["__key__"]) async for s in pipe]
    assert keys == [(str(good), "s/0"), (str(good), "s/1"), (str(cut), "s/0"),
                    (str(good), "s/0"), (str(good), "s/1")]
    (failure,) = pipe.stats().failures
    assert failure.stage == "shards" and failure.error_type == "SourceError"
    assert "no end-of-archive marker" in failure.message and f"at byte {EOA}" in failure.message
