#!/usr/bin/env python3
"""An MLP with BatchNorm and Dropout on a CSV file: the script of central.py beside it, federated.
Run by hand it trains centrally, exactly as central.py does; under an xsilo agent it is a silo."""
import argparse

import numpy as np
import torch
import xsilo_client as xc
from torch import nn


def load(path):
    data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32)  # header line, label last
    return torch.from_numpy(data[:, :-1]), torch.from_numpy(data[:, -1]).long()


@torch.no_grad()
def accuracy(model, x, y):
    model.eval()
    return (model(x).argmax(1) == y).float().mean().item()


parser = argparse.ArgumentParser()
parser.add_argument("--train", default="train.csv")
parser.add_argument("--test", default="test.csv")
parser.add_argument("--epochs", type=int, default=20)
args = parser.parse_args()
args.train, args.test = xc.data_paths(default=(args.train, args.test))

torch.manual_seed(0)
x, y = load(args.train)
tx, ty = load(args.test)
stats = xc.feature_stats(fallback=x)  # the federation's mean and variance, from before round 1
x, tx = stats.standardize(x), stats.standardize(tx)

model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

evaluate = lambda: {"eval_accuracy": accuracy(model, tx, ty), "eval_samples": len(ty)}  # noqa: E731
for epoch in xc.epochs(model, num_samples=len(y), epochs=args.epochs, evaluate=evaluate):
    model.train()
    for batch in torch.randperm(len(y)).split(32):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        opt.step()
    xc.log(loss=loss.item())

print(f"test accuracy {accuracy(model, tx, ty):.4f}")
