"""Request smuggling against the proxy process, over real sockets.

The proxy runs as `python -m flexinfer_proxy` does (`static_proxy`: its flags,
server and event loop) in front of a scripted raw backend that records every request
it is sent. Each case of the corpus is sent on its own connection followed by an honest
probe request; a case the proxy refuses must get a 400 and the close, with nothing
(the case or the probe) reaching the backend; a case it accepts must reach the
backend as exactly the requests it is, with the bodies the proxy framed, then the
probe. The shapes: issue 22's (Content-Length with Transfer-Encoding in either
order, two or listed lengths, `+4`, space before the colon, obs-fold, bare LF, NUL,
`gzip`/`xchunked` codings, chunk-size overflow) and the classic CL.TE, TE.CL and
TE.TE variants.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import attrs

from .harness import StaticProxy, async_test
from .test_hostile import closed_by_peer, connection, read_answer
from .test_http_paths import Scripted, json_answer, scripted

BODY = b'{"model": "m", "n": 1}'
PROBE_BODY = b'{"model": "m", "probe": true}'
PROBE = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Length: %d\r\n\r\n%s" % (
    len(PROBE_BODY),
    PROBE_BODY,
)
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: proxy\r\n\r\n"


def post(
    *fields: bytes, body: bytes = b"", newline: bytes = b"\r\n", version: bytes = b"1.1"
) -> bytes:
    """A POST to the proxy's chat route with these header lines, as raw bytes."""
    lines = [b"POST /v1/chat/completions HTTP/" + version, b"Host: proxy", *fields]
    return newline.join(lines) + newline + newline + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST = b"0\r\n\r\n"

# Refused: a 400 and the close; nothing reaches the backend.
REFUSED = {
    # CL.TE: a front end that reads the length and a back end that reads the chunks
    "cl-te": post(
        b"Content-Length: %d" % len(LAST + SMUGGLED),
        b"Transfer-Encoding: chunked",
        body=LAST + SMUGGLED,
    ),
    # TE.CL: the other way round
    "te-cl": post(
        b"Transfer-Encoding: chunked",
        b"Content-Length: 4",
        body=chunk(SMUGGLED) + LAST,
    ),
    # TE.TE: one Transfer-Encoding each end may read differently
    "te-te-two-fields": post(
        b"Transfer-Encoding: chunked", b"Transfer-Encoding: x", body=chunk(BODY) + LAST
    ),
    "te-te-listed": post(b"Transfer-Encoding: chunked, identity", body=chunk(BODY) + LAST),
    "te-te-xchunked": post(b"Transfer-Encoding: xchunked", body=chunk(BODY) + LAST),
    "te-te-gzip": post(b"Transfer-Encoding: gzip", body=chunk(BODY) + LAST),
    "te-te-gzip-chunked": post(b"Transfer-Encoding: gzip, chunked", body=chunk(BODY) + LAST),
    "te-te-space-before-colon": post(
        b"Transfer-Encoding : chunked", b"Content-Length: %d" % len(BODY), body=BODY
    ),
    "te-te-obs-fold": post(
        b"X-Pad: 1", b" Transfer-Encoding: chunked", b"Content-Length: 5", body=LAST + SMUGGLED
    ),
    "te-te-tab-fold": post(
        b"X-Pad: 1", b"\tTransfer-Encoding: chunked", b"Content-Length: 5", body=LAST + SMUGGLED
    ),
    "te-te-vertical-tab": post(b"Transfer-Encoding:\x0bchunked", body=chunk(BODY) + LAST),
    "te-te-cr-in-name": post(b"Transfer-Encoding\r: chunked", body=chunk(BODY) + LAST),
    "te-in-http-1.0": post(b"Transfer-Encoding: chunked", body=chunk(BODY) + LAST, version=b"1.0"),
    # lengths
    "two-lengths-same": post(
        b"Content-Length: %d" % len(BODY), b"Content-Length: %d" % len(BODY), body=BODY
    ),
    "two-lengths-different": post(
        b"Content-Length: %d" % len(BODY), b"Content-Length: 0", body=BODY + SMUGGLED
    ),
    "listed-length": post(b"Content-Length: %d, %d" % (len(BODY), len(BODY)), body=BODY),
    "plus-length": post(b"Content-Length: +%d" % len(BODY), body=BODY),
    "negative-length": post(b"Content-Length: -1", body=BODY),
    "hex-length": post(b"Content-Length: 0x%x" % len(BODY), body=BODY),
    "spaced-length": post(b"Content-Length: 1 2", body=BODY),
    "overflowing-length": post(b"Content-Length: 184467440737095516160", body=BODY),
    "space-before-colon": post(b"Content-Length : %d" % len(BODY), body=BODY),
    # line endings and bytes
    "bare-lf": post(b"Content-Length: %d" % len(BODY), body=BODY, newline=b"\n"),
    "bare-lf-in-one-line": post(
        b"Transfer-Encoding: chunked\nContent-Length: %d" % len(BODY), body=BODY
    ),
    "bare-cr": post(b"X-Pad: a\rContent-Length: 0", b"Content-Length: %d" % len(BODY), body=BODY),
    "nul-in-value": post(b"X-Pad: a\x00b", b"Content-Length: %d" % len(BODY), body=BODY),
    "no-colon": post(b"X-Pad", b"Content-Length: %d" % len(BODY), body=BODY),
    # chunks
    "chunk-size-overflow": post(
        b"Transfer-Encoding: chunked", body=b"10000000000000000\r\n" + BODY + b"\r\n" + LAST
    ),
    "chunk-size-plus": post(b"Transfer-Encoding: chunked", body=b"+5\r\nhello\r\n" + LAST),
    "chunk-size-0x": post(b"Transfer-Encoding: chunked", body=b"0x5\r\nhello\r\n" + LAST),
    "chunk-size-bare-lf": post(b"Transfer-Encoding: chunked", body=b"5\nhello\r\n" + LAST),
    "chunk-data-too-long": post(b"Transfer-Encoding: chunked", body=b"2\r\nhello\r\n" + LAST),
    # a framing field among the trailers (llhttp reads trailers as header fields)
    "trailer-with-length": post(
        b"Transfer-Encoding: chunked",
        body=chunk(BODY) + b"0\r\nContent-Length: %d\r\n\r\n" % len(SMUGGLED) + SMUGGLED,
    ),
    "chunk-size-space": post(b"Transfer-Encoding: chunked", body=b"5 \r\nhello\r\n" + LAST),
    # request line and Host
    "no-host": b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s"
    % (len(BODY), BODY),
    "two-hosts": post(b"Host: other", b"Content-Length: %d" % len(BODY), body=BODY),
    "extra-word-in-request-line": b"POST /v1/chat/completions HTTP/1.1 x\r\nHost: p\r\n\r\n",
    "http-2-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "upgrade-with-chunks": post(
        b"Connection: Upgrade",
        b"Upgrade: h2c",
        b"Transfer-Encoding: chunked",
        body=chunk(BODY) + LAST,
    ),
}


@attrs.frozen
class Accepted:
    raw: bytes
    bodies: tuple[bytes, ...]  # what the backend must receive, in order (then the probe)
    absent: tuple[bytes, ...] = ()  # header names (lower case) it must not receive


# Accepted: read one way only, the way the backend is then told (its own Content-Length).
ACCEPTED = {
    "chunked": Accepted(post(b"Transfer-Encoding: chunked", body=chunk(BODY) + LAST), (BODY,)),
    "chunked-any-case-and-spaces": Accepted(
        post(b"transfer-encoding:  Chunked ", body=chunk(BODY[:5]) + chunk(BODY[5:]) + LAST),
        (BODY,),
    ),
    "chunk-extensions-and-trailers": Accepted(
        post(
            b"Transfer-Encoding: chunked",
            body=b"%x;ext=1\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n" % (len(BODY), BODY),
        ),
        (BODY,),
    ),
    "length-with-spaces": Accepted(post(b"Content-Length:  %d " % len(BODY), body=BODY), (BODY,)),
    "pipelined": Accepted(post(b"Content-Length: %d" % len(BODY), body=BODY) * 2, (BODY, BODY)),
    "underscore-lookalikes": Accepted(
        post(
            b"Transfer_Encoding: chunked",
            b"Content_Length: 0",
            b"X_Forwarded_For: 203.0.113.9",
            b"Content-Length: %d" % len(BODY),
            body=BODY,
        ),
        (BODY,),
        absent=(b"transfer_encoding", b"content_length", b"x_forwarded_for"),
    ),
    "one-empty-line-before": Accepted(
        b"\r\n" + post(b"Content-Length: %d" % len(BODY), body=BODY), (BODY,)
    ),
}


def _answer(index: int, body: bytes) -> bytes:
    return json_answer(b'{"ok": true}')


async def _proxy(backend: Scripted, tmp: Path) -> StaticProxy:
    models = [{"name": "m", "endpoint": backend.endpoint}]
    return await asyncio.to_thread(
        StaticProxy, models, "--client-header-timeout", "5s", log_path=tmp / "proxy.log"
    )


@async_test
async def test_every_smuggling_shape_is_refused_and_nothing_reaches_the_backend(
    tmp_path: Path,
) -> None:
    async with scripted(_answer) as backend:
        proxy = await _proxy(backend, tmp_path)
        try:
            for name, raw in REFUSED.items():
                async with connection(proxy.port) as (reader, writer):
                    writer.write(raw + PROBE)
                    answer = await asyncio.wait_for(read_answer(reader), 20)
                    closed = await closed_by_peer(reader)
                assert answer.status == 400, (name, answer)
                assert answer.error()["code"] in ("invalid_http", "invalid_request"), name
                assert closed, f"{name}: the connection must close after the refusal"
                assert backend.requests == [], f"{name} reached the backend"
        finally:
            await asyncio.to_thread(proxy.stop)


@async_test
async def test_what_is_accepted_reaches_the_backend_framed_one_way(tmp_path: Path) -> None:
    async with scripted(_answer) as backend:
        proxy = await _proxy(backend, tmp_path)
        try:
            for name, case in ACCEPTED.items():
                backend.requests.clear()
                backend.heads.clear()
                expected = [*case.bodies, PROBE_BODY]
                async with connection(proxy.port) as (reader, writer):
                    writer.write(case.raw + PROBE)
                    answers = [await asyncio.wait_for(read_answer(reader), 20) for _ in expected]
                assert [a.status for a in answers] == [200] * len(expected), (name, answers)
                assert [json.loads(body) for body in backend.requests] == [
                    json.loads(body) for body in expected
                ], name
                for head in backend.heads:
                    assert b"transfer-encoding" not in head.lower(), name
                    assert head.lower().count(b"\r\ncontent-length:") == 1, name
                    for absent in case.absent:
                        assert b"\r\n" + absent + b":" not in head.lower(), (name, absent)
        finally:
            await asyncio.to_thread(proxy.stop)
