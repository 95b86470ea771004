"""Test helpers: an agent stand-in on a socket pair, temporary folders, skips that say why."""

import json
import os
import socket
import sys
import tempfile
import unittest

from . import PYTHON_DIR

REPO_DIR = os.path.dirname(PYTHON_DIR)


def skip(reason):
    """Skips the running test and prints why (visible without -v)."""
    print(f"\nSKIPPED: {reason}", file=sys.stderr)
    raise unittest.SkipTest(reason)


def torch_or_skip():
    try:
        import torch
    except ImportError:
        skip("torch is not installed (apt install python3-torch), so the PyTorch tests do not run")
    return torch


def safetensors_or_skip():
    try:
        import safetensors.numpy
    except ImportError:
        skip("the safetensors package is not installed (not packaged by Debian: "
             "pip install safetensors in a venv), so interoperability with it is not tested")
    return safetensors


class FakeAgent:
    """The agent's end of the channel, written straight from the protocol document."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(30)

    def send(self, message):
        self.send_raw(json.dumps(message).encode())

    def send_raw(self, payload):
        self.sock.sendall(len(payload).to_bytes(4, "big") + payload)

    def receive(self):
        head = self._read(4)
        if head is None:
            return None
        return json.loads(self._read(int.from_bytes(head, "big")))

    def _read(self, n):
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                if not data:
                    return None
                raise AssertionError("channel closed mid-message")
            data += chunk
        return data

    def close(self):
        self.sock.close()


class AgentTestCase(unittest.TestCase):
    """A socket pair and an exchange folder per test; the trainer's end as XSILO_TRAINER_FD."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.exchange = os.path.join(self.tmp.name, "exchange")
        os.mkdir(self.exchange, 0o700)
        agent_end, trainer_end = socket.socketpair()
        self.agent = FakeAgent(agent_end)
        self.addCleanup(self.agent.close)
        self.trainer_sock = trainer_end
        self.addCleanup(trainer_end.close)

    def welcome(self, **overrides):
        message = {"type": "welcome", "protocol": 1, "agent": "0.1.0", "silo": "hospital-01",
                   "exchange_dir": self.exchange}
        message.update(overrides)
        self.agent.send(message)

    def path(self, name):
        return os.path.join(self.tmp.name, name)
