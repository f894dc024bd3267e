"""A small CNN on scikit-learn's bundled digits (8x8 images, 10 classes).

    python -m tapegrad.examples.digits_cnn [--steps 1000] [--reference torch]

Written against PyTorch's API; ``T`` is tapegrad (or torch for the reference run).
"""
import numpy as np

import tapegrad
from tapegrad.examples import common


def load_data(seed=0):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float64)[:, None, :, :]  # (N, 1, 8, 8)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = 360
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def build(T):
    nn, F = T.nn, T.nn.functional

    class DigitsCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
            self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.fc1 = nn.Linear(32 * 2 * 2, 64)
            self.fc2 = nn.Linear(64, 10)

        def forward(self, x):
            x = self.pool(F.relu(self.conv1(x)))  # 8x8 -> 4x4
            x = self.pool(F.relu(self.conv2(x)))  # 4x4 -> 2x2
            return self.fc2(F.relu(self.fc1(x.flatten(1))))

    return DigitsCNN().double()


def make_step(train, batch_size, seed):
    x, y = train
    rng = np.random.default_rng(seed + 1)
    batches = []  # the same batch order for tapegrad and the reference
    per_epoch = len(x) // batch_size

    def batch(i):
        while len(batches) <= i:
            order = rng.permutation(len(x))
            batches.extend(order[k * batch_size:(k + 1) * batch_size] for k in range(per_epoch))
        return batches[i]

    def step(T, model, i):
        idx = batch(i)
        xb, yb = T.tensor(x[idx]), T.tensor(y[idx])
        loss = T.nn.functional.cross_entropy(model(xb), yb)
        model.optimizer.zero_grad()
        loss.backward()
        model.optimizer.step()
        return loss.item()

    return step


def accuracy(T, model, data):
    x, y = data
    with T.no_grad():
        pred = model(T.tensor(x)).argmax(dim=1)
    return float((pred.numpy() == y).mean())


def run(T, args, init_state=None):
    train, test = load_data(args.seed)
    if T is tapegrad:
        T.manual_seed(args.seed)
    model = build(T)
    if init_state is not None:
        model.load_state_dict(init_state)
    model.optimizer = T.optim.Adam(model.parameters(), lr=3e-3)
    step = make_step(train, 64, args.seed)
    losses, seconds = common.train_loop(T, model, step, args.steps, f"digits ({T.__name__})",
                                        args.no_progress)
    return model, losses, seconds, accuracy(T, model, train), accuracy(T, model, test)


def main(argv=None):
    args = common.parse_args("digits_cnn", __doc__.splitlines()[0], steps=1000, argv=argv)
    model, losses, seconds, train_acc, test_acc = run(tapegrad, args)
    print(f"digits CNN: {args.steps} Adam steps, batch 64, float64 — final loss "
          f"{losses[-1]:.4f}, train accuracy {train_acc:.2%}, test accuracy {test_acc:.2%}, "
          f"{seconds:.1f} s")
    ref = None
    if args.reference == "torch":
        import torch

        tapegrad.manual_seed(args.seed)
        init = common.to_torch_state(build(tapegrad).state_dict())
        _, ref, ref_seconds, _, ref_test = run(torch, args, init_state=init)
        print(f"reference test accuracy {ref_test:.2%}")
        common.report_reference(losses, ref, seconds, ref_seconds)
    common.save_outputs(args.out, "digits_cnn", losses, model, ref)
    return test_acc


if __name__ == "__main__":
    main()
