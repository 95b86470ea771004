"""xsilo_client: make a PyTorch (or numpy) training script a silo of an xsilo federation.

    import xsilo_client as xc

    if xc.is_federated():
        xc.init()
        while (task := xc.receive()) is not None:
            task.load_into(model)
            if task.kind == "evaluate":
                xc.send(metrics=evaluate(model))
                continue
            loss = train(model, task.config)
            xc.send(model.state_dict(), num_samples=len(dataset), metrics={"loss": loss})

The agent starts the script with XSILO_TRAINER_FD set; without it the script is a plain
script. The protocol is docs/trainer-protocol.md (version 1).
"""

import logging

from .channel import ProtocolError
from .client import PROTOCOL, SDK_VERSION, Client, Task, save_initial

__version__ = SDK_VERSION
__all__ = ["Client", "ProtocolError", "Task", "PROTOCOL", "__version__", "init", "is_federated",
           "rank", "receive", "save_initial", "send", "send_error", "silo", "world_size"]

logging.getLogger("xsilo_client").addHandler(logging.NullHandler())

_client = None


def _default():
    global _client
    if _client is None:
        _client = Client()
    return _client


def is_federated():
    """True when this process runs under an xsilo agent (XSILO_TRAINER_FD is set)."""
    return _default().is_federated()


def init():
    """Handshake with the agent (hello, then welcome). Idempotent; receive() calls it too.

    Raises ProtocolError when the agent speaks another protocol version or refuses the
    trainer, ConnectionError when the channel is gone, RuntimeError when not federated.
    """
    _default().init()


def receive():
    """The next Task (kind "train" or "evaluate"), or None when the agent asks to shut down.

    Raises ConnectionError when the agent closes the channel without a shutdown task, and
    RuntimeError when the previous task has not been answered by send() or send_error().
    """
    return _default().receive()


def send(state_dict=None, num_samples=None, metrics=None):
    """Answers the current task with its result.

    For a train task on rank 0: ``state_dict`` (or the module) is required; its floating-point
    tensors (F32/F16/BF16 in their own dtype, float64 narrowed to float32) are written to the
    exchange folder and named in the result; integer and bool tensors stay local (their names
    are logged once). ``num_samples`` (the silo's training rows, > 0) is required there.
    Other ranks, and evaluate tasks, send no weights. ``metrics``: name -> finite number
    (numpy and torch scalars accepted).
    """
    _default().send(state_dict, num_samples=num_samples, metrics=metrics)


def send_error(message):
    """Reports that the current task failed; the silo drops out of that round."""
    _default().send_error(message)


def rank():
    """This copy's rank among the silo's local workers (RANK, default 0)."""
    return _default().rank()


def world_size():
    """The number of the silo's local workers (WORLD_SIZE, default 1)."""
    return _default().world_size()


def silo():
    """The silo's name (from the agent's welcome, else XSILO_SILO), or None outside a federation."""
    return _default().silo()
