"""A small CNN for 8x8 digit images (the data set in data/digits.csv.gz)."""

import torch
from torch import nn


class DigitsCNN(nn.Module):
    """conv 1->16 (3x3) + BatchNorm, conv 16->32 (3x3), 2x2 max-pool, linear 32*4*4 -> 10.

    About 10 k parameters. BatchNorm's num_batches_tracked is an integer buffer: it is not
    federated and stays local to each silo (the SDK leaves it out of what it sends).
    """

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 4 * 4, classes)

    def forward(self, x):
        x = x.view(-1, 1, 8, 8)
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc(x.flatten(1))
