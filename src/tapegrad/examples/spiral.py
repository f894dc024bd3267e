"""The spiral MLP (2 -> 32 -> 3, ReLU, softmax cross-entropy, full-batch SGD at lr 0.5).

    python -m tapegrad.examples.spiral [--steps 300] [--reference torch]

The same model as the demo's, written the way a PyTorch user writes it: nn.Sequential,
nn.CrossEntropyLoss, optim.SGD.
"""
import tapegrad
from tapegrad.bench.spiral import spiral_data
from tapegrad.examples import common


def build(T):
    nn = T.nn
    return nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3)).double()


def run(T, args, X, y, init_state=None):
    model = build(T)
    if init_state is not None:
        model.load_state_dict(init_state)
    opt = T.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = T.nn.CrossEntropyLoss()
    xb, yb = T.tensor(X), T.tensor(y)

    def step(T, model, i):
        loss = loss_fn(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    losses, seconds = common.train_loop(T, model, step, args.steps, f"spiral ({T.__name__})",
                                        args.no_progress)
    with T.no_grad():
        acc = float((model(xb).argmax(dim=1).numpy() == y).mean())
    return model, losses, seconds, acc


def main(argv=None):
    args = common.parse_args("spiral", __doc__.splitlines()[0], steps=300, argv=argv)
    X, y = spiral_data(512, 3, seed=args.seed)
    tapegrad.manual_seed(args.seed)
    init = {k: v.clone() for k, v in build(tapegrad).state_dict().items()}
    model, losses, seconds, acc = run(tapegrad, args, X, y, init_state=init)
    print(f"spiral MLP: {args.steps} SGD steps, 512 points, float64 — loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, train accuracy {acc:.2%}, {seconds:.2f} s")
    ref = None
    if args.reference == "torch":
        import torch

        _, ref, ref_seconds, _ = run(torch, args, X, y, init_state=common.to_torch_state(init))
        common.report_reference(losses, ref, seconds, ref_seconds)
    common.save_outputs(args.out, "spiral", losses, model, ref)
    return losses


if __name__ == "__main__":
    main()
