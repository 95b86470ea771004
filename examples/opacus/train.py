#!/usr/bin/env python3
"""DP-SGD with Opacus, as one silo of an xsilo federation under a record-level privacy budget.

    python3 train.py --epochs 5           # central: pooled data, prints test accuracy and epsilon

Under an agent (XSILO_TRAINER_FD set), with `privacy` in the agent's config (docs/privacy.md),
the script trains each round with Opacus's PrivacyEngine and reports what it ran with the
update: `xc.epochs(model, ..., privacy=engine)`. The agent accounts the epsilon itself and keeps
the update in the silo when it would pass the silo's budget. Against a plain PyTorch loop the
changes are the lines marked "DP" (GroupNorm instead of BatchNorm, which DP-SGD cannot use).

Needs opacus (pip install opacus). Data: CSV rows of 64 pixel values then the label, from the
agent (xc.data_paths()), else --train / --test, else data/digits.csv.gz split 80/20.
"""

import argparse
import gzip
import logging
import sys
from pathlib import Path

import numpy as np
import torch
from opacus import PrivacyEngine  # DP
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
try:
    import xsilo_client as xc
except ImportError:  # a source tree: the SDK next door in python/
    sys.path.insert(0, str(REPO / "python"))
    import xsilo_client as xc

log = logging.getLogger("opacus-digits")


class Digits(nn.Module):
    """A small CNN for 8x8 digits; GroupNorm where a plain model would have BatchNorm (DP)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.norm = nn.GroupNorm(4, 16)  # DP: per-example gradients need no batch statistics
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x.view(-1, 1, 8, 8))))
        return self.fc(nn.functional.max_pool2d(x, 2).flatten(1))


def read_csv(path):
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    rows = [[float(v) for v in line.split(",")] for line in raw.decode().splitlines()[0:] if line.strip()
            and not line[0].isalpha()]
    data = np.asarray(rows, dtype=np.float32)
    x, y = data[:, :64], data[:, 64].astype(np.int64)
    if x.max() > 1.5:
        x = x / 16.0
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def load(args):
    train_path, test_path = xc.data_paths(default=(args.train, args.test))
    train = read_csv(train_path or REPO / "data" / "digits.csv.gz")
    if test_path:
        return train, read_csv(test_path)
    order = np.random.default_rng(0).permutation(len(train))
    cut = len(train) // 5
    return torch.utils.data.Subset(train, order[cut:]), torch.utils.data.Subset(train, order[:cut])


def evaluate(model, test):
    model.eval()
    with torch.no_grad():
        x, y = next(iter(DataLoader(test, batch_size=len(test))))
        out = model(x)
        loss = nn.functional.cross_entropy(out, y).item()
        acc = (out.argmax(1) == y).float().mean().item()
    return {"eval_loss": loss, "eval_accuracy": acc, "eval_samples": len(test)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train"), p.add_argument("--test")
    p.add_argument("--epochs", type=int, default=1, help="epochs when run by hand")
    p.add_argument("--noise", type=float, default=1.0, help="noise multiplier sigma")
    p.add_argument("--epsilon", type=float, help="instead of --noise: the smallest noise that keeps "
                   "--total-epochs epochs of this data within epsilon at delta 1e-5 (Opacus chooses it)")
    p.add_argument("--total-epochs", type=int, help="with --epsilon: the epochs the budget must last "
                   "(federated: rounds x local epochs)")
    p.add_argument("--clip", type=float, default=1.0, help="per-example clip norm")
    p.add_argument("--batch", type=int, default=32, help="expected batch size (Poisson sampling)")
    p.add_argument("--seed", type=int, default=0, help="torch's seed (initial weights, batches, noise)")
    p.add_argument("--no-dp", action="store_true", help="plain SGD, for the non-private comparison")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", force=True)
    torch.manual_seed(args.seed)
    train, test = load(args)
    model = Digits()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = PrivacyEngine(accountant="rdp")  # DP
    private = dict(module=model, optimizer=optimizer, data_loader=DataLoader(train, batch_size=args.batch),
                   max_grad_norm=args.clip, poisson_sampling=True)
    if args.no_dp:
        engine, loader = None, DataLoader(train, batch_size=args.batch, shuffle=True)
    elif args.epsilon is None:  # DP: Poisson batches, clipping, noise
        model, optimizer, loader = engine.make_private(noise_multiplier=args.noise, **private)
    else:  # DP: the noise this silo's own data needs to stay within its budget
        if not args.total_epochs:
            p.error("--epsilon needs --total-epochs")
        model, optimizer, loader = engine.make_private_with_epsilon(
            target_epsilon=args.epsilon, target_delta=1e-5, epochs=args.total_epochs, **private)
        log.info("noise multiplier %.3f for epsilon %g over %d epochs", optimizer.noise_multiplier,
                 args.epsilon, args.total_epochs)
    plain = model if engine is None else model._module  # the model's own names, for the federation's weights

    # Each round: the global weights loaded into `plain`, its local epochs, then the weights sent
    # with what the round's DP-SGD ran (the engine's steps since the last round, for the silo's
    # accountant). Run by hand: --epochs epochs, centrally.
    for _ in xc.epochs(plain, num_samples=len(train), epochs=args.epochs,
                       evaluate=lambda: evaluate(model, test), privacy=engine):
        model.train()
        for x, y in loader:
            if len(y) == 0:  # a Poisson batch may be empty
                continue
            optimizer.zero_grad()
            batch_loss = nn.functional.cross_entropy(model(x), y)
            batch_loss.backward()
            optimizer.step()
            xc.log(loss=batch_loss.item())
    if not xc.is_federated():
        spent = "no DP" if engine is None else f"epsilon {engine.get_epsilon(1e-5):.2f} at delta 1e-5"
        log.info("central: %s", spent)  # the test metrics are logged above

if __name__ == "__main__":
    main()
