"""Mixed precision: why float16 needs loss scaling and bfloat16 does not.

    python -m tapegrad.examples.mixed_precision [--steps 100] [--reference torch]

One small regression MLP, whose loss gradients are tiny (small targets, mean over a large
batch), is trained three ways from the same weights with Adam:

- autocast float16, no scaling: the gradients reaching the float16 layers fall below
  float16's smallest subnormal (6e-8) and flush to zero: most weight gradients are exactly
  zero and the loss stalls;
- autocast float16 with ``amp.GradScaler``: the loss is multiplied by 2**16 before backward,
  the gradients survive, are unscaled in float32 and the model trains (the scaler backs off
  whenever the scaled gradients overflow);
- autocast bfloat16: float32's exponent range, so the same gradients survive unscaled.
"""
import argparse
import time

import tapegrad


def build(T, seed=0):
    T.manual_seed(seed)
    nn = T.nn
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    with T.no_grad():  # a small last layer: small outputs, so every gradient starts small
        model[4].weight.mul_(1e-3)
        model[4].bias.zero_()
    return model


def data(T, n=512):
    g = tapegrad.Generator().manual_seed(1)
    x = tapegrad.randn(n, 32, generator=g)
    y = 1e-3 * tapegrad.tanh(x[:, :4].sum(dim=1, keepdim=True))  # small targets
    return T.tensor(x.numpy()), T.tensor(y.numpy())


def train(T, mode, init, x, y, steps):
    model = build(T)
    model.load_state_dict(init)
    opt = T.optim.Adam(model.parameters(), lr=1e-3)
    dtype = T.bfloat16 if mode == "bfloat16" else T.float16
    scaler = T.amp.GradScaler("cpu", enabled=mode == "float16 + GradScaler")
    losses, zero_fraction = [], None
    for step in range(steps):
        opt.zero_grad()
        with T.autocast("cpu", dtype=dtype):
            loss = T.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step == 0:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            zeros = sum(int((g == 0).sum().item()) for g in grads)
            zero_fraction = zeros / sum(p.numel() for p in model.parameters())
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses, zero_fraction, scaler.get_scale()


MODES = ("float16, no scaling", "float16 + GradScaler", "bfloat16")


def run(T, steps):
    x, y = data(T)
    init = {k: v.detach().clone() for k, v in build(T).state_dict().items()}
    return {mode: train(T, mode, init, x, y, steps) for mode in MODES}


def report(name, results):
    print(f"{name}: {'mode':<22} {'zero grads':>10} {'loss first':>11} {'loss last':>10}"
          f" {'scale':>8}")
    for mode, (losses, zero, scale) in results.items():
        print(f"{name}: {mode:<22} {zero:>10.1%} {losses[0]:>11.3e} {losses[-1]:>10.3e}"
              f" {scale:>8g}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--reference", choices=["torch"], default=None,
                        help="also run the same script with PyTorch")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    results = run(tapegrad, args.steps)
    report("tapegrad", results)
    if args.reference == "torch":
        import torch

        report("torch   ", run(torch, args.steps))
    print(f"({time.perf_counter() - start:.1f} s)")
    return results


if __name__ == "__main__":
    main()
