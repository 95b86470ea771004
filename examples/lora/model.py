"""A small transformer text classifier built from a config (no download), and LoRA adapters.

The encoder is written out (attention with separate q, k, v, o projections) so that LoRA can
wrap the projections the way `peft` does for BERT's query and value: a frozen weight W plus a
trainable low-rank B @ A scaled by alpha / r, B starting at zero (the adapted model starts as
the base). Only the adapters and the classification head are trained, and only they are
federated (`federate=LORA_TENSORS`).
"""

import math

import torch
from torch import nn

CONFIG = {"vocab_size": 64, "max_len": 16, "d_model": 64, "heads": 4, "layers": 2, "ff": 128, "classes": 2}
LORA = {"rank": 4, "alpha": 8, "targets": ("attn.q", "attn.v")}
# What a silo federates: the adapters and the head. The frozen base never leaves it.
LORA_TENSORS = ["*lora_A", "*lora_B", "head.*"]


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x, pad):
        b, n, d = x.shape
        split = lambda t: t.view(b, n, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
        return self.o(out)


class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x, pad):
        x = x + self.attn(self.norm1(x), pad)
        return x + self.ff(self.norm2(x))


class TextClassifier(nn.Module):
    """Token ids [batch, max_len] (0 = padding) -> class logits."""

    def __init__(self, config=CONFIG):
        super().__init__()
        c = config
        self.embed = nn.Embedding(c["vocab_size"], c["d_model"], padding_idx=0)
        self.position = nn.Parameter(torch.randn(c["max_len"], c["d_model"]) * 0.02)
        self.blocks = nn.ModuleList(Block(c["d_model"], c["heads"], c["ff"]) for _ in range(c["layers"]))
        self.norm = nn.LayerNorm(c["d_model"])
        self.head = nn.Linear(c["d_model"], c["classes"])

    def forward(self, ids):
        pad = ids == 0
        x = self.embed(ids) + self.position[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, pad)
        keep = (~pad).unsqueeze(-1).float()
        pooled = (self.norm(x) * keep).sum(1) / keep.sum(1).clamp(min=1)
        return self.head(pooled)


class LoRALinear(nn.Module):
    """y = W x + b + (alpha / r) B A x, with W and b frozen."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scale


def add_lora(model, rank=LORA["rank"], alpha=LORA["alpha"], targets=LORA["targets"]):
    """Freezes the model, wraps the target projections with LoRA, keeps the head trainable."""
    for p in model.parameters():
        p.requires_grad_(False)
    for name, module in list(model.named_modules()):
        for target in targets:
            parent_name, _, child = target.rpartition(".")
            if name.endswith(parent_name) and isinstance(getattr(module, child, None), nn.Linear):
                if isinstance(module, nn.Sequential):
                    module[int(child)] = LoRALinear(module[int(child)], rank, alpha)
                else:
                    setattr(module, child, LoRALinear(getattr(module, child), rank, alpha))
    for p in model.head.parameters():
        p.requires_grad_(True)
    return model


def count(model, trainable_only=False):
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
