"""The trainer's side of the external trainer protocol (docs/trainer-protocol.md, version 1).

One Client per process talks to the agent over the socket it inherited: hello/welcome once,
then one task at a time, each answered by exactly one result or error.
"""

import logging
import math
import os
import sys

import numpy as np

from . import privacy, safetensors, state
from .channel import Channel, ProtocolError
from .federate import name_filter
from .privacy import BATCH_NORM_UNDER_DP, batch_norm_layers

PROTOCOL = 1
SDK_VERSION = "0.2.0"
TASK_KINDS = ("train", "evaluate", "init", "shutdown")

log = logging.getLogger("xsilo_client")


def _env_int(env, key, default):
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {key}={raw!r} is not an integer") from None


def _is_int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def finite_number(value, what):
    """value as a finite int or float (numpy and torch scalars accepted), else ValueError."""
    if hasattr(value, "item") and callable(value.item):  # numpy scalar or array, torch tensor
        size = value.numel() if callable(getattr(value, "numel", None)) else getattr(value, "size", 1)
        if size != 1:
            raise ValueError(f"{what} must be one number, got {type(value).__name__} of {size} elements")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} is {value}; metrics must be finite")
    return value


def check_metrics(metrics, non_finite=None):
    """metrics as a dict of str -> finite int/float, or ValueError naming the bad entry.

    With ``non_finite`` (a dict), a NaN or infinite value is not an error: it is left out of
    the result and put there (name -> value) instead. A value that is not a number at all
    (a string, an array) is always an error: that is the script's bug, not its training's."""
    if metrics is None:
        return {}
    if not hasattr(metrics, "items"):
        raise ValueError(f"metrics must be a dict of name -> number, got {type(metrics).__name__}")
    out = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"metric name {name!r} must be a non-empty string")
        try:
            out[name] = finite_number(value, f"metric {name!r}")
        except ValueError:
            number = _non_finite(value)
            if non_finite is None or number is None:
                raise
            non_finite[name] = number
    return out


def _non_finite(value):
    """value as a float when it is one NaN or infinite number (numpy and torch scalars too), else None."""
    try:
        if hasattr(value, "item") and callable(value.item):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            return value
    except (TypeError, ValueError, RuntimeError):
        pass
    return None


class FeatureStats:
    """The federation's feature statistics (docs/bring-your-own-model.md, "Feature statistics"):
    the mean and variance of every feature over all silos' training rows, computed before the
    first round without any silo's own statistics leaving it. ``mean``, ``var`` and ``std`` are
    float64 numpy arrays (one value per feature); ``count`` is the number of rows."""

    def __init__(self, message):
        try:
            self.mean = np.asarray(message["mean"], dtype=np.float64)
            self.var = np.asarray(message["var"], dtype=np.float64)
            self.count = int(message.get("count", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"the agent sent feature_stats that are not mean/var lists: {e}") from None
        if self.mean.shape != self.var.shape or self.mean.ndim != 1:
            raise ProtocolError("the agent sent feature_stats whose mean and var differ in length")
        # A constant feature keeps its values centred, not divided by zero.
        self.std = np.sqrt(np.maximum(self.var, 0.0))
        self.std[self.std == 0] = 1.0

    @classmethod
    def of(cls, rows):
        """The statistics of ``rows`` ([rows, features], numpy or torch): a silo's own."""
        if hasattr(rows, "detach"):
            rows = rows.detach().cpu().numpy()
        rows = np.asarray(rows, dtype=np.float64)
        return cls({"mean": rows.mean(0).tolist(), "var": rows.var(0).tolist(), "count": len(rows)})

    def standardize(self, x):
        """(x - mean) / std along the last axis, for numpy arrays and torch tensors alike."""
        if state.torch_or_none() is not None and state.is_torch_tensor(x):
            import torch
            mean = torch.as_tensor(self.mean, dtype=x.dtype, device=x.device)
            std = torch.as_tensor(self.std, dtype=x.dtype, device=x.device)
            return (x - mean) / std
        x = np.asarray(x)
        return ((x - self.mean) / self.std).astype(x.dtype if x.dtype.kind == "f" else np.float32, copy=False)

    def __repr__(self):
        return f"FeatureStats({len(self.mean)} features, {self.count} rows)"


class Task:
    """One task from the agent: "train", "evaluate", or "init" (the agent asks for the model's
    initial weights; xc.epochs, xc.tasks(model) and xc.run answer it themselves)."""

    def __init__(self, message, last_sent, keep=None):
        self.id = message["id"]
        self.kind = message["kind"]
        self.round = message.get("round", 0)
        self.model_path = message.get("model")
        self.config = dict(message.get("config") or {})
        self.config.setdefault("round", self.round)
        stats = message.get("feature_stats")
        self.feature_stats = FeatureStats(stats) if stats is not None else None
        self._last_sent = last_sent  # () -> the state dict last passed to send(), or None
        self._keep = keep            # names the federation does not carry: kept local (federate=)

    @property
    def local_epochs(self):
        """The round's local epochs (the server's training.local_epochs; 1 when not given)."""
        value = self.config.get("local_epochs", 1)
        return int(value) if _is_int(value) and value > 0 else 1

    def __repr__(self):
        return f"Task(kind={self.kind!r}, id={self.id}, round={self.round}, model_path={self.model_path!r})"

    def arrays(self):
        """The global model as numpy arrays by name (views of a copy-on-write mapping of the file)."""
        return safetensors.load_file(self.model_path, writable=True)

    def state_dict(self, like=None):
        """The global model as a state dict: float32 torch tensors (numpy arrays without torch).

        With ``like`` (a state dict or a module), the result has exactly like's names: tensors
        take like's dtypes and devices, and names the global model lacks (integer buffers such
        as BatchNorm's ``num_batches_tracked``) are filled from ``like``. Without it, names the
        global model lacks are filled from the state dict last passed to ``send()``, if any.
        """
        if self.model_path is None:
            raise RuntimeError(f"a {self.kind} task carries no model")
        arrays = self.arrays()
        result = {}
        for name, array in arrays.items():
            if array.dtype.kind == "f" and array.dtype != np.float32:
                array = array.astype(np.float32)
            result[name] = state.to_preferred(array)
        if like is not None:
            return self._shaped_like(result, state.as_state_dict(like))
        last = self._last_sent()
        if last is not None:
            for name, value in last.items():
                if name not in result:
                    result[name] = state.to_preferred(value)
        return result

    def _shaped_like(self, result, like):
        extra = [name for name in result if name not in like]
        if extra:
            raise ValueError(f"global model {self.model_path}: tensors the local model lacks: "
                             f"{', '.join(extra)}")
        out = {}
        for name, ref in like.items():
            if name not in result:
                if state.is_floating(ref) and not (self._keep is not None and self._keep(name)):
                    log.warning("global model has no tensor %r; keeping the local value", name)
                out[name] = ref
                continue
            value = result[name]
            if state.shape_of(value) != state.shape_of(ref):
                raise ValueError(f"global model {self.model_path}: tensor {name!r} has shape "
                                 f"{list(state.shape_of(value))}, the local model {list(state.shape_of(ref))}")
            out[name] = state.convert_like(value, ref)
        return out

    def load_into(self, model):
        """Loads the global model into a torch module (strict): dtypes and devices are the
        module's own, integer buffers the global model lacks keep their local values."""
        if state.torch_or_none() is None:
            raise RuntimeError("load_into needs torch; use task.arrays() or task.state_dict() without it")
        if self.model_path is None:  # a run by hand (no agent), or an init task: nothing to load
            return model
        if type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
            model = model.module
        loaded = self.state_dict(like=model.state_dict())
        keep_valid_variances(model, loaded)
        model.load_state_dict(loaded, strict=True)
        return model


def keep_valid_variances(module, loaded):
    """Running variances of normalisation layers (BatchNorm, InstanceNorm) that are negative in
    ``loaded`` keep the module's own value in those coordinates.

    A mean of variances is a variance, but a lossy-compressed update (sign, 4-bit, top-k) can
    take a small one below zero, and a negative variance makes the layer's output NaN
    (docs/compression.md). The module's value is this silo's last estimate (or the layer's
    initial 1.0 in a fresh process). Returns the names changed.
    """
    import torch
    changed = []
    for prefix, layer in module.named_modules(remove_duplicate=False):  # a layer shared under two names: both
        if not isinstance(layer, torch.nn.modules.batchnorm._NormBase) or layer.running_var is None:
            continue
        name = f"{prefix}.running_var" if prefix else "running_var"
        value = loaded.get(name)
        if value is None:
            continue
        negative = value < 0
        if bool(negative.any()):
            log.warning("global model: %d of %d values of %s are negative (lossy compression); "
                        "keeping this trainer's own there", int(negative.sum()), value.numel(), name)
            loaded[name] = torch.where(negative, layer.running_var.to(device=value.device, dtype=value.dtype), value)
            changed.append(name)
    return changed


class Client:
    """The protocol state of one trainer process. Use the module functions of xsilo_client."""

    def __init__(self, env=None):
        self._env = os.environ if env is None else env
        self._channel = None
        self._welcome = None
        self._task = None          # the task awaiting its result
        self._shut_down = False
        self._last_sent = None     # the state dict last passed to send()
        self._logged_local = set()  # names already logged as kept local
        self._logged_float64 = set()  # names already logged as narrowed to float32
        self._federate = None       # name -> bool: the tensors this script federates (None: all)
        self._logged = {}           # xc.log(): metrics for the current round's result
        self._notes = {}            # told to the agent once, with the next result (it logs them)
        self._privacy = privacy.Reporter()  # send(privacy=...): DP-SGD steps since the last report
        self._warned_batch_norm = False     # send(privacy=...) of a model with BatchNorm: said once
        self._warned_non_finite = set()  # metric names already warned about being NaN or infinite

    def close(self):
        """Closes the channel (the agent sees the trainer go). Process exit does the same."""
        if self._channel is not None:
            self._channel.close()

    # Environment ---------------------------------------------------------------------------

    def is_federated(self):
        return bool(self._env.get("XSILO_TRAINER_FD"))

    def rank(self):
        return _env_int(self._env, "RANK", 0)

    def world_size(self):
        return _env_int(self._env, "WORLD_SIZE", 1)

    def silo(self):
        if self._welcome is not None:
            return self._welcome["silo"]
        return self._env.get("XSILO_SILO") or None

    def exchange_dir(self):
        if self._welcome is not None:
            return self._welcome["exchange_dir"]
        return self._env.get("XSILO_EXCHANGE_DIR") or None

    def data_paths(self, default=(None, None)):
        """(train, test): the silo's data files as the agent's config names them
        (XSILO_TRAIN_DATA, XSILO_TEST_DATA), each else its entry of ``default``."""
        train, test = default
        return (self._env.get("XSILO_TRAIN_DATA") or train, self._env.get("XSILO_TEST_DATA") or test)

    def set_federate(self, federate):
        """Which tensors this script federates: None (every floating-point tensor), a glob
        pattern or a list of them ("*lora_*"), or a function name -> bool."""
        self._federate = name_filter(federate)

    # Handshake -----------------------------------------------------------------------------

    def init(self):
        """Says hello and waits for the welcome. Idempotent."""
        if self._welcome is not None:
            return
        if not self.is_federated():
            raise RuntimeError("not running under an xsilo agent (XSILO_TRAINER_FD is not set); "
                               "check xsilo_client.is_federated() first")
        raw_fd = self._env["XSILO_TRAINER_FD"]
        try:
            fd = int(raw_fd)
        except ValueError:
            raise ValueError(f"XSILO_TRAINER_FD={raw_fd!r} is not a descriptor number") from None
        rank, world_size = self.rank(), self.world_size()
        if not 0 <= rank < world_size:
            raise ValueError(f"RANK={rank} is not in 0..WORLD_SIZE-1 (WORLD_SIZE={world_size})")
        self._channel = Channel.from_fd(fd)
        self._channel.send({"type": "hello", "protocol": PROTOCOL, "sdk": SDK_VERSION,
                            "rank": rank, "world_size": world_size, "pid": os.getpid()})
        reply = self._channel.receive()
        if reply is None:
            raise ConnectionError("the xsilo agent closed the channel before answering hello")
        kind = reply.get("type")
        if kind == "error":
            raise ProtocolError(f"the xsilo agent refused this trainer (SDK {SDK_VERSION}, protocol "
                                f"{PROTOCOL}): {reply.get('message', '(no message)')}")
        if kind != "welcome":
            raise ProtocolError(f"expected welcome from the xsilo agent, got {kind!r}")
        for key, typ in (("protocol", int), ("silo", str), ("exchange_dir", str)):
            if key not in reply:
                raise ProtocolError(f"the agent's welcome lacks {key!r}")
            if not isinstance(reply[key], typ) or isinstance(reply[key], bool):
                raise ProtocolError(f"the agent's welcome has {key}={reply[key]!r}, not a {typ.__name__}")
        if reply["protocol"] != PROTOCOL:
            raise ProtocolError(f"the xsilo agent speaks trainer protocol {reply['protocol']}, this SDK "
                                f"(xsilo-client {SDK_VERSION}) speaks {PROTOCOL}: install matching versions")
        self._welcome = reply
        log.debug("welcomed by agent %s as silo %s", reply.get("agent"), reply["silo"])

    # Tasks ---------------------------------------------------------------------------------

    def receive(self):
        """The next train or evaluate Task; None once the agent asked to shut down."""
        if self._shut_down:
            return None
        self.init()
        if self._task is not None:
            raise RuntimeError(f"task {self._task.id} ({self._task.kind}) has no answer yet: "
                               "call send() or send_error() before receive()")
        while True:
            message = self._channel.receive()
            if message is None:
                raise ConnectionError("the xsilo agent closed the channel without a shutdown task")
            kind = message.get("type")
            if kind == "error":
                raise ProtocolError(f"the xsilo agent reported: {message.get('message', '(no message)')}")
            if kind != "task":
                raise ProtocolError(f"expected a task from the xsilo agent, got a message of type {kind!r}")
            problem = self._task_problem(message)
            if problem is None:
                break
            if not _is_int(message.get("id")):
                raise ProtocolError(f"the xsilo agent sent a task without an integer id: {problem}")
            # A bad task is answered with an error (the silo drops out of that round); the
            # trainer waits for the next one.
            log.error("task %s refused: %s", message["id"], problem)
            self._channel.send({"type": "error", "id": int(message["id"]), "message": problem})
        if message["kind"] == "shutdown":
            self._shut_down = True
            self._channel.close()
            return None
        keep = (lambda name: not self._federate(name)) if self._federate is not None else None
        self._task = Task(message, lambda: self._last_sent, keep)
        return self._task

    @staticmethod
    def _task_problem(message):
        """Why a task message cannot be run, or None."""
        if not _is_int(message.get("id")):
            return "task id must be an integer"
        kind = message.get("kind")
        if kind not in TASK_KINDS:
            return f"task kind {kind!r} is not one of {', '.join(TASK_KINDS)} (xsilo-client {SDK_VERSION})"
        if kind == "shutdown":
            return None
        if not _is_int(message.get("round")) or message["round"] < 0:
            return f"{kind} task needs a non-negative integer 'round', got {message.get('round')!r}"
        if kind == "init":
            return None
        if not isinstance(message.get("model"), str) or not message["model"]:
            return f"{kind} task needs the global model's path in 'model', got {message.get('model')!r}"
        if message.get("config") is not None and not isinstance(message["config"], dict):
            return f"{kind} task's 'config' must be an object, got {type(message['config']).__name__}"
        return None

    def pending(self):
        """The task awaiting its answer, or None."""
        return self._task

    def log(self, metrics):
        """Metrics for the current round's result (xc.epochs sends them); the last value wins.
        A NaN or infinite value makes the metric missing from the round's result (one warning)."""
        non_finite = {}
        self._logged.update(check_metrics(metrics, non_finite))
        for name in non_finite:
            self._logged.pop(name, None)
        self._warn_non_finite(non_finite)

    def _finite_metrics(self, metrics):
        """The metrics a result carries: NaN and infinite values left out, with one warning a name."""
        non_finite = {}
        metrics = check_metrics(metrics, non_finite)
        self._warn_non_finite(non_finite)
        return metrics

    def _warn_non_finite(self, non_finite):
        # On stderr, which the agent keeps in state_dir/trainer/rank-N.log: the SDK's logger has
        # no handler unless the script configures logging, and this must not go unseen.
        for name, value in non_finite.items():
            if name in self._warned_non_finite:
                continue
            self._warned_non_finite.add(name)
            message = (f"metric {name!r} is {value}: left out of the round's result (metrics must be finite; the "
                       "weights are still sent, and the agent refuses non-finite ones). Said once for this metric.")
            log.debug(message)
            print(f"xsilo_client: warning: {message}", file=sys.stderr, flush=True)

    def take_logged(self):
        logged, self._logged = self._logged, {}
        return logged

    def feature_stats(self, fallback=None):
        """The federation's feature statistics (FeatureStats), from the agent's welcome; without
        them (run by hand, or an agent that has none), those of ``fallback`` (this process's own
        rows: an array or tensor of [rows, features]), else None."""
        if self.is_federated():
            self.init()
            if self._welcome.get("feature_stats") is not None:
                return FeatureStats(self._welcome["feature_stats"])
        if fallback is None:
            return None
        return FeatureStats.of(fallback)

    def start_central(self, task):
        """A task of a run by hand (no agent): send() logs its metrics instead of answering."""
        self._task = task

    def _current(self, what):
        if self._task is None:
            raise RuntimeError(f"{what}() answers a task: call receive() first")
        return self._task

    def send(self, state_dict=None, num_samples=None, metrics=None, federate=None, privacy=None):
        """Answers the current task. See xsilo_client.send."""
        if federate is not None:
            self.set_federate(federate)
        task = self._current("send")
        if getattr(task, "central", False):  # run by hand: nothing to answer
            log.info("central %s: %s", task.kind, self._finite_metrics(metrics))
            self._task = None
            return
        metrics = self._finite_metrics(metrics)
        if num_samples is not None:
            if not _is_int(num_samples) or num_samples <= 0:
                raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
            num_samples = int(num_samples)
        if state_dict is not None:
            state_dict = state.as_state_dict(state_dict)
        rank = self.rank()
        # Before any file is written: a report the SDK cannot make leaves nothing behind.
        report = None
        if privacy is not None and task.kind == "train" and rank == 0:
            report = self._privacy.report(privacy, commit=False)  # committed once the result is sent
            if not self._warned_batch_norm and state_dict is not None:
                layers = batch_norm_layers(state_dict, self._federate)
                if layers:
                    log.warning(BATCH_NORM_UNDER_DP, ", ".join(layers[:5]) +
                                (f" and {len(layers) - 5} more" if len(layers) > 5 else ""))
                self._warned_batch_norm = True
        weights = None
        if task.kind == "init" and rank == 0:
            if state_dict is None:
                raise ValueError("an init task's result on rank 0 needs the model's initial state_dict")
            weights = self._write_update(task, state_dict, "init")
        elif task.kind == "train" and rank == 0:
            if state_dict is None:
                raise ValueError("a train task's result on rank 0 needs the trained state_dict")
            if num_samples is None:
                raise ValueError("a train task's result on rank 0 needs num_samples (the silo's "
                                 "training samples, > 0)")
            weights = self._write_update(task, state_dict)
        elif state_dict is not None and task.kind == "evaluate":
            log.debug("evaluate task %s: weights are not sent", task.id)
        message = {"type": "result", "id": task.id, "rank": rank, "weights": weights,
                   "num_samples": num_samples, "metrics": metrics,
                   "process_group": process_group_size()}
        if report is not None:
            message["privacy"] = report
        if self._notes:
            message["notes"] = self._notes
        self._notes = {}
        try:
            self._channel.send(message)
        except ValueError:
            if weights is not None:
                os.unlink(weights)
            raise
        if report is not None:
            self._privacy.commit()
        if state_dict is not None:
            self._last_sent = state_dict
        self._task = None

    def _write_update(self, task, state_dict, prefix="update"):
        floating, local = state.split_floating(state_dict)
        new_local = [name for name in local if name not in self._logged_local]
        if new_local:
            # A warning, and told to the agent, which logs it where the silo's operator looks.
            log.warning("not federated, kept local (integer/bool tensors): %s", ", ".join(new_local))
            self._logged_local.update(new_local)
            self._notes["kept_local"] = new_local
        if self._federate is not None:
            left_out = [name for name in floating if not self._federate(name)]
            floating = {name: v for name, v in floating.items() if self._federate(name)}
            if not floating:
                raise ValueError(f"federate= matches none of the model's {len(left_out)} floating-point "
                                 f"tensors (e.g. {left_out[:3]})")
        if not floating:
            raise ValueError("the state dict has no floating-point tensors to send")
        wide = [name for name, v in floating.items() if state.dtype_name(v) == "float64"]
        for name in wide:
            floating[name] = state.to_float32(floating[name])
        new_wide = [name for name in wide if name not in self._logged_float64]
        if new_wide:
            log.warning("float64 tensors sent as float32: %s", ", ".join(new_wide))
            self._logged_float64.update(new_wide)
            self._notes["narrowed"] = new_wide
        path = os.path.join(self.exchange_dir(), f"{prefix}-{task.round}-{task.id}.safetensors")
        safetensors.save_file(floating, path, durable=False,  # an exchange file: no fsync
                              metadata={"xsilo_task": str(task.id), "xsilo_round": str(task.round)})
        return path

    def send_error(self, message):
        """Reports that the current task failed (the silo drops out of the round)."""
        task = self._current("send_error")
        self._channel.send({"type": "error", "id": task.id, "message": str(message)})
        self._task = None


def process_group_size():
    """The world size of the torch.distributed process group this process joined, else 0 (the
    agent refuses local.workers > 1 whose copies never joined one: each would train on all
    rows and only rank 0's work would count)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a broken process group is reported as none
        pass
    return 0


def save_initial(model_or_state_dict, path, metadata=None):
    """Writes the initial model file for the server: every floating-point tensor as float32.

    Integer and bool tensors are left out (the federation does not carry them) and named in
    one log line. Returns the names written.
    """
    floating, local = state.split_floating(state.as_state_dict(model_or_state_dict))
    if not floating:
        raise ValueError("the model has no floating-point tensors")
    if local:
        log.info("left out of %s (integer/bool tensors, not federated): %s", path, ", ".join(local))
    safetensors.save_file({name: state.to_float32(v) for name, v in floating.items()}, path,
                          metadata=metadata)
    return list(floating)
