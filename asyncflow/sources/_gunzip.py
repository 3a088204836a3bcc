"""Sans-I/O gzip inflation for tar shards: compressed bytes in, inflated bytes out, a bounded
amount per call (a gzip bomb cannot take more memory than one call's limit).

A shard may be one gzip member or several joined with ``cat``, and may end in zero padding, as
some writers leave; a stream that ends inside a member is an error naming the shard.
"""

from __future__ import annotations

import zlib

from .._errors import SourceError

__all__ = ["Gunzip"]


class Gunzip:
    """Inflates gzip members one after another (``gzip`` output, or several ``cat``-joined)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._inflater = zlib.decompressobj(wbits=31)
        self._tail = b""
        self._fed = False  # whether the current gzip member has had any input yet
        self._full = False  # whether the last call stopped at the output limit
        self.raw = 0  # compressed bytes received

    def push(self, data: bytes) -> None:
        self._tail = self._tail + data if self._tail else data
        self.raw += len(data)

    def pull(self, limit: int) -> bytes:
        """Up to ``limit`` inflated bytes; ``b""`` when more input is needed."""
        while self._tail or self._full:
            if not self._fed and not self._tail.strip(b"\x00"):
                self._tail = b""  # zero padding after the last member, as some writers leave
                return b""
            self._fed = True
            try:
                out = self._inflater.decompress(self._tail, limit)
            except zlib.error as exc:
                raise SourceError(
                    f"{self._what}: corrupt gzip data near compressed byte "
                    f"{self.raw - len(self._tail)} ({exc})"
                ) from None
            self._full = len(out) == limit
            if self._inflater.eof:
                self._tail = self._inflater.unused_data
                self._inflater, self._fed, self._full = zlib.decompressobj(wbits=31), False, False
            else:
                self._tail = self._inflater.unconsumed_tail
            if out:
                return out
        return b""

    def close(self) -> None:
        if self._fed:
            raise SourceError(
                f"{self._what}: gzip stream ends early at compressed byte {self.raw} "
                "(truncated shard)"
            )
