#!/usr/bin/env python3
"""PyTorch reference for Tessera's GPU worker: the same MLP, optimizer, batch size and data order policy.

Trains 784-256-128-10 (ReLU, softmax cross-entropy) with SGD (momentum) on Fashion-MNIST read from the IDX
files, taking each batch from host memory as a Tessera worker does, and prints one JSON line with samples/s.
"""
import argparse
import gzip
import json
import time

import numpy as np
import torch


def load_idx(images_path, labels_path):
    with gzip.open(images_path, "rb") as f:
        images = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255.0
    with gzip.open(labels_path, "rb") as f:
        labels = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy(images), torch.from_numpy(labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help="folder with the four Fashion-MNIST .gz files")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    args = parser.parse_args()

    device = torch.device("cuda")
    x, y = load_idx(f"{args.data}/train-images-idx3-ubyte.gz", f"{args.data}/train-labels-idx1-ubyte.gz")
    tx, ty = load_idx(f"{args.data}/t10k-images-idx3-ubyte.gz", f"{args.data}/t10k-labels-idx1-ubyte.gz")
    x, y = x.pin_memory(), y.pin_memory()
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(42)
    steps_per_epoch = x.shape[0] // args.batch

    def step(i, order):
        idx = order[(i % steps_per_epoch) * args.batch:(i % steps_per_epoch + 1) * args.batch]
        xb = x[idx].to(device, non_blocking=True)
        yb = y[idx].to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()

    order = torch.randperm(x.shape[0], generator=generator)
    for i in range(50):  # warm-up: kernels, allocator
        step(i, order)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(args.steps):
        if i % steps_per_epoch == 0:
            order = torch.randperm(x.shape[0], generator=generator)
        step(i, order)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        accuracy = (model(tx.to(device)).argmax(1).cpu() == ty).float().mean().item()
    print(json.dumps({"framework": "pytorch " + torch.__version__, "batch": args.batch, "steps": args.steps,
                      "samples_per_sec": args.steps * args.batch / seconds, "test_accuracy": accuracy}))


if __name__ == "__main__":
    main()
