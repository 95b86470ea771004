#!/usr/bin/env python3
"""Train the digits CNN: centrally when run by hand, as one silo when an xsilo agent runs it.

    python3 train.py --epochs 10                 # central: pooled data, prints test accuracy
    python3 train.py --init model.safetensors    # the initial model file (xsilo sim asks the script instead)
    torchrun --nproc_per_node 2 train.py         # central, 2 processes (gloo / NCCL)

Under an agent (XSILO_TRAINER_FD set) the script answers the agent's tasks until shutdown
(xc.tasks: the agent's request for the initial weights included); with `local.workers: N` the
agent starts N copies and they train with DistributedDataParallel.

Data: CSV rows of 64 pixel values then the label, a header line allowed (gzip allowed). Paths
come from the agent (xc.data_paths()), else --train / --test, else the repository's
data/digits.csv.gz split 80/20 with a fixed seed. A training file without a test file is
split the same way.
"""

import argparse
import gzip
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
try:
    import xsilo_client as xc
except ImportError:  # a source tree: the SDK next door in python/
    sys.path.insert(0, str(REPO / "python"))
    import xsilo_client as xc
from model import DigitsCNN  # noqa: E402

DEFAULT_DATA = REPO / "data" / "digits.csv.gz"
FEATURES = 64

log = logging.getLogger("digits")


# Data ----------------------------------------------------------------------------------------

def read_csv(path):
    """(x float32 [rows, 64], y int64 [rows]) from a CSV file, gzip detected by content."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    rows = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values = [float(v) for v in line.split(",")]
        except ValueError:
            if number == 1:
                continue  # a header line
            raise ValueError(f"{path}:{number}: not a row of numbers") from None
        if len(values) != FEATURES + 1:
            raise ValueError(f"{path}:{number}: {len(values)} fields, expected {FEATURES} pixels and a label")
        rows.append(values)
    if not rows:
        raise ValueError(f"{path}: no rows")
    data = np.asarray(rows, dtype=np.float64)
    labels = data[:, FEATURES]
    if np.any(labels != np.round(labels)) or labels.min() < 0 or labels.max() > 9:
        raise ValueError(f"{path}: labels must be integers 0..9")
    return data[:, :FEATURES].astype(np.float32), labels.astype(np.int64)


def split(x, y, test_fraction=0.2, seed=0):
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def input_scale(x):
    """Raw pixel counts (integers 0..16) are divided by 16; scaled or standardized data is kept."""
    if x.size and x.min() >= 0 and 1.5 < x.max() <= 16 and np.array_equal(x, np.round(x)):
        return 1.0 / 16
    return 1.0


def load_data(args):
    train_path, test_path = xc.data_paths(default=(args.train, args.test))
    train = read_csv(train_path or DEFAULT_DATA)
    test = read_csv(test_path) if test_path else None
    if test is None:
        train, test = split(*train)
    scale = input_scale(train[0])
    return [TensorDataset(torch.from_numpy(x * scale), torch.from_numpy(y)) for x, y in (train, test)]


# Training ------------------------------------------------------------------------------------

class Workers:
    """This process's place among the local workers (torchrun-style environment)."""

    def __init__(self):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", str(self.rank)))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world)))
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        use_cuda = gpus >= local_world
        self.device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)
        self.backend = "nccl" if use_cuda else "gloo"
        if self.world > 1:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
            dist.init_process_group(self.backend, rank=self.rank, world_size=self.world)
        if self.rank == 0:
            log.info("worker 0 of %d on %s%s", self.world, self.device,
                     f", DistributedDataParallel over {self.backend}" if self.world > 1 else "")

    def wrap(self, model):
        if self.world == 1:
            return model
        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def sum(self, *values):
        """Sums numbers over the workers (every worker gets the totals)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()


def train_round(model, wrapped, data, config, workers):
    """Trains for config's local_epochs; returns the mean training loss over all workers.

    config keys (the server's `training` block): local_epochs (1), batch_size (32, per worker),
    learning_rate (0.05), momentum (0.9; its buffer starts afresh every round), seed and round
    (the shuffling seed)."""
    epochs = int(config.get("local_epochs", 1))
    sampler = DistributedSampler(data, num_replicas=workers.world, rank=workers.rank, shuffle=True,
                                 seed=int(config.get("seed", 0)) * 100_003 + int(config.get("round", 0)))
    loader = DataLoader(data, batch_size=int(config.get("batch_size", 32)), sampler=sampler)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=float(config.get("learning_rate", 0.05)),
                                momentum=float(config.get("momentum", 0.9)))
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    total, count = 0.0, 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(workers.device), y.to(workers.device)
            optimizer.zero_grad()
            loss = loss_fn(wrapped(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            count += len(y)
    total, count = workers.sum(total, count)
    return total / max(count, 1)


@torch.no_grad()
def evaluate(model, data, workers):
    """eval_loss, eval_accuracy, eval_samples on the test rows, shared out among the workers."""
    model.eval()
    x, y = data.tensors
    x, y = x[workers.rank::workers.world].to(workers.device), y[workers.rank::workers.world].to(workers.device)
    loss, correct = 0.0, 0.0
    if len(y):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct = (logits.argmax(1) == y).sum().item()
    loss, correct, count = workers.sum(loss, correct, len(y))
    count = max(count, 1)
    return {"eval_loss": loss / count, "eval_accuracy": correct / count, "eval_samples": int(count)}


# Modes ---------------------------------------------------------------------------------------

def run_federated(args, workers, train, test):
    model = DigitsCNN().to(workers.device)
    wrapped = workers.wrap(model)
    for task in xc.tasks(model, evaluate=True):  # the global weights loaded into model
        if task.kind == "evaluate":
            metrics = evaluate(model, test, workers)
            xc.send(metrics=metrics)
        else:
            loss = train_round(model, wrapped, train, {"seed": args.seed, **task.config}, workers)
            xc.send(model, num_samples=len(train), metrics={"loss": loss})
            metrics = {"loss": loss}
        if workers.rank == 0:
            log.info("%s round %d %s: %s", xc.silo(), task.round, task.kind,
                     ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))


def run_central(args, workers, train, test):
    model = DigitsCNN().to(workers.device)
    wrapped = workers.wrap(model)
    config = {"local_epochs": 1, "batch_size": args.batch_size, "learning_rate": args.lr, "seed": args.seed}
    for epoch in range(args.epochs):
        loss = train_round(model, wrapped, train, {**config, "round": epoch}, workers)
        metrics = evaluate(model, test, workers)
        if workers.rank == 0:
            print(f"epoch {epoch + 1}: train loss {loss:.4f}, test loss {metrics['eval_loss']:.4f}, "
                  f"test accuracy {metrics['eval_accuracy']:.4f}", flush=True)
    metrics = evaluate(model, test, workers)
    if workers.rank == 0:
        print(f"test accuracy {metrics['eval_accuracy']:.4f} on {metrics['eval_samples']} rows "
              f"({len(train)} training rows, {args.epochs} epochs)")
        if args.out:
            xc.save_initial(model, args.out)
            print(f"wrote {args.out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", help="training CSV (XSILO_TRAIN_DATA wins when set)")
    parser.add_argument("--test", help="test CSV (XSILO_TEST_DATA wins when set)")
    parser.add_argument("--epochs", type=int, default=10, help="central training epochs (default 10)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="central: save the trained model (float32 safetensors)")
    parser.add_argument("--init", help="write the initial model file for the server and exit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    for name in ("xsilo_client", "digits"):
        logging.getLogger(name).setLevel(logging.INFO)

    torch.manual_seed(args.seed)
    if args.init:
        xc.save_initial(DigitsCNN(), args.init)
        print(f"wrote {args.init}")
        return
    workers = Workers()
    train, test = load_data(args)
    try:
        if xc.is_federated():
            run_federated(args, workers, train, test)
        else:
            run_central(args, workers, train, test)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
