#!/usr/bin/env python3
"""Fine-tune the LoRA adapters of a small pretrained transformer on review sentiment.

    python3 train.py --epochs 10            # central: the whole data set, prints test accuracy
    xsilo sim --config sim.json --out runs/lora     # 5 silos, secure aggregation, adapters only

Under an xsilo agent the same script is one silo: xc.run answers the agent's tasks, and only
the tensors named by LORA_TENSORS (the adapters and the head, about 3 % of the model) are
federated; the frozen base stays in every silo, loaded from the same file.
"""

import argparse
import fcntl
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import xsilo_client as xc
except ImportError:  # a source tree: the SDK next door in python/
    sys.path.insert(0, str(HERE.parents[1] / "python"))
    import xsilo_client as xc
from xsilo_client import safetensors  # noqa: E402
from data import generate  # noqa: E402
from model import CONFIG, LORA_TENSORS, TextClassifier, add_lora, count  # noqa: E402

log = logging.getLogger("lora")


def read_rows(path):
    """(token ids int64 [rows, len], labels int64 [rows]) from the sim's CSV (header, label last)."""
    rows = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
    return torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, -1])


def base_weights(path):
    """The pretrained base: loaded from `path`, or pretrained once (on generated
    reviews: their topic and whether they negate, other questions over the same language) and written there. Every silo and the
    central run must use the same file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several silos on one machine: one pretrains, the others wait
        if not path.exists():
            torch.manual_seed(1)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # the same bits on every machine of this torch
            model = TextClassifier({**CONFIG, "classes": 8})
            x, y = generate(4000, seed=1, task="topic")
            x, y = torch.from_numpy(x), torch.from_numpy(y)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            for _ in range(3):
                for i in range(0, len(y), 64):
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x[i:i + 64]), y[i:i + 64]).backward()
                    opt.step()
            torch.set_num_threads(threads)
            state = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
            tmp = path.with_suffix(".tmp")
            safetensors.save_file({k: v.numpy() for k, v in state.items()}, tmp)
            os.replace(tmp, path)
            log.info("pretrained the base into %s", path)
    return {k: torch.from_numpy(v.copy()) for k, v in safetensors.load_file(path).items()}


def build_model(base_path):
    torch.manual_seed(0)  # the adapters' and head's first values (the server's initial model)
    model = TextClassifier(CONFIG)
    missing, unexpected = model.load_state_dict(base_weights(base_path), strict=False)
    assert not unexpected and set(missing) == {"head.weight", "head.bias"}, (missing, unexpected)
    return add_lora(model)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", default=str(HERE / "reviews.csv"), help="training rows (XSILO_TRAIN_DATA wins)")
    p.add_argument("--test", help="test rows (XSILO_TEST_DATA wins); default: 20 %% of --train")
    p.add_argument("--epochs", type=int, default=10, help="central training epochs")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--base", default=str(Path.home() / ".cache" / "xsilo-lora" /
                                         f"base-{hashlib.sha256(json.dumps(CONFIG).encode()).hexdigest()[:12]}.safetensors"))
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

    model = build_model(args.base)
    train_path, test_path = xc.data_paths(default=(args.train, args.test))
    x, y = read_rows(train_path)
    if test_path:
        tx, ty = read_rows(test_path)
    else:
        cut = len(y) * 4 // 5
        x, y, tx, ty = x[:cut], y[:cut], x[cut:], y[cut:]
    log.info("%d of %d parameters trainable and federated; %d training rows",
             count(model, trainable_only=True), count(model), len(y))

    def train(model, task):
        cfg = task.config
        opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad],
                                lr=float(cfg.get("learning_rate", args.lr)))
        gen = torch.Generator().manual_seed(int(cfg.get("seed", 0)) * 1000 + task.round)
        batch = int(cfg.get("batch_size", 32))
        model.train()
        total = 0.0
        for _ in range(task.local_epochs):
            order = torch.randperm(len(y), generator=gen)
            for i in range(0, len(y), batch):
                rows = order[i:i + batch]
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x[rows]), y[rows])
                loss.backward()
                opt.step()
                total += loss.item() * len(rows)
        return len(y), {"loss": total / max(1, len(y) * task.local_epochs)}

    @torch.no_grad()
    def evaluate(model, task):
        model.eval()
        logits = model(tx)
        return {"eval_loss": nn.functional.cross_entropy(logits, ty).item(),
                "eval_accuracy": (logits.argmax(1) == ty).float().mean().item(), "eval_samples": len(ty)}

    xc.run(model, train=train, evaluate=evaluate, federate=LORA_TENSORS, epochs=args.epochs)


if __name__ == "__main__":
    main()
