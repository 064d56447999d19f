"""Decoding compressed bodies: gzip and deflate, incrementally and in bounded steps.

Compressed bodies are decoded, because the SDKs real clients use (httpx under openai and
anthropic) ask for gzip and deflate too: a gateway that compresses, and may buffer while it does,
is part of what users wait for. Stamps stay on the compressed bytes' arrival. Decoding goes in
steps of DECODE_STEP bytes straight into the SSE parser (whose line length is bounded), and stops
at a bound (see `Inflater`), so a compression bomb costs bounded memory and time.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import aiohttp

from monitor.probe.errors import BodyDecodeError
from monitor.probe.result import ErrorClass

ACCEPT_ENCODING = "gzip, deflate"
DECODE_STEP = 16 * 1024
MAX_DECODED_BYTES = 64 * 1024 * 1024
DECODE_FREE_BYTES = 64 * 1024
MAX_EXPANSION = 100


class Inflater:
    """Incremental gzip/deflate decoding in bounded steps: compressed bytes in, decoded pieces out.

    Bounded twice: in all (MAX_DECODED_BYTES), and in expansion, past a first DECODE_FREE_BYTES
    (at most MAX_EXPANSION decoded bytes per compressed byte consumed). Event streams compress
    about 10 to 1 (a degenerate one repeating one token, under 100 to 1) while a bomb expands about
    1000 to 1: caught after some 80 KiB, before the parser spends a second on it.
    """

    def __init__(self, encoding: str, *, limit: int = MAX_DECODED_BYTES, step: int = DECODE_STEP) -> None:
        self.encoding = encoding
        self._limit = limit
        self._step = step
        self._decoded = 0
        self._consumed = 0  # compressed bytes the decoder has taken
        self._inflate: Any = None  # made on the first bytes: deflate may come with or without its zlib header
        self._first = b""

    def _new(self, first: bytes) -> Any:
        if self.encoding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        # RFC 9110 deflate is zlib-wrapped; some servers send raw deflate, as browsers tolerate.
        wrapped = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
        return zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)

    def _check(self, data: bytes, inflate: Any) -> None:
        consumed = self._consumed + len(data) - len(inflate.unconsumed_tail)
        if self._decoded > self._limit:
            raise BodyDecodeError(
                ErrorClass.MALFORMED_STREAM,
                f"the {self.encoding} body decodes to more than {self._limit // (1024 * 1024)} MiB "
                "(a compression bomb, or a runaway stream); lower max_tokens or fix the server",
            )
        if self._decoded > DECODE_FREE_BYTES + MAX_EXPANSION * consumed:
            raise BodyDecodeError(
                ErrorClass.MALFORMED_STREAM,
                f"the {self.encoding} body expands more than {MAX_EXPANSION} times (a compression bomb); "
                "the server's answer was not decoded further",
            )

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._inflate is None and self.encoding == "deflate" and len(self._first + data) < 2:
            self._first += data  # not enough to tell a zlib header from raw deflate yet
            return
        data, self._first = self._first + data, b""
        try:
            while data:
                if self._inflate is None:
                    self._inflate = self._new(data)
                inflate = self._inflate
                fed = data
                out = inflate.decompress(fed, self._step)
                # Output may be pending inside zlib even once the input is used up: ask until a short step.
                while True:
                    if out:
                        self._decoded += len(out)
                        self._check(fed, inflate)
                        yield out
                    if not inflate.unconsumed_tail and len(out) < self._step:
                        break
                    self._consumed += len(fed) - len(inflate.unconsumed_tail)
                    fed = inflate.unconsumed_tail
                    out = inflate.decompress(fed, self._step)
                self._consumed += len(fed) - len(inflate.unconsumed_tail) - len(inflate.unused_data)
                # gzip allows several members back to back; anything after the end starts the next.
                data = inflate.unused_data if inflate.eof and self.encoding == "gzip" else b""
                if data:
                    self._inflate = None
        except zlib.error as exc:
            raise BodyDecodeError(
                ErrorClass.PROTOCOL,
                f"the body says Content-Encoding: {self.encoding} but does not decode ({exc}); "
                "the server or a proxy garbles compressed responses",
            ) from exc


def inflater_for(resp: aiohttp.ClientResponse) -> Inflater | None:
    """The decoder the response's Content-Encoding needs; None for identity. Raises for one not asked for."""
    sent = resp.headers.get("Content-Encoding", "").strip()
    encoding = sent.lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return Inflater("gzip")
    if encoding == "deflate":
        return Inflater("deflate")
    raise BodyDecodeError(
        ErrorClass.PROTOCOL,
        "the server sent Content-Encoding: {quote}, which was not asked for "
        f"(Accept-Encoding: {ACCEPT_ENCODING}); check headers: in the provider or the proxy in between",
        quote=sent,  # as sent: lowered, a key echoed there would no longer be recognised to redact
    )
