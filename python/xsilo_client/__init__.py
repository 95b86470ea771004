"""xsilo_client: make a PyTorch (or numpy) training script a silo of an xsilo federation.

    import xsilo_client as xc

    train_set = load(xc.data_paths(default=(args.train, args.test))[0])
    for task in xc.tasks(model):                  # global weights loaded into `model` for you
        for epoch in range(task.local_epochs):
            loss = train_one_epoch(model, train_set)
        xc.send(model, num_samples=len(train_set), metrics={"loss": loss})

or, with callbacks: ``xc.run(model, train=fit, evaluate=None)``. The agent starts the script
with XSILO_TRAINER_FD set; without it the same loop trains centrally (one task of ``epochs``
local epochs). The protocol is docs/trainer-protocol.md (version 1).
"""

import logging

from . import loop as _loop
from .channel import ProtocolError
from .client import PROTOCOL, SDK_VERSION, Client, FeatureStats, Task, save_initial

__version__ = SDK_VERSION
__all__ = ["Client", "FeatureStats", "ProtocolError", "Task", "PROTOCOL", "__version__", "data_paths", "epochs",
           "feature_stats", "init", "is_federated", "log", "rank", "receive", "run", "save_initial", "send",
           "send_error", "silo", "task", "tasks", "world_size"]

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


def tasks(model=None, evaluate=False, federate=None, epochs=1):
    """The agent's tasks, for a loop: ``for task in xc.tasks(model): ...; xc.send(model, ...)``.

    With ``model`` (a torch module) the round's global weights are loaded into it before each
    task is yielded, and the agent's request for initial weights is answered with its own (so
    no separate --init mode is needed). Evaluate tasks are yielded only with ``evaluate=True``;
    otherwise they are answered with no metrics and a warning. ``federate``: which tensors to
    federate (a glob, a list of globs or a function of the name; the rest stay local).
    ``task.local_epochs``, ``task.config`` and ``task.feature_stats`` say what to do. Without an
    agent (run by hand) it yields one train task of ``epochs`` local epochs (then one evaluate
    task with ``evaluate=True``), and send() only logs.
    """
    return _loop.tasks(_default(), model, evaluate=evaluate, federate=federate, epochs=epochs)


def epochs(model, num_samples, epochs=1, evaluate=None, federate=None, privacy=None):
    """The epochs of every round, for the epoch loop a script already has:

        for epoch in xc.epochs(model, num_samples=len(train_set), epochs=args.epochs):
            ...  # one epoch of training, as before; xc.log(loss=loss) if you like

    Each round's global weights are loaded into ``model`` before its first epoch, the round's
    ``local_epochs`` are yielded, and after its last epoch the model is sent (with what
    xc.log() recorded). ``evaluate``: a function () -> metrics, for federations that ask for
    evaluation. Run by hand it yields range(epochs). ``federate`` as in tasks().
    ``privacy``: the DP-SGD the round ran, sent with each round's weights as send()'s
    ``privacy`` (required by a silo with a privacy budget, docs/privacy.md): Opacus's
    ``PrivacyEngine`` (its steps since the last round are reported), a dict, or a function
    () -> either of them, called after the round's last epoch.
    """
    return _loop.epochs(_default(), model, num_samples, epochs=epochs, evaluate=evaluate, federate=federate,
                        privacy=privacy)


def task():
    """The task being answered now, else None. Under ``xc.epochs`` it is the round's train task:
    ``xc.task().round`` (set a learning-rate schedule from it: a restarted trainer's own
    counters start over), ``.config`` (the server's ``training`` block), ``.local_epochs``.
    Run by hand, the one central task (round 1)."""
    return _default().pending()


def log(**metrics):
    """Records metrics (loss=..., any name -> number) for the current round's result. A NaN or
    infinite value leaves that metric out of the result (one warning on stderr), not the script."""
    _default().log(metrics)


def feature_stats(fallback=None):
    """The federation's feature statistics (mean, var, std, standardize()), computed before the
    first round; without them (run by hand), those of ``fallback`` (your own rows), else None."""
    return _default().feature_stats(fallback)


def run(model, train, evaluate=None, federate=None, epochs=1, privacy=None):
    """Answers the agent's tasks with callbacks until the federation ends.

    ``train(model, task)`` trains ``model`` (already holding the global weights) for
    ``task.local_epochs`` and returns ``num_samples`` or ``(num_samples, metrics)``; its
    weights are sent. ``evaluate(model, task)``, when given, returns metrics
    (``eval_loss``, ``eval_accuracy``, ``eval_samples``). ``federate`` and ``epochs`` as in
    tasks(). ``privacy``: the DP-SGD each round ran, as in epochs(); a function of it is
    called as ``privacy(model, task)`` after ``train``. Run by hand, it trains once for
    ``epochs`` local epochs.
    """
    _loop.run(_default(), model, train, evaluate=evaluate, federate=federate, epochs=epochs, privacy=privacy)


def data_paths(default=(None, None)):
    """(train, test): the silo's data files as the agent's config names them (``data.train``,
    ``data.test``; the sim sets them to each silo's split), else ``default``'s entries."""
    return _default().data_paths(default)


def send(state_dict=None, num_samples=None, metrics=None, federate=None, privacy=None):
    """Answers the current task with its result.

    For a train task on rank 0: ``state_dict`` (or the module) is required; its floating-point
    tensors (F32/F16/BF16 in their own dtype, float64 narrowed to float32) are written to the
    exchange folder and named in the result; integer and bool tensors stay local (their names
    are logged once). ``num_samples`` (the silo's training rows, > 0) is required there.
    Other ranks, and evaluate tasks, send no weights. ``metrics``: name -> number
    (numpy and torch scalars accepted; a NaN or infinite one is left out, with one warning on
    stderr, and the rest of the result still goes). ``federate``: only the matching floating-point tensors
    are sent (a glob, a list of globs or a function of the name); the rest stay local.
    ``privacy``: the DP-SGD this round ran, for a silo with a privacy budget (docs/privacy.md):
    Opacus's ``PrivacyEngine`` (its accountant's steps since the last send are reported), or a
    dict ``{"sample_rate": q, "noise_multiplier": sigma, "steps": n, "clip_norm": c}``. The
    agent accounts the epsilon itself and keeps the update when it would pass the budget.
    """
    _default().send(state_dict, num_samples=num_samples, metrics=metrics, federate=federate, privacy=privacy)


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
