"""Node classification on a graph with two graph-convolution layers, in sparse algebra.

Reads graph/nodes.tsv (id, word bits..., community) and graph/edges.tsv (id, id). The
propagation matrix D^-1/2 (A + I) D^-1/2 is built and applied as sparse COO tensors.
"""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim import Adam


def read_graph(folder):
    nodes = np.genfromtxt(os.path.join(folder, "nodes.tsv"), dtype=np.dtype(str))
    edges = np.genfromtxt(os.path.join(folder, "edges.tsv"), dtype=np.int64)
    position = {int(name): i for i, name in enumerate(nodes[:, 0])}
    communities = sorted(set(nodes[:, -1]))
    labels = torch.LongTensor([communities.index(c) for c in nodes[:, -1]])
    words = torch.FloatTensor(nodes[:, 1:-1].astype(np.float32))
    words = words / words.sum(1, keepdim=True).clamp(min=1)  # nodes without words stay zero

    n = len(nodes)
    ends = torch.LongTensor([[position[a] for a in edges[:, 0]],
                             [position[b] for b in edges[:, 1]]])
    both = torch.cat([ends, ends.flip(0)], dim=1)
    links = torch.sparse_coo_tensor(both, torch.ones(both.size(1)), (n, n)).coalesce()
    links = torch.sparse_coo_tensor(links.indices(), torch.ones_like(links.values()), (n, n))
    with_self = links + torch.eye(n).to_sparse()
    degree = with_self.sum(dim=1).to_dense()
    scale = torch.diag(degree.pow(-0.5)).to_sparse()
    return words.to_sparse(), scale @ with_self @ scale, labels


class GraphConvolution(nn.Module):
    def __init__(self, inputs, outputs):
        super().__init__()
        self.weight = nn.Parameter(torch.Tensor(inputs, outputs))
        self.bias = nn.Parameter(torch.Tensor(outputs))
        nn.init.xavier_normal_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, features, propagate):
        mixed = torch.mm(features, self.weight)
        return torch.spmm(propagate, mixed) + self.bias


class NodeClassifier(nn.Module):
    def __init__(self, inputs, hidden, classes, dropout):
        super().__init__()
        self.first = GraphConvolution(inputs, hidden)
        self.second = GraphConvolution(hidden, classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, features, propagate):
        h = self.dropout(F.relu(self.first(features, propagate)))
        return F.log_softmax(self.second(h, propagate), dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--graph", default="graph")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--check-every", type=int, default=20)
    args = parser.parse_args()

    features, propagate, labels = read_graph(args.graph)
    n = labels.size(0)
    order = torch.randperm(n)
    train_nodes, check_nodes = order[:n // 2], order[n // 2:]
    model = NodeClassifier(features.size(1), args.hidden, int(labels.max()) + 1, 0.5)
    optimizer = Adam(model.parameters(), lr=0.02, weight_decay=5e-4)
    criterion = nn.NLLLoss()
    for epoch in range(1, args.epochs + 1):
        model.train()
        optimizer.zero_grad()
        scores = model(features, propagate)
        loss = criterion(scores[train_nodes], labels[train_nodes])
        loss.backward()
        optimizer.step()
        if epoch % args.check_every == 0:
            model.eval()
            with torch.no_grad():
                scores = model(features, propagate)
                right = (scores[check_nodes].argmax(1) == labels[check_nodes]).float().mean()
            print(f"epoch {epoch}: loss {loss.item():.4f} held-out accuracy {right.item():.3f}")


if __name__ == "__main__":
    main()
