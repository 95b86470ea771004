"""A generated text classification set: short "reviews" whose label is their sentiment.

Each review is 4 to 14 words: neutral filler, a topic word, and one to three sentiment words,
any of which "not" may flip. The label is 1 when the flipped sentiment words sum above zero.
Getting negation right takes attention over word order, which is what the frozen base's LoRA
adapters must learn; the base itself is pretrained on other questions about the same kind of
text (its topic, and whether it negates anything), as a pretrained model's would be.

    python3 data.py OUT.csv [--rows 3000] [--seed 0] [--task sentiment|topic]

Rows are token ids padded with 0 to MAX_LEN, then the label: numeric CSV with a header, which
xsilo sim splits across silos like any data set.
"""

import argparse
import csv

import numpy as np

MAX_LEN = 16
FILLER = ["the", "a", "this", "that", "it", "was", "is", "and", "but", "very", "quite", "really", "so", "my",
          "we", "they", "our", "staff", "place", "time", "again", "overall", "service", "visit"]
TOPICS = {0: ["food", "menu", "dish", "taste"], 1: ["room", "bed", "hotel", "view"],
          2: ["film", "actor", "plot", "scene"], 3: ["phone", "screen", "battery", "app"]}
POSITIVE = ["good", "great", "lovely", "excellent", "fine", "nice", "superb"]
NEGATIVE = ["bad", "awful", "poor", "terrible", "rude", "dirty", "boring"]
NOT = "not"
VOCAB = ["<pad>", NOT] + FILLER + [w for ws in TOPICS.values() for w in ws] + POSITIVE + NEGATIVE
IDS = {w: i for i, w in enumerate(VOCAB)}
assert len(VOCAB) <= 64, len(VOCAB)


def review(rng):
    """(words, sentiment label, pretraining label: topic * 2 + whether a word is negated)."""
    topic = int(rng.integers(4))
    words = list(rng.choice(FILLER, size=int(rng.integers(2, 8))))
    words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(TOPICS[topic])))
    score = 0
    negations = 0
    for _ in range(int(rng.integers(1, 4))):
        positive = bool(rng.integers(2))
        word = str(rng.choice(POSITIVE if positive else NEGATIVE))
        negated = rng.random() < 0.1
        negations += negated
        score += (1 if positive else -1) * (-1 if negated else 1)
        at = int(rng.integers(len(words) + 1))
        words[at:at] = [NOT, word] if negated else [word]
    if score == 0:  # no ties: one more plain sentiment word decides
        positive = bool(rng.integers(2))
        words.append(str(rng.choice(POSITIVE if positive else NEGATIVE)))
        score = 1 if positive else -1
    return words[:MAX_LEN], int(score > 0), topic * 2 + int(negations > 0)


def encode(words):
    ids = [IDS[w] for w in words][:MAX_LEN]
    return ids + [0] * (MAX_LEN - len(ids))


def generate(rows, seed=0, task="sentiment"):
    """(ids int64 [rows, MAX_LEN], labels int64 [rows])."""
    rng = np.random.default_rng(seed)
    x, y = [], []
    for _ in range(rows):
        words, sentiment, topic = review(rng)
        x.append(encode(words))
        y.append(sentiment if task == "sentiment" else topic)
    return np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64)


def write_csv(path, x, y):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"t{i}" for i in range(MAX_LEN)] + ["label"])
        for ids, label in zip(x, y):
            w.writerow(list(ids) + [label])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--rows", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--task", choices=["sentiment", "topic"], default="sentiment")
    a = p.parse_args()
    write_csv(a.out, *generate(a.rows, a.seed, a.task))


if __name__ == "__main__":
    main()
