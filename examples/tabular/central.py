#!/usr/bin/env python3
"""An MLP with BatchNorm and Dropout on a CSV file, trained centrally: a hospital's script as
people write it. train.py beside it is the same script federated (docs/bring-your-own-model.md
shows the diff)."""
import argparse

import numpy as np
import torch
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

torch.manual_seed(0)
x, y = load(args.train)
tx, ty = load(args.test)
mean, std = x.mean(0), x.std(0) + 1e-6
x, tx = (x - mean) / std, (tx - mean) / std

model = nn.Sequential(nn.Linear(x.shape[1], 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

for epoch in range(args.epochs):
    model.train()
    for batch in torch.randperm(len(y)).split(32):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        opt.step()

print(f"test accuracy {accuracy(model, tx, ty):.4f}")
