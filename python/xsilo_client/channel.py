"""The trainer's end of the agent channel: length-prefixed JSON frames on a stream socket.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON holding one
object. Frames longer than 1 MiB are a protocol error in both directions.
"""

import json
import socket

MAX_FRAME_BYTES = 1 << 20


class ProtocolError(Exception):
    """The agent sent something this SDK cannot accept, or refused this trainer."""


def _reject_constant(name):
    raise ValueError(f"{name} is not valid JSON")


class Channel:
    """One socket to the agent. Not thread-safe: one thread talks to the agent."""

    def __init__(self, sock):
        self._sock = sock

    @classmethod
    def from_fd(cls, fd):
        """Takes ownership of the inherited descriptor ``fd`` (a Unix stream socket)."""
        try:
            sock = socket.socket(fileno=fd)
        except OSError as e:
            raise ConnectionError(f"XSILO_TRAINER_FD={fd} is not an open socket: {e.strerror or e}") from None
        if sock.type != socket.SOCK_STREAM:
            sock.detach()
            raise ConnectionError(f"XSILO_TRAINER_FD={fd} is not a stream socket")
        # Keep the agent's channel out of programs this script starts (exec'd children).
        sock.set_inheritable(False)
        return cls(sock)

    def close(self):
        self._sock.close()

    def send(self, message):
        """Sends one message (a dict). ValueError when it cannot be encoded or is too long."""
        try:
            payload = json.dumps(message, allow_nan=False, separators=(",", ":")).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ValueError(f"message cannot be sent as JSON: {e}") from None
        if len(payload) > MAX_FRAME_BYTES:
            raise ValueError(f"message of {len(payload)} bytes exceeds the protocol's limit of "
                             f"{MAX_FRAME_BYTES} bytes")
        try:
            self._sock.sendall(len(payload).to_bytes(4, "big") + payload)
        except OSError as e:
            raise ConnectionError(f"the xsilo agent's channel is closed ({e.strerror or e})") from None

    def receive(self):
        """The next message (a dict), or None when the agent closed the channel between messages."""
        head = self._read_exactly(4, at_boundary=True)
        if head is None:
            return None
        n = int.from_bytes(head, "big")
        if n > MAX_FRAME_BYTES:
            raise ProtocolError(f"the agent sent a frame of {n} bytes; the protocol's limit is "
                                f"{MAX_FRAME_BYTES}")
        payload = self._read_exactly(n, at_boundary=False)
        try:
            message = json.loads(payload.decode("utf-8"), parse_constant=_reject_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise ProtocolError(f"the agent sent a frame that is not UTF-8 JSON: {e}") from None
        if not isinstance(message, dict):
            raise ProtocolError(f"the agent sent a JSON {type(message).__name__}, not an object")
        return message

    def _read_exactly(self, n, at_boundary):
        chunks = []
        left = n
        while left:
            try:
                chunk = self._sock.recv(min(left, 1 << 16))
            except OSError as e:
                raise ConnectionError(f"reading from the xsilo agent failed ({e.strerror or e})") from None
            if not chunk:
                if at_boundary and left == n:
                    return None
                raise ConnectionError(f"the xsilo agent closed the channel in the middle of a message "
                                      f"({n - left} of {n} bytes read)")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

