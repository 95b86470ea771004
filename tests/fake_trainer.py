#!/usr/bin/env python3
"""A stand-in training script for the agent's tests, numpy only.

FAKE_MODE picks its behaviour: "ok" is a well-behaved trainer written with the SDK (one step of
a fixed update per round); "secret" is one that raises an exception quoting a secret string
(FAKE_SECRET) from its training; every other mode misbehaves in one way, speaking the protocol
by hand so that it can say what the SDK never would. FAKE_SILO, when set, limits the
misbehaviour to that silo; FAKE_ROUNDS (e.g. "2") to those rounds. FAKE_PIDS names a file each
process appends its pid to when it starts (how often the agent started it). FAKE_GROUP=joined
stands in for torch.distributed: the SDK reports a process group of WORLD_SIZE. FAKE_DONE names a
folder an "ok" trainer writes SILO-RANK to once its loop has returned (the agent's shutdown).

    fake_trainer.py --init PATH   writes a 30-input logistic model (the breast cancer layout)
"""

import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

# Descriptors this process got from its parent besides 0-2 and its channel, counted before it opens any
# itself (the descriptor listdir uses is closed again by the time readlink asks about it).
INHERITED_FDS = [fd for fd in os.listdir("/proc/self/fd")
                 if int(fd) > 2 and fd != os.environ.get("XSILO_TRAINER_FD")
                 and os.path.exists(f"/proc/self/fd/{fd}")]

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import xsilo_client as xc  # noqa: E402
from xsilo_client import safetensors  # noqa: E402

MODE = os.environ.get("FAKE_MODE", "ok")
if os.environ.get("FAKE_PIDS"):
    with open(os.environ["FAKE_PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\n")
if os.environ.get("FAKE_GROUP") == "joined":  # what the SDK reads of torch.distributed, without torch
    import types
    sys.modules["torch.distributed"] = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True,
        get_world_size=lambda: int(os.environ.get("WORLD_SIZE", "1")))
SILO = os.environ.get("FAKE_SILO", "")
ROUNDS = {int(r) for r in os.environ.get("FAKE_ROUNDS", "").split(",") if r}


def misbehaving(task_round):
    if SILO and os.environ.get("XSILO_SILO") != SILO:
        return False
    return not ROUNDS or task_round in ROUNDS


def trained(arrays, task):
    # A fixed, finite step: every weight moves by learning_rate / 10.
    lr = float(task.get("config", {}).get("learning_rate", 0.1))
    return {k: (v + lr / 10).astype(np.float32) for k, v in arrays.items()}


# --- the SDK, well behaved --------------------------------------------------------------------

def run_ok():
    xc.init()
    while (task := xc.receive()) is not None:
        if task.kind == "evaluate":
            xc.send(metrics={"eval_loss": 0.5, "eval_accuracy": 0.75, "eval_samples": 4})
            continue
        new = trained(task.arrays(), {"config": task.config})
        xc.send(new, num_samples=10 + xc.rank(), metrics={"loss": 0.25, "note": 7})
    # Code after the loop, as a script's final save: FAKE_DONE names a folder it writes a file to.
    if os.environ.get("FAKE_DONE"):
        Path(os.environ["FAKE_DONE"], f"{os.environ.get('XSILO_SILO', 'silo')}-{xc.rank()}").write_text("done\n")


def run_secret():
    """A script that fails the way real ones do: an exception whose text quotes a data row."""
    secret = os.environ.get("FAKE_SECRET", "patient 4711")
    weights = {}

    def train(_, task):
        if misbehaving(task.round):
            print(f"loading row: {secret}", flush=True)
            raise ValueError(f"cannot parse row {secret!r} in /data/{secret}.csv")
        weights.update(trained(task.arrays(), {"config": task.config}))
        return 10, {"loss": 0.25}

    # xc.run sends the model it was given: here a dict the train callback fills in.
    xc.run(weights, train=train, evaluate=lambda _, task: {"eval_accuracy": 0.75, "eval_samples": 4})


# --- by hand ----------------------------------------------------------------------------------

class Raw:
    def __init__(self):
        self.sock = socket.socket(fileno=int(os.environ["XSILO_TRAINER_FD"]))

    def send(self, obj):
        body = json.dumps(obj).encode()
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def receive(self):
        head = self._exact(4)
        if head is None:
            return None
        return json.loads(self._exact(struct.unpack(">I", head)[0]))

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                return None
            out += chunk
        return out


def run_raw():
    if MODE == "silent" and misbehaving(1):
        time.sleep(3600)
    rank = int(os.environ.get("RANK", "0"))
    ch = Raw()
    ch.send({"type": "hello", "protocol": 2 if MODE == "version" else 1, "sdk": "9.9", "rank": rank,
             "world_size": int(os.environ.get("WORLD_SIZE", "1")), "pid": os.getpid()})
    welcome = ch.receive()
    if welcome is None or welcome.get("type") != "welcome":
        sys.exit(4)
    exchange = Path(welcome["exchange_dir"])
    while (task := ch.receive()) is not None:
        if task["kind"] == "shutdown":
            return
        if task["kind"] == "evaluate":
            ch.send({"type": "result", "id": task["id"], "rank": rank, "weights": None,
                     "metrics": {"accuracy": 0.5, "loss": 1.0, "num_samples": 3}})
            continue
        arrays = safetensors.load_file(task["model"])
        new = trained(arrays, task)
        bad = misbehaving(task["round"])
        if bad and MODE == "exit" and (rank == int(os.environ.get("FAKE_RANK", "0"))):
            sys.exit(3)
        if bad and MODE == "hang":
            time.sleep(3600)
        if bad and MODE == "error":
            ch.send({"type": "error", "id": task["id"], "message": "CUDA out of memory (simulated)"})
            continue
        if bad and MODE == "names":
            name = next(iter(new))
            new["renamed." + name] = new.pop(name)
        if bad and MODE == "shape":
            name = next(iter(new))
            new[name] = np.zeros((3, 3), np.float32)
        if bad and MODE == "dtype":
            name = next(iter(new))
            new[name] = new[name].astype(np.int32)
        if bad and MODE == "nan":
            name = next(iter(new))
            new[name][...] = np.nan
        if bad and MODE == "bigger":
            new["extra.weight"] = np.ones((1000,), np.float32)
        path = None
        loss = 0.25
        if bad and MODE == "fds":  # the descriptors it inherited besides its channel
            loss = float(len(INHERITED_FDS))
        if rank == 0:
            path = exchange / f"update-{task['round']}-{task['id']}.safetensors"
            if bad and MODE == "fifo":
                os.mkfifo(path)
            elif bad and MODE == "outside":
                path = Path(os.environ.get("TMPDIR", "/tmp")) / f"outside-{os.getpid()}.safetensors"
                safetensors.save_file(new, path)
            else:
                safetensors.save_file(new, path)
        ch.send({"type": "result", "id": task["id"], "rank": rank, "weights": str(path) if path else None,
                 "num_samples": 0 if (bad and MODE == "zero") else 10, "metrics": {"loss": loss}})


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--init":
        rng = np.random.default_rng(1)
        safetensors.save_file({"layers.0.weight": (rng.standard_normal((1, 30)) * 0.1).astype(np.float32),
                               "layers.0.bias": np.zeros((1,), np.float32)}, sys.argv[2])
        return
    if MODE == "ok":
        run_ok()
    elif MODE == "secret":
        run_secret()
    else:
        run_raw()


if __name__ == "__main__":
    main()
