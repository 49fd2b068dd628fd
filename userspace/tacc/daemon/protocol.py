"""taccd control protocol: one JSON object per line over a UNIX stream socket.

Requests: ``{"cmd": "status"}``, ``{"cmd": "start", "output": DIR|null, "options": {...}}``,
``{"cmd": "stop"}``, ``{"cmd": "ping"}``.  Replies: ``{"ok": true, ...}`` or
``{"ok": false, "error": "<one line>"}``.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from tacc.errors import TaccError

DEFAULT_SOCKET = "/run/taccd.sock"
MAX_LINE = 1 << 20


def socket_path(explicit: str | None = None) -> str:
    return explicit or os.environ.get("TACCD_SOCKET") or DEFAULT_SOCKET


class ProtocolError(TaccError):
    pass


def encode(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), default=str) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError:
        raise ProtocolError("request is not JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError("request is not a JSON object")
    return obj


def request(obj: dict[str, Any], path: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Send one request to taccd and return its reply (raises ProtocolError, one line)."""
    p = socket_path(path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(p)
        except FileNotFoundError:
            raise ProtocolError(f"taccd is not running (no socket {p})") from None
        except ConnectionRefusedError:
            raise ProtocolError(f"taccd is not running (stale socket {p})") from None
        except PermissionError:
            raise ProtocolError(f"no permission to talk to taccd ({p})") from None
        s.sendall(encode(obj))
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if len(buf) > MAX_LINE:
                raise ProtocolError("reply too long")
        if not buf:
            raise ProtocolError("taccd closed the connection without a reply")
        return decode(buf)
    except TimeoutError:
        raise ProtocolError(f"taccd did not answer within {timeout:g} s") from None
    finally:
        s.close()
