"""Per-call cost of common ops and of a small training step, one checkout per process.

    .venv/bin/python benchmarks/percall_ab.py /path/to/checkout   # e.g. a git worktree

Prints one line per case: the best of 5 repeats, in microseconds of this process's CPU time
per call (``time.process_time``: time the scheduler gives other processes on a loaded
machine is not counted; the ops here run the BLAS on one thread). Inputs that a
model's parameters would be require grad, so the ops record as they do in training. Alternate
two checkouts' runs several times and take each case's minimum: machine load hits both alike.
"""
import sys
import time
import timeit

sys.path.insert(0, sys.argv[1] + "/src")
import tapegrad as tg  # noqa: E402
import tapegrad.nn.functional as F  # noqa: E402

tg.manual_seed(0)
a8, b8 = tg.randn(8, 8, requires_grad=True), tg.randn(8, 8)
a64, b64 = tg.randn(64, 64, requires_grad=True), tg.randn(64, 64)
x = tg.randn(16, 32)
h = tg.randn(16, 64, requires_grad=True)
y = tg.randn(16, 64)
w, bias = tg.randn(64, 32, requires_grad=True), tg.randn(64, requires_grad=True)
logits, target = tg.randn(16, 10, requires_grad=True), tg.randint(0, 10, (16,))
table, idx = tg.randn(100, 32, requires_grad=True), tg.randint(0, 100, (16,))
xs = tg.randn(16, 32, requires_grad=True)
gamma, beta = tg.ones(32, requires_grad=True), tg.zeros(32, requires_grad=True)

model = tg.nn.Sequential(tg.nn.Linear(32, 64), tg.nn.ReLU(), tg.nn.Linear(64, 10))
opt = tg.optim.Adam(model.parameters(), lr=1e-3)


def step():
    opt.zero_grad()
    F.cross_entropy(model(x), target).backward()
    opt.step()


CASES = {
    "a @ b 8x8": (lambda: a8 @ b8, 5000),
    "a @ b 64x64": (lambda: a64 @ b64, 2000),
    "F.linear 16x32->64": (lambda: F.linear(x, w, bias), 5000),
    "F.relu 16x64": (lambda: F.relu(h), 5000),
    "F.cross_entropy 16x10": (lambda: F.cross_entropy(logits, target), 2000),
    "F.embedding 16 of 100x32": (lambda: F.embedding(idx, table), 5000),
    "F.layer_norm 16x32": (lambda: F.layer_norm(xs, (32,), gamma, beta), 2000),
    "x.sum() 16x64": (lambda: h.sum(), 5000),
    "x.exp() 16x64": (lambda: h.exp(), 5000),
    "x + y 16x64": (lambda: h + y, 5000),
    "MLP 32-64-10 fwd+bwd+Adam": (step, 300),
}
for name, (fn, number) in CASES.items():
    fn()
    best = min(timeit.repeat(fn, number=number, repeat=5, timer=time.process_time)) / number * 1e6
    print(f"{name}\t{best:.2f}")
