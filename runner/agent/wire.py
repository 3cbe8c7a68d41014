"""The agent session's wire (plancompiler/sshsession.py writes it, runner.agent.dispatch reads it): one JSON request
per line; a large one (a push's bundle of job files) as one zlib-compressed frame instead, `z LENGTH` on a line of
its own and then LENGTH bytes, zlib of the request's JSON. A frame cut short (the workstation killed while sending)
is never answered: the session ends without acting on any of it, as it does on a line cut short."""

from __future__ import annotations

import json
import zlib

from runner.files import loads

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

COMPRESS_FROM = 1 << 14  # bytes of JSON: a smaller request goes as a plain line
MAX_REQUEST = 1 << 30  # bytes of a request's JSON once inflated: past it, refused (never read into memory whole)
FRAME = b"z "


class WireError(ValueError):
    """A request the session cannot read: answered with an error, then the session ends (its framing is lost)."""


def encode(request: dict[str, Any]) -> bytes:
    """REQUEST as the session reads it: a JSON line, or a compressed frame when the JSON is large."""
    data = json.dumps(request).encode()  # ASCII: no newline inside
    if len(data) < COMPRESS_FROM:
        return data + b"\n"
    blob = zlib.compress(data, 6)
    return FRAME + str(len(blob)).encode() + b"\n" + blob


def read(stream: IO[bytes]) -> Any:
    """The next request on STREAM (binary); None at its end, or where it ends inside a request (cut short)."""
    while True:
        line = stream.readline()
        if not line or not line.endswith(b"\n"):
            return None
        if line.strip():
            break
    if not line.startswith(FRAME):
        return loads(line)
    try:
        length = int(line[len(FRAME) :].strip())
    except ValueError:
        raise WireError(f"a bad frame header: {line[:40]!r}") from None
    if not 0 < length <= MAX_REQUEST:
        raise WireError(f"a frame of {length} bytes (at most {MAX_REQUEST})")
    blob = stream.read(length)
    if len(blob) < length:
        return None
    inflate = zlib.decompressobj()
    try:
        data = inflate.decompress(blob, MAX_REQUEST)
    except zlib.error as exc:
        raise WireError(f"a frame that does not inflate: {exc}") from None
    if inflate.unconsumed_tail or not inflate.eof:
        raise WireError(f"a frame that inflates past {MAX_REQUEST} bytes, or ends inside its stream")
    return loads(data)
