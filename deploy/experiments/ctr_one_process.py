"""The ceiling one pass over a generated CTR task allows: the planted model's own form trained in one process.

A factorisation machine (a bias, a linear layer over the 13 dense fields, a weight and K factors per id, the sum
of the pairwise dot products of the 26 ids' factors), the form `python3 -m tessera.ctr generate --planted fm`
draws its labels from, trained with PyTorch alone (no servers): per-coordinate AdaGrad on the sparse tables, Adam
on the dense layer, the union batch of the experiment's two workers. What it reaches after the epoch is what the
data allows a learner of the right form; the distance left to the planted model is then the data's, not the
training system's (deploy/experiments/README.md, "Click-through rate").

    PYTHONPATH=build/python python3 deploy/experiments/ctr_one_process.py --data DIR [--epochs 1 --factors 4]

prints the test log loss and AUC every --eval_every steps and at the end, beside the planted model's.
"""

import argparse
import json
import os
import time

import numpy as np
import torch

from tessera import ctr


class FactorisationMachine(torch.nn.Module):
    def __init__(self, ids, factors, init_scale):
        super().__init__()
        self.weights = torch.nn.Embedding(ids, 1, sparse=True)
        torch.nn.init.zeros_(self.weights.weight)
        self.factors = torch.nn.Embedding(ids, factors, sparse=True)
        torch.nn.init.uniform_(self.factors.weight, -init_scale, init_scale)
        self.dense = torch.nn.Linear(ctr.DENSE_FIELDS, 1)

    def forward(self, dense, ids):
        v = self.factors(ids)  # [batch, fields, k]
        pairs = 0.5 * (v.sum(1).pow(2).sum(1) - v.pow(2).sum((1, 2)))
        return self.weights(ids).sum(1).squeeze(1) + self.dense(dense).squeeze(1) + pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="a folder of python3 -m tessera.ctr generate --planted fm")
    parser.add_argument("--factors", type=int, default=4, help="factors per id (the planted model has 4)")
    parser.add_argument("--learning_rate", type=float, default=0.05, help="AdaGrad's rate for weights and factors")
    parser.add_argument("--init_scale", type=float, default=0.05)
    parser.add_argument("--batch_size", type=int, default=512, help="the experiment's 2 workers x 256")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--eval_every", type=int, default=2000, help="steps between scores (0: at the end)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dense, ids, label, _ = ctr.load(os.path.join(args.data, "train.npz"))
    test_dense, test_ids, test_label, _ = ctr.load(os.path.join(args.data, "test.npz"))
    # The ids as rows of one compact table.
    known, rows = np.unique(np.concatenate([ids.ravel(), test_ids.ravel()]), return_inverse=True)
    rows = torch.from_numpy(rows.astype(np.int64))
    train_rows, test_rows = rows[:ids.size].reshape(ids.shape), rows[ids.size:].reshape(test_ids.shape)
    dense, label, test_dense = torch.from_numpy(dense), torch.from_numpy(label), torch.from_numpy(test_dense)
    net = FactorisationMachine(len(known), args.factors, args.init_scale)
    optimizers = [torch.optim.Adagrad([net.weights.weight, net.factors.weight], lr=args.learning_rate),
                  torch.optim.Adam(net.dense.parameters(), lr=0.01)]
    loss_fn = torch.nn.BCEWithLogitsLoss()
    with open(os.path.join(args.data, "planted.json")) as f:
        planted = json.load(f)["test"]
    started = time.perf_counter()

    def evaluate(epoch, step):
        with torch.no_grad():
            p = torch.sigmoid(net(test_dense, test_rows)).numpy()
        print(f"epoch {epoch} step {step}: test log loss {ctr.log_loss(test_label, p):.4f} (planted "
              f"{planted['log_loss']:.4f}), AUC {ctr.auc(test_label, p):.4f} (planted {planted['auc']:.4f}), "
              f"{time.perf_counter() - started:.0f} s", flush=True)

    order = torch.Generator().manual_seed(args.seed)
    for epoch in range(args.epochs):
        perm = torch.randperm(len(label), generator=order)
        steps = (len(label) + args.batch_size - 1) // args.batch_size
        for step in range(steps):
            batch = perm[step * args.batch_size:(step + 1) * args.batch_size]
            for o in optimizers:
                o.zero_grad()
            loss_fn(net(dense[batch], train_rows[batch]), label[batch]).backward()
            for o in optimizers:
                o.step()
            if args.eval_every > 0 and (step + 1) % args.eval_every == 0:
                evaluate(epoch, step + 1)
        if args.eval_every == 0 or steps % args.eval_every != 0:
            evaluate(epoch, steps)


if __name__ == "__main__":
    main()
