"""``tapegrad bench compile``: the spiral training step compiled vs eager vs PyTorch eager.

The whole step (zero_grad, forward, ``loss.backward()``, ``optimizer.step()``) of the
spiral MLP (2 -> H -> 3, float64, SGD) is compiled with ``tapegrad.compile`` and timed
against the same step run eagerly by tapegrad and by PyTorch, interleaved in one process;
ratios are PyTorch eager / contestant (higher is faster). Compile time is reported cold
(first call: trace, passes, code generation, including running the step once) and warm
(a second compiled function of the same step, with the modules already imported).
"""
import argparse
import time

from tapegrad.bench import harness
from tapegrad.bench.spiral import init_params, spiral_data


def _model(T, sizes):
    ps = init_params(sizes)
    layers = []
    for k in range(0, len(ps), 2):
        lin = T.nn.Linear(ps[k].shape[1], ps[k].shape[0]).double()
        with T.no_grad():
            lin.weight.copy_(T.tensor(ps[k]))
            lin.bias.copy_(T.tensor(ps[k + 1]))
        layers += [lin, T.nn.ReLU()]
    return T.nn.Sequential(*layers[:-1])


def make_step(T, sizes=(2, 32, 3), batch=512, lr=0.5):
    """``(step, model)``: one SGD step of the spiral MLP in library ``T`` (tapegrad or torch)."""
    X, y = spiral_data(batch)
    Xt, yt = T.tensor(X), T.tensor(y)
    model = _model(T, sizes)
    opt = T.optim.SGD(model.parameters(), lr=lr)
    F = T.nn.functional

    def step(x, t):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        return loss

    return step, model, (Xt, yt)


def main(argv=None):
    p = argparse.ArgumentParser(prog="tapegrad bench compile", description=__doc__)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="5 rounds")
    p.add_argument("--no-torch", action="store_true")
    args = p.parse_args(argv)
    import tapegrad

    torch = None if args.no_torch else harness.import_torch()
    rounds = 5 if args.quick else args.rounds
    sizes = (2, args.hidden, 3)
    with harness.Threads(args.threads, torch) as threads:
        harness.out(harness.header(threads, torch, f"compiled spiral step, 2->{args.hidden}->3, "
                                                   f"batch {args.batch}, float64, SGD"))
        eager, _, data = make_step(tapegrad, sizes, args.batch)
        raw, model, cdata = make_step(tapegrad, sizes, args.batch)
        t0 = time.perf_counter()
        compiled = tapegrad.compile(raw)
        compiled(*cdata)
        cold = time.perf_counter() - t0
        compiled(*cdata)  # the second graph (gradients present at the call)
        raw2, _, cdata2 = make_step(tapegrad, sizes, args.batch)
        compiled2 = tapegrad.compile(raw2)
        t0 = time.perf_counter()
        compiled2(*cdata2)
        warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        compiled2(*cdata2)
        second = time.perf_counter() - t0
        cases = [harness.Case("tapegrad compiled", lambda: compiled(*cdata)),
                 harness.Case("tapegrad eager", lambda: eager(*data))]
        if torch is not None:
            tstep, _, tdata = make_step(torch, sizes, args.batch)
            cases += harness.torch_cases("PyTorch eager", lambda: (lambda: tstep(*tdata)),
                                         threads, args.threads)
        harness.interleave(cases, threads, rounds=rounds)
        ref = harness.best(cases[2:]) if torch is not None else cases[1]
        rows = []
        for c in cases[:2] + ([ref] if torch is not None else []):
            rows.append([c.label, harness.fmt_us(harness.median(c)),
                         f"{harness.median(ref) / harness.median(c):.2f}x",
                         f"{harness.spread(c):.0%}"])
        harness.out(harness.table(rows, ["step", "us/step", "vs PyTorch eager", "spread"]))
        harness.out(f"compile time: cold {cold * 1e3:.1f} ms (first call: trace + passes + "
                    f"codegen + the eager step itself), warm {warm * 1e3:.1f} ms (a new "
                    f"compiled function, modules imported), second guard set "
                    f"{second * 1e3:.1f} ms")
        e = compiled.entries[-1]
        harness.out("graph: " + ", ".join(f"{name} {a}->{b}" for name, a, b in e.log)
                    + f"; fused kernels: {e.graph.count('fused')}")
        hit = compiled.n_hits
        harness.out(f"cache: {len(compiled.entries)} graphs, {hit} hits of "
                    f"{compiled.n_calls} calls")
    return 0


if __name__ == "__main__":
    main()
