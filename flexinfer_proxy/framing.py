"""HTTP/1.1 message framing, shared by the proxy's two sides: the client connections
(`http_server`) and the backend connections (`upstream`). llhttp (httptools) parses
both; this module decides what llhttp does not, or must not be trusted alone with:

- where a head ends and how large it is (`HeadMeter`): raw bytes, counted as they
  arrive and before llhttp sees them, up to the blank line that ends the head, found
  even when its CRLF CRLF is split across reads (so body bytes that arrive in the
  same read are never counted as head);
- how a message's body is framed (`request_head`, `answer_head`), by RFC 9112
  6.1–6.3 and refusing, never choosing, what could be read two ways: Content-Length
  with Transfer-Encoding, two Content-Length fields (or a list), a length that is not
  digits, a transfer coding other than exactly `chunked`. llhttp refuses most of
  these first; this is the second lock, so that no header loop of ours takes
  whichever came last;
- where a chunked request body ends (`ChunkedEnd`), so that a pipelined request's
  head that follows it in the same read is measured from its first byte. It only
  finds the end; llhttp alone says whether the chunks are valid, and the server
  refuses a stream on which the two disagree;
- the buffer-and-waiter of a body being received (`BodyBuffer`): bytes as they
  arrive, taken by one reader that waits for more.

RFC 9112 3.2: an HTTP/1.1 request has exactly one Host field; a request with none
(HTTP/1.1) or with several (any version) is refused (`request_head`).

No I/O, no clock, no asyncio beyond the waiter's future; it knows nothing of models.
"""

from __future__ import annotations

import asyncio
import re

# Body framing kinds.
LENGTH = 0  # `length` bytes (0: no body)
CHUNKED = 1
UNTIL_CLOSE = 2  # an answer that gives neither: the backend's close ends it

_DIGITS = re.compile(rb"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
# A chunk-size line (size, extensions) or a trailer line longer than this is refused.
MAX_CHUNK_LINE_BYTES = 8 * 1024
_CRLF2 = b"\r\n\r\n"


class HeadTooLarge(Exception):
    """A head is larger than the limit it is measured against."""


class FramingError(Exception):
    """A message whose framing is unusable or could be read two ways."""


class HeadMeter:
    """The raw size of one head at a time, and where it ends, as its bytes arrive.

    `scan(data, start)` counts `data[start:]` toward the head until its blank line and
    returns the offset just past it, or -1 when the head goes on past `data`; it
    raises `HeadTooLarge` as soon as the head is larger than `limit`. Once a head has
    ended (`measured` is its size) the meter is ready for the next one.
    """

    __slots__ = ("_tail", "limit", "measured", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0  # bytes of the head being measured, so far
        self.measured = 0  # of the last head that ended
        self._tail = b""  # its last (up to) 3 bytes: a CRLF CRLF may straddle reads

    @property
    def started(self) -> bool:
        """Some bytes of a head have arrived, not its end."""
        return self.size > 0

    def scan(self, data: bytes, start: int = 0) -> int:
        end = -1
        tail = self._tail
        if tail:
            # The end of the head split across this read and the last one.
            joined = (tail + data[start : start + 3]).find(_CRLF2)
            if joined >= 0:
                end = start + joined + 4 - len(tail)
        if end < 0:
            found = data.find(_CRLF2, start)
            if found >= 0:
                end = found + 4
        size = self.size + (end if end >= 0 else len(data)) - start
        if size > self.limit:
            raise HeadTooLarge(f"the head is larger than {self.limit} bytes")
        if end < 0:
            self.size = size
            self._tail = (tail + data[start:])[-3:]
        else:
            self.measured = size
            self.size = 0
            if tail:
                self._tail = b""
        return end


class ChunkedEnd:
    """Where a chunked body ends: its chunk-size lines, data, CRLFs and trailer lines
    are walked (not validated) until the blank line after the last chunk."""

    __slots__ = ("_data_left", "_line", "_trailer", "done")

    def __init__(self) -> None:
        self._data_left = 0  # bytes of chunk data, then its CRLF, still to come
        self._line = b""  # a size or trailer line begun in an earlier read
        self._trailer = False  # past the last chunk: trailer lines until a blank one
        self.done = False

    def scan(self, data: bytes, start: int = 0) -> int:
        """The offset just past the body's end in `data`, or -1 when it goes on.
        Raises `FramingError` for a line this walk cannot read (llhttp refuses those)."""
        position = start
        size = len(data)
        while position < size:
            if self._data_left:
                step = min(self._data_left, size - position)
                self._data_left -= step
                position += step
                continue
            newline = data.find(b"\n", position)
            if newline < 0:
                self._line += data[position:]
                if len(self._line) > MAX_CHUNK_LINE_BYTES:
                    raise FramingError("a chunk-size or trailer line is too long")
                return -1
            line = self._line + data[position : newline + 1]
            self._line = b""
            position = newline + 1
            if len(line) > MAX_CHUNK_LINE_BYTES:
                raise FramingError("a chunk-size or trailer line is too long")
            if not line.endswith(b"\r\n"):
                raise FramingError("a chunk line ends without CR LF")
            if self._trailer:
                if line == b"\r\n":
                    self.done = True
                    return position
                continue
            digits = line[:-2].split(b";", 1)[0].rstrip(b" \t")
            if not _HEX.fullmatch(digits):
                raise FramingError(f"chunk size {digits[:20]!r} is not hexadecimal")
            chunk = int(digits, 16)
            if chunk:
                self._data_left = chunk + 2  # its data, then CR LF
            else:
                self._trailer = True
        return -1


# What the server reads from a request's head: its Content-Length (None: chunked),
# whether it expects `100 Continue`, and whether a `Connection` field was sent. A
# tuple: made for every request.
RequestHead = tuple[int | None, bool, bool]


def request_head(headers: list[tuple[bytes, bytes]], *, version: str) -> RequestHead:
    """A request's framing and the facts the server needs (RFC 9112 3.2, 6.1–6.3):
    (Content-Length, None when chunked; `Expect: 100-continue`; a `Connection` field).

    Raises `FramingError` for: no Host (HTTP/1.1) or several; Content-Length with
    Transfer-Encoding; two Content-Length fields or a list in one; a length that is
    not digits; Transfer-Encoding other than one field saying exactly `chunked`, or
    in an HTTP/1.0 request.
    """
    length: bytes | None = None
    coding: bytes | None = None
    hosts = 0
    expects_continue = False
    named = False
    for name, value in headers:
        size = len(name)
        # Sizes first: most fields are none of these, and a length compares fastest.
        if size == 4 and name.lower() == b"host":
            hosts += 1
        elif size == 14 and name.lower() == b"content-length":
            if length is not None:
                raise FramingError("two Content-Length fields")
            length = value
        elif size == 17 and name.lower() == b"transfer-encoding":
            if coding is not None:
                raise FramingError("two Transfer-Encoding fields")
            coding = value
        elif size == 6 and name.lower() == b"expect":
            expects_continue = value.lower() == b"100-continue"
        elif size == 10 and name.lower() == b"connection":
            named = True
    if hosts > 1:
        raise FramingError("several Host fields")
    if not hosts and version != "1.0":
        raise FramingError("no Host field")
    if coding is None and length is None:
        return 0, expects_continue, named
    if coding is not None and version == "1.0" and length is None:
        # RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
        raise FramingError("Transfer-Encoding in an HTTP/1.0 request")
    return _body_length(length, coding), expects_continue, named


# What the pool reads from an answer's head: its framing (LENGTH, CHUNKED or
# UNTIL_CLOSE), its length (for LENGTH), whether a `Connection` field was sent, and
# its `Keep-Alive: timeout=N` in seconds. A tuple: made for every answer.
AnswerHead = tuple[int, int, bool, float | None]


def answer_head(headers: list[tuple[bytes, bytes]], *, status: int) -> AnswerHead:
    """An answer's framing and the facts the pool needs (RFC 9112 6.3): see
    `AnswerHead`.

    1xx, 204 and 304 have no body; otherwise exactly `chunked`, else a length, else
    the close ends it. Raises `FramingError` for what `request_head` refuses, and for
    a transfer coding other than `chunked` (the proxy would relay it decoded wrongly).
    `Keep-Alive: timeout=N` (llama.cpp's server sends it) is how long the backend
    keeps the connection open idle.
    """
    length: bytes | None = None
    coding: bytes | None = None
    named = False
    keep_alive: float | None = None
    for name, value in headers:
        size = len(name)
        if size == 14 and name.lower() == b"content-length":
            if length is not None:
                raise FramingError("two Content-Length fields")
            length = value
        elif size == 17 and name.lower() == b"transfer-encoding":
            if coding is not None:
                raise FramingError("two Transfer-Encoding fields")
            coding = value
        elif size == 10 and name.lower() == b"connection":
            named = True
        elif size == 10 and name.lower() == b"keep-alive":
            keep_alive = _keep_alive_timeout(value)
    if status < 200 or status in (204, 304):
        return LENGTH, 0, named, keep_alive
    if coding is None and length is None:
        return UNTIL_CLOSE, 0, named, keep_alive
    body = _body_length(length, coding)
    if body is None:
        return CHUNKED, 0, named, keep_alive
    return LENGTH, body, named, keep_alive


def _body_length(length: bytes | None, coding: bytes | None) -> int | None:
    """The body's length its framing fields give (one at least), None for chunked;
    refused, never chosen, when they could be read two ways."""
    if coding is not None:
        if length is not None:
            raise FramingError("both Content-Length and Transfer-Encoding")
        if coding.strip(b" \t").lower() != b"chunked":
            raise FramingError(f"Transfer-Encoding {coding[:40]!r} is not 'chunked'")
        return None
    assert length is not None
    digits = length.strip(b" \t")
    if not digits.isdigit():  # ASCII digits only, for bytes
        raise FramingError(f"Content-Length {length[:40]!r} is not a number")
    return int(digits)


def _keep_alive_timeout(value: bytes) -> float | None:
    for part in value.split(b","):
        key, _, number = part.partition(b"=")
        if key.strip().lower() == b"timeout" and _DIGITS.fullmatch(number.strip()):
            return float(int(number.strip()))
    return None


class BodyBuffer:
    """A body as it arrives, taken by one reader that waits for more.

    The receiving side calls `feed`, `finish` or `fail`; the reader `take`s what has
    arrived, or awaits `readany` / `read`. `_taken` is the hook a side uses for its
    backpressure; a side that must act before the first wait overrides `wait`.
    """

    __slots__ = ("_chunks", "_waiter", "complete", "error", "size")

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self.size = 0  # bytes waiting to be taken
        self.complete = False  # the whole body has arrived
        self.error: BaseException | None = None  # why it will not end
        self._waiter: asyncio.Future[None] | None = None

    # -- fed by the receiving side -----------------------------------------------------

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self.size += len(data)
        self.wake()

    def finish(self) -> None:
        self.complete = True
        self.wake()

    def fail(self, error: BaseException) -> None:
        """The body will not end: the reader gets `error` (unless it already ended)."""
        if not self.complete and self.error is None:
            self.error = error
            self.wake()

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- read by the reader ------------------------------------------------------------

    def is_eof(self) -> bool:
        return self.complete and not self._chunks

    def take(self) -> bytes:
        """Everything that has arrived and was not taken yet (no waiting)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self.size = 0
        self._taken()
        return data

    async def readany(self) -> bytes:
        """The next bytes of the body; b"" at its end. Raises the error it failed with."""
        while not self._chunks:
            if self.complete:
                return b""
            if self.error is not None:
                raise self.error
            await self.wait()
        return self.take()

    async def read(self) -> bytes:
        """The whole body (what was not taken yet)."""
        while not self.complete:
            if self.error is not None:
                raise self.error
            await self.wait()
        return self.take()

    async def read_all(self) -> bytes:
        """The rest of the body, taking it as it comes (so backpressure lifts)."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    async def wait(self) -> None:
        """Until something changes (more bytes, the end, a failure)."""
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        await waiter

    def _taken(self) -> None:
        return None
