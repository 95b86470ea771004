"""The two shapes of a federated script: a loop over the agent's tasks (``tasks``) and a
callback form (``run``), the shape Flower's NumPyClient users know.

    for task in xc.tasks(model):                     # the global weights are loaded for you
        for epoch in range(task.local_epochs):
            loss = train_one_epoch(model, train_set)
        xc.send(model, num_samples=len(train_set), metrics={"loss": loss})

Both answer the agent's "init" task (the server's initial model, asked through the protocol)
with the model's own weights, and answer evaluate tasks that the script did not ask for with no
metrics (a warning says how to add them). Run by hand (no agent), the same loop trains centrally:
one train task of ``epochs`` local epochs, then, with ``evaluate``, one evaluate task.
"""

import logging

from .client import Task

log = logging.getLogger("xsilo_client")


class _CentralTask(Task):
    """A task made up when no agent runs the script: it trains (or evaluates) once."""

    central = True

    def __init__(self, kind, epochs):
        super().__init__({"id": 0, "kind": kind, "round": 1, "model": None,
                          "config": {"local_epochs": epochs}}, lambda: None)


def tasks(client, model=None, evaluate=False, federate=None, epochs=1):
    """The agent's train tasks (and evaluate tasks with ``evaluate=True``), each to be answered
    with xc.send(); None-terminated by the agent's shutdown. See xsilo_client.tasks."""
    if federate is not None:
        client.set_federate(federate)
    if not client.is_federated():
        yield from _central(client, evaluate, epochs)
        return
    warned = False
    while (task := client.receive()) is not None:
        if task.kind == "init":
            if model is None:
                client.send_error("the agent asked for the initial weights, but the script gave no model: "
                                  "call xc.tasks(model) / xc.run(model, ...), or give the sim a trainer.init")
                continue
            client.send(model)
            log.info("initial weights sent to the agent")
            continue
        if task.kind == "evaluate" and not evaluate:
            if not warned:
                log.warning("the agent asks for federated evaluation (trainer.evaluate) but this script does not "
                            "evaluate: pass evaluate=True to xc.tasks() and answer task.kind == 'evaluate' with "
                            "xc.send(metrics={'eval_loss': ..., 'eval_accuracy': ..., 'eval_samples': ...}), or "
                            "an evaluate function to xc.run(); answered with no metrics")
                warned = True
            client.send(metrics={})
            continue
        if model is not None and hasattr(model, "load_state_dict"):  # a torch module
            task.load_into(model)
        yield task
        if client.pending() is task:
            raise RuntimeError(f"the {task.kind} task of round {task.round} has no answer: call xc.send(...) "
                               "(or xc.send_error(...)) in the loop's body")


def _central(client, evaluate, epochs):
    kinds = ["train"] + (["evaluate"] if evaluate else [])
    for kind in kinds:
        task = _CentralTask(kind, epochs)
        client.start_central(task)
        yield task
        if client.pending() is task:
            raise RuntimeError(f"the {kind} task has no answer: call xc.send(...) in the loop's body")


def _train_result(result):
    """(num_samples, metrics) from what a train callback returned."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        return result
    if isinstance(result, dict):
        metrics = dict(result)
        if "num_samples" not in metrics:
            raise ValueError("the train callback returned a dict without 'num_samples'")
        return metrics.pop("num_samples"), metrics
    if isinstance(result, bool) or not isinstance(result, int):
        raise ValueError("the train callback must return num_samples, (num_samples, metrics) or a dict with "
                         f"'num_samples'; it returned {type(result).__name__}")
    return result, {}


def _privacy_source(privacy):
    """``privacy`` as given to epochs()/run(): None, a PrivacyEngine (or accountant), a dict, or a
    function returning one of those each round. A function is told apart by being callable and
    not a report itself (an engine or accountant has a ``history`` or an ``accountant``)."""
    if privacy is None or isinstance(privacy, dict):
        return privacy, False
    if callable(privacy) and not (hasattr(privacy, "accountant") or hasattr(privacy, "history")):
        return privacy, True
    return privacy, False


def epochs(client, model, num_samples, epochs=1, evaluate=None, federate=None, privacy=None):
    """The epochs of every round, for a script's own epoch loop. See xsilo_client.epochs."""
    privacy, per_round = _privacy_source(privacy)
    for task in tasks(client, model, evaluate=evaluate is not None, federate=federate, epochs=epochs):
        if task.kind == "evaluate":
            client.send(metrics=evaluate())
            continue
        client.take_logged()
        yield from range(task.local_epochs)
        report = privacy() if per_round else privacy
        client.send(model, num_samples=num_samples, metrics=client.take_logged(), privacy=report)


def run(client, model, train, evaluate=None, federate=None, epochs=1, privacy=None):
    """Answers the agent's tasks with callbacks until the federation ends. See xsilo_client.run."""
    if not callable(train):
        raise ValueError("xc.run needs train=, a function (model, task) -> num_samples or (num_samples, metrics)")
    if evaluate is not None and not callable(evaluate):
        raise ValueError("evaluate= must be a function (model, task) -> metrics, or None")
    privacy, per_round = _privacy_source(privacy)
    for task in tasks(client, model, evaluate=evaluate is not None, federate=federate, epochs=epochs):
        try:
            if task.kind == "evaluate":
                client.send(metrics=evaluate(model, task))
                continue
            num_samples, metrics = _train_result(train(model, task))
            report = privacy(model, task) if per_round else privacy
        except Exception as e:  # noqa: BLE001 - one failed round, not the end of the process
            if getattr(task, "central", False):
                raise
            # The traceback stays in this script's log (the silo's); the agent refuses the round,
            # keeps this process (its optimizer state, its counters) and tells the server only a
            # reason code.
            log.exception("the %s task of round %s failed", task.kind, task.round)
            client.send_error(f"{type(e).__name__}: {e}")
            continue
        client.send(model, num_samples=num_samples, metrics=metrics, privacy=report)
