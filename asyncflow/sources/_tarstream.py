"""Sans-I/O decoding of a tar shard: raw bytes in, checked members out.

:class:`ShardDecoder` never awaits and never blocks: ``_tar.py`` pushes the shard's bytes into
it on the event loop and runs :meth:`ShardDecoder.pump` (gzip inflation, ``_inflate.py``, and
header parsing) in a worker thread, one short call at a time, so that no thread ever waits on
the loop.

Headers are decoded by ``tarfile.TarInfo.frombuf`` (checksum, octal and base-256 numbers);
everything around them is checked here, because ``tarfile``'s streaming mode accepts what a
shard must not contain: it stops at the first zero block, accepts a stream that simply ends
between members, and takes sizes and pax record lengths on trust. Here:

* every size and length (header, base-256, pax ``size``, pax record lengths) is validated
  before use: negative, too large or inconsistent is an error;
* the archive must end with its two zero blocks; a stream that ends anywhere else (inside a
  header, data, padding, between members or inside the end blocks) is an error, and so is an
  empty one;
* absolute names, ``..`` components, links, devices, FIFOs, sparse and unknown members are
  refused by explicit checks (never ``assert``, so this holds under ``python -O``).

Each error is a :class:`SourceError` naming the shard and the byte offset. The members
complete before the damage are returned first: :meth:`ShardDecoder.pump` returns them and
keeps the error in :attr:`ShardDecoder.error`.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable

from .._errors import SourceError
from ._inflate import Inflater

__all__ = ["Event", "ShardDecoder", "unsafe_reason"]

#: ``(name, None)`` when a member's header has been read (the sample before it, if its key
#: differs, is complete), then ``(name, data)`` once its data has arrived whole.
Event = tuple[str, bytes | None]

_BLOCK = tarfile.BLOCKSIZE
_EXT_MAX = 1 << 20  # largest pax or GNU long-name header accepted
_STEP = 4 << 20  # gzip output inflated at a time
_BUDGET = 16 << 20  # member bytes returned by one pump at most (bounds a gzip bomb's memory)
_REGULAR = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
_LINKS = frozenset({tarfile.LNKTYPE, tarfile.SYMTYPE})
_DEVICES = frozenset({tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE})
_PAX = frozenset({tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE})
_EXTENSIONS = _PAX | {tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}
_DRIVE = re.compile(r"^[A-Za-z]:")
_DECIMAL = re.compile(r"[0-9]{1,20}")
_PAX_LENGTH = re.compile(rb"([0-9]{1,8}) ")


def unsafe_reason(name: str) -> str | None:
    """Why a member called ``name`` may not be used, or ``None`` if it may."""
    if not name:
        return "empty name"
    if "\x00" in name:
        return "NUL in name"
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "'..' component"
    return None


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def parse_pax(data: bytes, fail: Callable[[str, int], SourceError]) -> dict[str, str]:
    """The ``"<length> <key>=<value>\\n"`` records of a pax header, each length checked."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0 and not data[pos:].strip(b"\x00"):
            break  # NUL fill after the last record, as some writers leave
        match = _PAX_LENGTH.match(data, pos)
        if match is None:
            raise fail("pax record without a decimal length", pos)
        end = pos + int(match.group(1))
        if end > len(data) or end < match.end() + 2 or data[end - 1] != 0x0A:
            raise fail(f"pax record length {int(match.group(1))} disagrees with its data", pos)
        key, eq, value = data[match.end():end - 1].partition(b"=")
        if not eq or not key:
            raise fail("pax record without a key", pos)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return records


class _TarParser:
    """The tar stream's state machine: each state waits for ``_want`` bytes, then runs."""

    def __init__(self, what: str, max_member_bytes: int, unit: str) -> None:
        self._what = what
        self._max = max_member_bytes
        self._unit = unit  # how offsets are counted: in the file, or in the inflated stream
        self._buf = bytearray()
        self._at = 0  # stream offset of self._buf[0]
        self._want = _BLOCK
        self._state: Callable[[list[Event]], None] = self._header
        self._pax: dict[str, str] = {}
        self._pax_global: dict[str, str] = {}
        self._long_name: str | None = None
        self._ext_at: int | None = None  # where pending extension headers began
        self._member: tuple[str, int, int] = ("", 0, 0)  # name, size, header offset
        self._ext_type = b""
        self._files = 0
        self.given = 0  # member bytes returned since the owner last reset this
        self.done = False

    def _error(self, message: str, at: int) -> SourceError:
        return SourceError(f"{self._what}: {message} at byte {at}{self._unit}")

    def push(self, data: bytes) -> None:
        if self.done:
            self._at += len(data)  # record padding after the end-of-archive blocks
        else:
            self._buf += data

    def run(self, out: list[Event], budget: int) -> bool:
        """Parse what is buffered; ``True`` if :attr:`given` reached ``budget`` first."""
        while not self.done and len(self._buf) >= self._want:
            if self.given >= budget:
                return True
            self._state(out)
        return False

    def close(self) -> None:
        """The stream has ended: it must have ended at the end-of-archive marker."""
        if self.done:
            if not self._files:
                raise self._error("empty archive: no files before the end-of-archive marker",
                                  self._at)
            return
        end = self._at + len(self._buf)
        if end == 0:
            raise self._error("empty shard: no data", 0)
        if self._state == self._header and not self._buf:
            what = "an extended header" if self._ext_at is not None else "a member"
            raise self._error(f"truncated shard: no end-of-archive marker after {what}", end)
        if self._state == self._header:
            raise self._error("truncated shard: it ends inside a tar header", end)
        if self._state == self._second_zero_block:
            raise self._error("truncated shard: it ends inside the end-of-archive marker", end)
        if self._state == self._extension:
            raise self._error("truncated shard: it ends inside an extended header", end)
        name, size, at = self._member
        where = "data" if self._at + size > end else "padding"
        raise self._error(f"truncated shard: tar member {name!r} (header at byte {at}) ends "
                          f"inside its {where}", end)

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        self._at += n
        return data

    def _expect(self, n: int, state: Callable[[list[Event]], None]) -> None:
        self._want, self._state = n, state

    def _header(self, out: list[Event]) -> None:
        at = self._at
        block = self._take(_BLOCK)
        if block.count(0) == _BLOCK:
            if self._ext_at is not None:
                raise self._error("extended header with no member after it", self._ext_at)
            self._expect(_BLOCK, self._second_zero_block)
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except (tarfile.HeaderError, ValueError) as exc:
            raise self._error(f"not a tar archive, or a corrupt header ({exc})", at) from None
        if info.type in _EXTENSIONS:
            self._extension_header(info, at)
        else:
            self._member_header(info, at, out)

    def _extension_header(self, info: tarfile.TarInfo, at: int) -> None:
        if not 0 <= info.size <= _EXT_MAX:
            raise self._error(f"extended header size {info.size} out of range", at)
        self._ext_at = at if self._ext_at is None else self._ext_at
        self._member = ("", info.size, at)
        self._ext_type = info.type
        self._expect(_padded(info.size), self._extension)

    def _extension(self, out: list[Event]) -> None:
        _, size, at = self._member
        data = self._take(self._want)[:size]
        if self._ext_type == tarfile.GNUTYPE_LONGNAME:
            self._long_name = data.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
        elif self._ext_type != tarfile.GNUTYPE_LONGLINK:  # links are refused anyway

            def fail(message: str, pos: int) -> SourceError:
                return self._error(message, at + _BLOCK + pos)

            records = parse_pax(data, fail)
            (self._pax_global if self._ext_type == tarfile.XGLTYPE else self._pax).update(records)
        self._expect(_BLOCK, self._header)

    def _member_header(self, info: tarfile.TarInfo, at: int, out: list[Event]) -> None:
        pax = {**self._pax_global, **self._pax}
        name = pax.get("path", self._long_name or info.name)
        self._pax, self._long_name, self._ext_at = {}, None, None
        out.append((name, None))
        refusal = self._refusal(info, name, pax)
        if refusal is not None:
            raise self._error(f"tar member {name!r} {refusal}; refused", at)
        size = self._size(info, pax, name, at)
        self._member = (name, size, at)
        self._expect(_padded(size), self._skip if info.type == tarfile.DIRTYPE else self._data)

    def _refusal(self, info: tarfile.TarInfo, name: str, pax: dict[str, str]) -> str | None:
        if info.type in _LINKS:
            return "is a link"
        if info.type in _DEVICES:
            return "is a device or FIFO"
        if info.type == tarfile.GNUTYPE_SPARSE or any(k.startswith("GNU.sparse.") for k in pax):
            return "is a sparse file"
        if info.type not in _REGULAR and info.type != tarfile.DIRTYPE:
            return f"has unsupported type {info.type!r}"
        reason = unsafe_reason(name)
        return None if reason is None else f"is unsafe ({reason})"

    def _size(self, info: tarfile.TarInfo, pax: dict[str, str], name: str, at: int) -> int:
        size: int = info.size
        if "size" in pax:
            text = pax["size"]
            if not _DECIMAL.fullmatch(text):
                raise self._error(f"tar member {name!r} has a bad pax size {text!r}", at)
            if size not in (0, int(text)):
                raise self._error(f"tar member {name!r}: pax size {text} disagrees with its "
                                  f"header's {size}", at)
            size = int(text)
        if size < 0:
            raise self._error(f"tar member {name!r} has a negative size {size}", at)
        if size > self._max:
            raise self._error(f"tar member {name!r} is {size} bytes, over max_member_bytes="
                              f"{self._max}", at)
        return size

    def _data(self, out: list[Event]) -> None:
        name, size, _ = self._member
        data = self._take(size)
        self._take(self._want - size)
        out.append((name, data))
        self._files += 1
        self.given += size
        self._expect(_BLOCK, self._header)

    def _skip(self, out: list[Event]) -> None:
        self._take(self._want)
        self._expect(_BLOCK, self._header)

    def _second_zero_block(self, out: list[Event]) -> None:
        at = self._at
        if self._take(_BLOCK).count(0) != _BLOCK:
            raise self._error("a lone zero block, not an end-of-archive marker, before the "
                              "header", at)
        self.done = True
        self._at += len(self._buf)
        self._buf = bytearray()


class ShardDecoder:
    """A tar shard, plain or gzip-compressed, decoded as its bytes arrive.

    :meth:`push` and :meth:`finish` are cheap (call them on the event loop); :meth:`pump`
    does the work (call it in a thread, never concurrently with the others).

    Args:
        what: The shard's redacted URL or path, for messages.
        max_member_bytes: Largest member accepted.
    """

    def __init__(self, what: str, max_member_bytes: int) -> None:
        self._what = what
        self._max = max_member_bytes
        self._raw: list[bytes] = []
        self._head = b""  # the first bytes, until they tell whether the shard is gzip
        self._gzip: Inflater | None = None
        self._tar: _TarParser | None = None
        self._finished = False
        self.error: SourceError | None = None

    @property
    def complete(self) -> bool:
        """Whether the shard needs no more bytes: a plain tar read to its end marker.

        A gzip shard is read to its end all the same, so that its checksum is verified.
        """
        return self._tar is not None and self._tar.done and self._gzip is None

    def push(self, raw: bytes) -> None:
        """Queue the next bytes of the shard."""
        self._raw.append(raw)

    def finish(self) -> None:
        """Mark the end of the shard's bytes: the next :meth:`pump` checks how it ended."""
        self._finished = True

    def pump(self) -> tuple[list[Event], bool]:
        """Decode what has been pushed.

        Returns:
            The events ready, and whether to call again before pushing more (a gzip shard
            inflates to more than one call returns). After a failure, :attr:`error` holds
            it and the events are those complete before it.
        """
        out: list[Event] = []
        if self.error is not None:
            return out, False
        try:
            return out, self._pump(out)
        except SourceError as exc:
            self.error = exc
            return out, False

    def _pump(self, out: list[Event]) -> bool:
        tar = self._tar or self._start()
        if tar is None:
            return False
        raw, self._raw = b"".join(self._raw), []
        tar.given = 0
        if self._gzip is None:
            tar.push(raw)
        elif raw:
            self._gzip.push(raw)
        while True:
            if tar.run(out, _BUDGET):
                return True
            data = self._gzip.pull(_STEP) if self._gzip is not None else b""
            if not data:
                break
            tar.push(data)
        if self._finished:
            if self._gzip is not None and self._gzip.cut:
                raise SourceError(f"{self._what}: gzip stream ends early at compressed byte "
                                  f"{self._gzip.raw} (truncated shard)")
            tar.close()
        return False

    def _start(self) -> _TarParser | None:
        """The parser, once the first two bytes (or the end) tell whether this is gzip."""
        self._head += b"".join(self._raw)
        self._raw = []
        if len(self._head) < 2 and not self._finished:
            return None
        unit = ""
        if self._head[:2] == b"\x1f\x8b":
            self._gzip = Inflater(self._what)
            unit = " of the inflated tar"
        self._tar = _TarParser(self._what, self._max, unit)
        self._raw, self._head = [self._head], b""
        return self._tar
