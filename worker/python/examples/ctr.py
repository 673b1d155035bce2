"""Click-through-rate models on embedding tables: the generated task of tessera.ctr (a planted model, so the best
achievable log loss and AUC are known) trained through Tessera's servers. The launcher runs it once per worker:

    python3 -m tessera.ctr generate --out runs/ctr-data           # (build/python on PYTHONPATH)
    build/bin/tessera-launch --job=deploy/jobs/ctr_logistic.pbtxt --linger_s=0 -- \\
        python3 worker/python/examples/ctr.py --data=runs/ctr-data --model=logistic

Models: logistic (a weight per id: an embedding table of dim 1, pooled over the 26 fields, plus a linear layer
over the 13 dense fields) and dlrm (a small DLRM: a factor table of dim 8, a bottom layer for the dense fields,
the pairwise dot products of the 27 vectors, and a top MLP). The tables train with their own optimizer on the
servers (row-wise AdaGrad by default); the dense layers with the job's. Rank 0 scores the test split every
--eval_every steps (log loss and AUC; the AUC goes to the job's records as its accuracy) and, with --out, every
rank writes its rows-updated rate and rank 0 its curve to OUT/ctr-rank<r>.json.
"""

import argparse
import json
import os
import time

import numpy as np
import torch

import tessera.torch as tt
from tessera import ctr


class Logistic(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.weights = tt.EmbeddingBag("ctr_weights", 1, mode="sum", init_scale=0.0, **table)
        self.dense = torch.nn.Linear(ctr.DENSE_FIELDS, 1)

    def forward(self, dense, ids):
        return (self.weights(ids) + self.dense(dense)).squeeze(1)


class Dlrm(torch.nn.Module):
    """A small DLRM: the pairwise dot products of the ids' factor vectors and the dense fields' bottom vector go
    through a top MLP, beside a table of dim 1. With `fm_sum` the sum of the ids' pairwise dot products also joins
    the logit directly, as a factorisation machine's does (DeepFM's shape), so that the top MLP need not learn to
    add 325 products up through its ReLU."""

    def __init__(self, table, factor_learning_rate, dim=8, factor_init=0.05, fm_sum=False):
        super().__init__()
        self.fm_sum = fm_sum
        self.factors = tt.Embedding("ctr_factors", dim, init_scale=factor_init, seed=11,
                                    **dict(table, learning_rate=factor_learning_rate))
        self.weights = tt.EmbeddingBag("ctr_weights", 1, mode="sum", init_scale=0.0, **table)
        self.bottom = torch.nn.Sequential(torch.nn.Linear(ctr.DENSE_FIELDS, dim), torch.nn.ReLU())
        vectors = ctr.CATEGORICAL_FIELDS + 1
        self.pairs = torch.triu_indices(vectors, vectors, offset=1)
        self.top = torch.nn.Sequential(torch.nn.Linear(dim + self.pairs.shape[1], 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))

    def forward(self, dense, ids):
        bottom = self.bottom(dense)
        vectors = torch.cat([bottom.unsqueeze(1), self.factors(ids)], dim=1)  # [batch, 27, dim]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        logit = self.top(torch.cat([bottom, dots], dim=1)) + self.weights(ids)
        if self.fm_sum:  # the pairs of ids only: the first CATEGORICAL_FIELDS pairs hold the bottom vector's
            logit = logit + dots[:, ctr.CATEGORICAL_FIELDS:].sum(dim=1, keepdim=True)
        return logit.squeeze(1)


def score(net, dense, ids, label):
    """(log loss, AUC) of `net` on the split."""
    with torch.no_grad():
        p = torch.sigmoid(net(dense, ids)).numpy()
    return ctr.log_loss(label, p), ctr.auc(label, p)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a folder of python3 -m tessera.ctr generate")
    parser.add_argument("--model", choices=("logistic", "dlrm"), default="logistic")
    parser.add_argument("--table_optimizer", default="rowwise_adagrad")
    parser.add_argument("--table_learning_rate", type=float, default=0.1)
    parser.add_argument("--factor_learning_rate", type=float, default=0.05, help="dlrm: the factor table's rate")
    parser.add_argument("--factor_init", type=float, default=0.05, help="dlrm: the factor table's init scale")
    parser.add_argument("--fm_sum", action="store_true",
                        help="dlrm: the ids' pairwise dot products also summed into the logit (DeepFM)")
    parser.add_argument("--admit_after", type=int, default=0, help="a row is created at its id's k-th gradient")
    parser.add_argument("--eval_every", type=int, default=200, help="steps between rank 0's scores (0: at the end)")
    parser.add_argument("--out", default="", help="a folder for ctr-rank<r>.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = tt.init()
    torch.manual_seed(int(job.spec["seed"]))
    dense, ids, label, _ = ctr.load(os.path.join(args.data, "train.npz"))
    dense, ids, label = torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(label)
    table = dict(optimizer=args.table_optimizer, learning_rate=args.table_learning_rate, admit_after=args.admit_after)
    if args.model == "logistic":
        net = Logistic(table)
    else:
        net = Dlrm(table, args.factor_learning_rate, factor_init=args.factor_init, fm_sum=args.fm_sum)
    model = tt.DistributedModel(net, job)
    test = None
    if job.rank == 0:
        test_dense, test_ids, test_label, _ = ctr.load(os.path.join(args.data, "test.npz"))
        test = (torch.from_numpy(test_dense), torch.from_numpy(test_ids), test_label)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    curve, loss = [], torch.tensor(0.0)
    started = time.perf_counter()
    tables = [m for m in net.modules() if isinstance(m, tt.Embedding)]

    evaluating = [0.0]  # seconds rank 0 spent scoring, left out of the training rate

    def evaluate():
        began = time.perf_counter()
        model.settle()
        net.eval()
        test_loss, test_auc = score(net, *test)
        net.train()
        curve.append({"clock": model.clock, "seconds": began - started - evaluating[0], "log_loss": test_loss,
                      "auc": test_auc, "train_loss": float(loss)})
        print(f"rank 0: clock {model.clock}: test log loss {test_loss:.4f}, AUC {test_auc:.4f}", flush=True)
        model.report(accuracy=test_auc, loss=float(loss), test_loss=test_loss)
        evaluating[0] += time.perf_counter() - began

    for indices in model.sampler(len(label)):
        with model.step(batch_size=len(indices)):
            loss = loss_fn(model(dense[indices], ids[indices]), label[indices])
            loss.backward()
        if test is not None and args.eval_every > 0 and model.clock % args.eval_every == 0:
            evaluate()
    seconds = time.perf_counter() - started - evaluating[0]  # training only
    if test is not None and (not curve or curve[-1]["clock"] != model.clock):
        evaluate()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        result = {"rank": job.rank, "steps": model.clock, "seconds": seconds,
                  "rows_updated": sum(t.rows_updated for t in tables),
                  "rows_updated_per_s": sum(t.rows_updated for t in tables) / max(seconds, 1e-9), "curve": curve}
        with open(os.path.join(args.out, f"ctr-rank{job.rank}.json"), "w") as f:
            json.dump(result, f, indent=1)
    model.done()


if __name__ == "__main__":
    main()
