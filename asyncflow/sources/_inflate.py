"""Sans-I/O inflation of gzip and deflate data, for tar shards and HTTP bodies alike:
compressed bytes in, inflated bytes out, a bounded amount per call when asked (a gzip bomb
cannot take more memory than one call's limit).

A gzip stream may be one member or several joined with ``cat``, and may end in zero padding,
as some writers leave. A deflate body is zlib-wrapped (RFC 9110), or raw as some servers send
it; nothing may follow its end. Whether the input stopped inside a stream (:attr:`Inflater.cut`)
is for the caller to judge: a shard cut short is damaged, a body cut short is tried again.
"""

from __future__ import annotations

import zlib
from typing import Any

from .._errors import SourceError

__all__ = ["Inflater"]


class Inflater:
    """Inflates a gzip or deflate stream as its bytes arrive.

    Args:
        what: The shard or request, for messages (free of secrets).
        coding: ``"gzip"`` (or ``"x-gzip"``) or ``"deflate"``.
    """

    __slots__ = ("_full", "_gzip", "_inflater", "_tail", "_what", "coding", "cut", "raw")

    def __init__(self, what: object, coding: str = "gzip") -> None:
        self._what = what
        self.coding = coding
        self._gzip = coding.endswith("gzip")
        self._inflater: Any = None  # made at the stream's first byte
        self._tail = b""
        self._full = False  # whether the last call stopped at the output limit
        #: Whether a stream has begun and not reached its end: the input stopped inside it.
        self.cut = False
        self.raw = 0  # compressed bytes received

    def push(self, data: bytes) -> None:
        self._tail = self._tail + data if self._tail else data
        self.raw += len(data)

    def pull(self, limit: int) -> bytes:
        """Up to ``limit`` (> 0) inflated bytes; ``b""`` when more input is needed. Always
        bounded: a few compressed bytes may inflate a thousandfold."""
        while self._tail or self._full:
            if (not self.cut or self._inflater is None) and not self._start():
                return b""
            try:
                out: bytes = self._inflater.decompress(self._tail, limit)
            except zlib.error as exc:
                raise SourceError(f"{self._what}: corrupt {self.coding} data near compressed byte "
                                  f"{self.raw - len(self._tail)} ({exc})") from None
            self._full = len(out) == limit
            if self._inflater.eof:
                self._tail = self._inflater.unused_data
                self.cut = self._full = False
            else:
                self._tail = self._inflater.unconsumed_tail
            if out:
                return out
        return b""

    def _start(self) -> bool:
        """A new stream at the input's head; ``False`` for zero padding after gzip members."""
        data = self._tail
        if self._gzip and not data.strip(b"\x00"):
            self._tail = b""  # zero padding after the last member, as some writers leave
            return False
        if self._gzip:
            wbits = 31
        elif self._inflater is not None:
            raise SourceError(f"{self._what}: data after the end of the {self.coding} stream")
        elif len(data) < 2:
            self.cut = True  # begun: its second byte tells a zlib wrapper from raw deflate
            return False
        else:
            wrapped = data[0] & 0x0F == 8 and int.from_bytes(data[:2]) % 31 == 0
            wbits = 15 if wrapped else -15
        self._inflater = zlib.decompressobj(wbits=wbits)
        self.cut = True
        return True
