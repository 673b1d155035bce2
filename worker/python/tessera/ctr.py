"""A generated click-through-rate task with a known answer, shaped like Criteo's: 13 dense and 26 categorical
fields per example, a 0/1 label.

No data set of this kind is in Debian's packages, so the examples are drawn from a planted model and the best any
model can do on them (the planted model's own log loss and AUC) is known:

- field f's ids are ranks drawn from a power law (Zipf, exponent `zipf`) in a space of 2^bits(f) values, bits from
  20 to 26 over the fields, scrambled by an odd multiplier so that popular ids are not small numbers; an example's
  id of field f is (f << 32) | value, unique over the fields, so one table can hold every field;
- the label is drawn from sigmoid(logit): logistic: bias + dense . w + the sum of the 26 ids' weights; fm: also
  the factorisation machine's sum over pairs of the ids' factor vectors (k = 4). An id's weight and factors are
  a pure function of the seed and the id, their scale falling with its rank (rare ids matter less).

    python3 -m tessera.ctr generate --out DIR [--train 200000 --test 20000 --seed 1 --planted logistic]

writes DIR/train.npz and DIR/test.npz (dense float32 [n, 13], ids int64 [n, 26], label float32 [n], the planted
probability p float32 [n]) and DIR/planted.json (the planted model's log loss and AUC on each split).
"""

import argparse
import json
import os

import numpy as np

DENSE_FIELDS = 13
CATEGORICAL_FIELDS = 26
_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def field_bits(field):
    """The id space of categorical field `field` is 2^field_bits(field): 20 to 26."""
    return 20 + (field * 7) // CATEGORICAL_FIELDS


def _mix(x):
    """SplitMix64 of a uint64 array."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return x ^ (x >> np.uint64(31))


def _normal(ids, salt):
    """A standard normal per id: a pure function of (id, salt)."""
    with np.errstate(over="ignore"):
        a = _mix(ids.astype(np.uint64) ^ np.uint64(salt))
        b = _mix(a + np.uint64(1))
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    u2 = (b >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class Planted:
    """The model the labels are drawn from."""

    def __init__(self, seed, kind="logistic", weight_scale=0.35, factor_scale=0.25, factors=4):
        if kind not in ("logistic", "fm"):
            raise ValueError(f"planted model must be 'logistic' or 'fm', not {kind!r}")
        self.seed, self.kind = int(seed), kind
        self.weight_scale, self.factor_scale, self.factors = weight_scale, factor_scale, factors
        rng = np.random.default_rng(self.seed + 17)
        self.dense_weights = rng.normal(0.0, 0.3, DENSE_FIELDS)
        self.bias = -1.2

    def logits(self, dense, ids, ranks, block=1 << 18):
        """The planted logit of each example, `block` examples at a time (the factors' temporaries of a whole
        split of millions would take gigabytes)."""
        if len(ids) > block:
            return np.concatenate([self.logits(dense[i:i + block], ids[i:i + block], ranks[i:i + block], block)
                                   for i in range(0, len(ids), block)])
        # Rare ids matter less: an id's scale falls with its rank in its field.
        fade = 1.0 / np.sqrt(1.0 + ranks / 200.0)
        # Summed per row, not by BLAS, whose last bits depend on how many rows it is given.
        out = self.bias + (dense.astype(np.float64) * self.dense_weights).sum(axis=1)
        out += (self.weight_scale * fade * _normal(ids, self.seed * 7919 + 1)).sum(axis=1)
        if self.kind == "fm":
            v = np.stack([self.factor_scale * fade * _normal(ids, self.seed * 7919 + 100 + k)
                          for k in range(self.factors)], axis=-1)  # [n, fields, k]
            total = v.sum(axis=1)
            out += 0.5 * ((total ** 2).sum(axis=1) - (v ** 2).sum(axis=(1, 2)))
        return out


def draw(examples, seed, planted, zipf=1.3):
    """`examples` examples from the seeded stream `seed`: (dense, ids, label, p)."""
    rng = np.random.default_rng(seed)
    dense = np.log1p(rng.exponential(3.0, (examples, DENSE_FIELDS))).astype(np.float32)
    dense = (dense - 1.2) / 0.6
    ranks = np.empty((examples, CATEGORICAL_FIELDS), np.int64)
    ids = np.empty((examples, CATEGORICAL_FIELDS), np.int64)
    for f in range(CATEGORICAL_FIELDS):
        space = 1 << field_bits(f)
        rank = np.minimum(rng.zipf(zipf, examples) - 1, space - 1)
        ranks[:, f] = rank
        # An odd multiplier is a bijection modulo a power of two: ranks map to scrambled values, none shared.
        value = (rank * (2654435761 + 2 * f)) % space
        ids[:, f] = (f << 32) | value
    p = 1.0 / (1.0 + np.exp(-planted.logits(dense, ids, ranks)))
    label = (rng.random(examples) < p).astype(np.float32)
    return dense, ids, label, p.astype(np.float32)


def log_loss(label, p):
    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(label * np.log(p) + (1 - label) * np.log(1 - p)))


def auc(label, score):
    """The area under the ROC curve (ties counted half), from ranks."""
    label = np.asarray(label) > 0.5
    score = np.asarray(score, np.float64)
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score), np.float64)
    sorted_scores = score[order]
    # Average ranks over ties.
    boundaries = np.flatnonzero(np.diff(sorted_scores)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(score)]])
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2.0
    positives = label.sum()
    negatives = len(label) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[label].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def load(path):
    with np.load(path) as f:
        return f["dense"], f["ids"], f["label"], f["p"]


def generate(out, train=200000, test=20000, seed=1, planted="logistic", zipf=1.3):
    """Writes train.npz, test.npz and planted.json under `out`; returns planted.json's contents."""
    os.makedirs(out, exist_ok=True)
    model = Planted(seed, planted)
    summary = {"planted": planted, "seed": seed, "zipf": zipf, "train_examples": train, "test_examples": test}
    for split, count, stream in (("train", train, seed * 2 + 1), ("test", test, seed * 2 + 2)):
        dense, ids, label, p = draw(count, stream, model, zipf)
        np.savez(os.path.join(out, f"{split}.npz"), dense=dense, ids=ids, label=label, p=p)
        summary[split] = {"log_loss": log_loss(label, p), "auc": auc(label, p),
                          "positive_rate": float(label.mean()),
                          "distinct_ids": int(len(np.unique(ids)))}
    with open(os.path.join(out, "planted.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def main():
    parser = argparse.ArgumentParser(prog="python3 -m tessera.ctr", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write a generated CTR task and print the planted model's scores")
    g.add_argument("--out", required=True)
    g.add_argument("--train", type=int, default=200000)
    g.add_argument("--test", type=int, default=20000)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--planted", choices=("logistic", "fm"), default="logistic")
    g.add_argument("--zipf", type=float, default=1.3)
    args = parser.parse_args()
    if args.train < 1 or args.test < 1 or args.zipf <= 1.0:
        parser.error("--train and --test must be >= 1 and --zipf > 1")
    s = generate(args.out, args.train, args.test, args.seed, args.planted, args.zipf)
    for split in ("train", "test"):
        print(f"{split}: {s[split]['distinct_ids']} distinct ids; planted "
              f"{args.planted} model: log loss {s[split]['log_loss']:.4f}, AUC {s[split]['auc']:.4f}, "
              f"positives {s[split]['positive_rate']:.3f}")


if __name__ == "__main__":
    main()
