"""Agreement with PyTorch as a user tool: ``verify`` and ``first_divergence``.

    report = tapegrad.testing.verify(model, [x], torch_model=torch_model, steps=5)
    print(report)            # outputs, gradients, a 5-step SGD trajectory: max errors
    assert report.ok

    where = tapegrad.testing.first_divergence(model, torch_model, [x])
    print(where)             # the first module whose output (or gradient) disagrees

Both sides start from the same weights (the tapegrad model's ``state_dict`` is loaded into
the PyTorch model) and the same inputs. A non-scalar output is reduced to a loss as
``sum(output * v)`` with one fixed random ``v``, so every output element gets a gradient.
Gradients are compared for every parameter (by name) and every floating input. The
trajectory runs ``steps`` plain SGD steps (``lr``) on both sides and compares each step's
loss and the final parameters.

``first_divergence`` first compares *ops*: one forward on each side with every op call
recorded (tapegrad: an op watcher; PyTorch: a ``TorchFunctionMode``, so ``F.softmax``,
``x.var``, ``x @ w`` are calls whether or not a module wraps them), each call keyed by the
user's source line that made it (the innermost frame outside both frameworks). Calls pair
within runs of one line (the n-th run of a line with its n-th run on the other side; when the
two sides share no line, as a port in its own file, the runs pair in order): runs of equal
length call by call, others by their last result. The first tapegrad op whose output differs
is reported with its PyTorch counterpart, the line, the innermost module running it and
whether its inputs agreed. If every op agrees, it hooks every submodule on both sides (forward
hooks for outputs, full backward hooks for gradients), runs one forward and backward, and
walks the records in the
order they were made: the forward outputs as modules finish (an inner module before the
module around it, so the innermost culprit comes first), then the gradients from the output
back. It names the first module that disagrees beyond tolerance and says whether its inputs
(or, for a gradient, the gradient coming into it) agreed: if they did, the module itself
computes something else.

A plain function can be verified too: ``verify(fn, inputs)`` calls ``fn(T, *inputs)`` with
``T`` = tapegrad, then ``T`` = torch (the API contract: ``import tapegrad as torch``), or
``fn(*inputs)`` against ``torch_model(*inputs)`` when a torch function is given.
"""
import contextlib
import linecache
import os
import sys

import numpy as np

import tapegrad
from tapegrad.autograd.engine import add_watcher, remove_watcher


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _numpy(x):
    if isinstance(x, tapegrad.Tensor):
        return x.detach().numpy()
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _flat(x):
    if isinstance(x, (tuple, list)):
        return [a for item in x for a in _flat(item)]
    if isinstance(x, dict):
        return [a for item in x.values() for a in _flat(item)]
    return [x] if x is not None and hasattr(x, "shape") else []


def max_error(a, b):
    """(max abs error, max error relative to the reference's largest magnitude)."""
    a, b = _numpy(a).astype(np.float64), _numpy(b).astype(np.float64)
    if a.shape != b.shape:
        return float("inf"), float("inf")
    if a.size == 0:
        return 0.0, 0.0
    err = float(np.max(np.abs(a - b)))
    scale = float(np.max(np.abs(b)))
    return err, err / scale if scale else err


class Agreement:
    """One compared quantity: a name, the max abs and relative errors, and the verdict."""

    __slots__ = ("name", "abs_error", "rel_error", "ok")

    def __init__(self, name, pairs, atol, rtol):
        errs = [max_error(a, b) for a, b in pairs]
        self.name = name
        self.abs_error = max((e[0] for e in errs), default=0.0)
        self.rel_error = max((e[1] for e in errs), default=0.0)
        self.ok = all(e[0] <= atol or e[1] <= rtol for e in errs) and bool(pairs)

    def __repr__(self):
        return (f"{self.name:<32} abs {self.abs_error:.2e}  rel {self.rel_error:.2e}  "
                f"{'ok' if self.ok else 'DIFFERS'}")


class Report:
    """``verify``'s result: ``outputs``, ``gradients`` and ``trajectory`` rows; ``ok``."""

    def __init__(self, rows, skipped=None):
        self.rows, self.skipped = rows, skipped

    @property
    def ok(self):
        return self.skipped is None and all(r.ok for r in self.rows)

    def __getitem__(self, name):
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def __str__(self):
        if self.skipped:
            return f"verify: skipped ({self.skipped})"
        return "\n".join(map(repr, self.rows)) + f"\n{'agree' if self.ok else 'DISAGREE'}"


def _reducer(output, seed):
    out = _numpy(output)
    if out.ndim == 0:
        return None
    return np.random.default_rng(seed).standard_normal(out.shape).astype(out.dtype)


def _loss(T, output, v):
    if v is None:
        return output
    return (output * T.tensor(v)).sum()


class _Side:
    """One framework's run: ``T`` the namespace, ``call`` the model or function."""

    def __init__(self, T, call, module, inputs):
        self.T, self.call, self.module = T, call, module
        self.inputs = [T.tensor(np.array(a), requires_grad=np.asarray(a).dtype.kind == "f")
                       if isinstance(a, np.ndarray) else a for a in inputs]

    def parameters(self):
        return dict(self.module.named_parameters()) if self.module is not None else {}

    def forward(self):
        return self.call(*self.inputs)


def _sides(model_or_fn, inputs, torch_model):
    torch = _torch()
    arrays = [_numpy(a) if hasattr(a, "shape") else a for a in inputs]
    if isinstance(model_or_fn, tapegrad.nn.Module):
        if torch_model is None:
            raise ValueError("verify: a tapegrad module needs torch_model, the PyTorch module "
                             "it ports (same structure and parameter names)")
        state = {k: torch.tensor(_numpy(v)) for k, v in model_or_fn.state_dict().items()}
        torch_model.load_state_dict(state)
        return (_Side(tapegrad, model_or_fn, model_or_fn, arrays),
                _Side(torch, torch_model, torch_model, arrays))
    if torch_model is None:
        return (_Side(tapegrad, lambda *a: model_or_fn(tapegrad, *a), None, arrays),
                _Side(torch, lambda *a: model_or_fn(torch, *a), None, arrays))
    return (_Side(tapegrad, model_or_fn, None, arrays), _Side(torch, torch_model, None, arrays))


def verify(model_or_fn, inputs, torch_model=None, steps=0, lr=1e-2, atol=1e-9, rtol=1e-7,
           seed=0):
    """Run ``model_or_fn`` in tapegrad and PyTorch from the same weights and inputs and report
    the agreement of outputs, gradients (parameters and floating inputs) and a ``steps``-step
    SGD trajectory. Without PyTorch installed, the report says it was skipped."""
    if _torch() is None:
        return Report([], skipped="PyTorch is not installed")
    ours, theirs = _sides(model_or_fn, inputs, torch_model)
    out_a, out_b = ours.forward(), theirs.forward()
    rows = [Agreement("output", list(zip(_flat(out_a), _flat(out_b))), atol, rtol)]
    first_a, first_b = _flat(out_a)[0], _flat(out_b)[0]
    v = _reducer(first_b, seed)
    _loss(tapegrad, first_a, v).backward()
    _loss(theirs.T, first_b, v).backward()
    pa, pb = ours.parameters(), theirs.parameters()
    for name in pb:
        if name in pa:
            rows.append(Agreement(f"grad {name}", [(pa[name].grad, pb[name].grad)], atol, rtol))
    for i, (a, b) in enumerate(zip(ours.inputs, theirs.inputs)):
        if getattr(b, "grad", None) is not None:
            rows.append(Agreement(f"grad input {i}", [(a.grad, b.grad)], atol, rtol))
    if steps:
        losses = []
        for side in (ours, theirs):
            params = list(side.parameters().values()) or [
                x for x in side.inputs if getattr(x, "requires_grad", False)]
            side_losses = []
            for _ in range(steps):
                for p in params:
                    p.grad = None
                loss = _loss(side.T, _flat(side.forward())[0], v)
                loss.backward()
                side_losses.append(_numpy(loss))
                with side.T.no_grad():
                    for p in params:
                        p -= lr * p.grad
            losses.append(side_losses)
        rows.append(Agreement(f"trajectory: loss over {steps} steps",
                              list(zip(*losses)), atol, rtol))
        rows.append(Agreement(f"trajectory: parameters after {steps} steps",
                              [(pa[n], pb[n]) for n in pb if n in pa]
                              or list(zip(ours.inputs, theirs.inputs)), atol, rtol))
    return Report(rows)


# --- first divergence ------------------------------------------------------------------
class Divergence:
    """Where two runs first disagree: ``module`` (its qualified name; for an op, the innermost
    module running it, "" for the root or a plain function), ``kind`` ("op", "output" or
    "gradient"), ``error`` (max abs), ``inputs_agree`` and ``input_error``; for an op also
    ``op`` (tapegrad's op), ``torch_op`` (the PyTorch function) and ``line`` (``file:line:
    source`` of the user's code that called it). Falsy when everything agrees."""

    def __init__(self, module=None, kind=None, error=0.0, inputs_agree=None, input_error=0.0,
                 checked=0, op=None, torch_op=None, line=None):
        self.module, self.kind, self.error = module, kind, error
        self.inputs_agree, self.input_error, self.checked = inputs_agree, input_error, checked
        self.op, self.torch_op, self.line = op, torch_op, line

    def __bool__(self):
        return self.kind is not None

    def __str__(self):
        if self.kind is None:
            return f"no divergence: {self.checked} op and module outputs and gradients agree"
        if self.inputs_agree is None:
            cause = "its inputs could not be paired"
        elif self.inputs_agree:
            cause = f"its inputs agree: this {'op' if self.kind == 'op' else 'module'} " \
                "computes something else"
        else:
            cause = f"its inputs already differ (max abs {self.input_error:.2e}): look upstream"
        if self.kind == "op":
            where = f" in module {self.module!r}" if self.module else ""
            return (f"first divergence: op {self.op!r} (PyTorch {self.torch_op}){where}, "
                    f"output differs by {self.error:.2e}; {cause}\n    at {self.line}")
        what = "output" if self.kind == "output" else "gradient (w.r.t. its input)"
        return (f"first divergence: module {self.module or '(root)'!r}, {what} differs by "
                f"{self.error:.2e}; {cause}")

    __repr__ = __str__


def _track_modules(module, stack):
    """Keep ``stack`` as the names of the modules running (innermost last); the handles."""
    def leave(mod, args, out, name):
        if stack and stack[-1] == name:
            stack.pop()

    handles = []
    for name, m in (module.named_modules() if module is not None else ()):
        handles.append(m.register_forward_pre_hook(
            lambda mod, args, name=name: stack.append(name) and None))
        handles.append(m.register_forward_hook(
            lambda mod, args, out, name=name: leave(mod, args, out, name)))
    return handles


def _record(module):
    """Hook every submodule; returns (forward records, backward records, handles)."""
    forward, backward, handles = [], [], []
    if module is None:
        return forward, backward, handles
    for name, m in module.named_modules():
        def fwd(mod, args, out, name=name):
            forward.append((name, [_numpy(a) for a in _flat(args)],
                            [_numpy(o) for o in _flat(out)]))

        def bwd(mod, grad_input, grad_output, name=name):
            backward.append((name, [_numpy(g) for g in _flat(grad_output)],
                             [_numpy(g) for g in _flat(grad_input)]))

        handles.append(m.register_forward_hook(fwd))
        handles.append(m.register_full_backward_hook(bwd))
    return forward, backward, handles


def _agree(xs, ys, atol, rtol):
    if len(xs) != len(ys):
        return False, float("inf")
    errs = [max_error(a, b) for a, b in zip(xs, ys)]
    return all(e[0] <= atol or e[1] <= rtol for e in errs), max((e[0] for e in errs),
                                                                default=0.0)


# --- ops: every op call on both sides, keyed by the user's source line ------------------------
_TAPEGRAD_DIR = os.path.dirname(os.path.abspath(__file__))


def _site(skip):
    """``(file, line)`` of the innermost frame outside the directories ``skip``."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename
        if not path.startswith(skip):
            return path, f.f_lineno
        f = f.f_back
    return None


class _OpCall:
    __slots__ = ("name", "site", "module", "inputs", "outputs")

    def __init__(self, name, site, module, inputs, outputs):
        self.name, self.site, self.module = name, site, module
        self.inputs, self.outputs = inputs, outputs

    def line(self):
        if self.site is None:
            return "(no source line outside the frameworks)"
        path, lineno = self.site
        return f"{path}:{lineno}: {linecache.getline(path, lineno).strip()}"


class _TapegradOps:
    """An op watcher (``autograd.engine.add_watcher``): every op this thread dispatches."""

    def __init__(self, stack):
        self.calls, self.stack = [], stack
        self.skip = (_TAPEGRAD_DIR, os.path.dirname(contextlib.__file__))

    def before_op(self, op):
        pass

    def after_op(self, op, args, out):
        arrays = [_numpy(a) for a in _flat(args) if isinstance(a, tapegrad.Tensor)]
        outs = [_numpy(o) for o in _flat(out) if isinstance(o, tapegrad.Tensor)]
        if outs:
            self.calls.append(_OpCall(op.name, _site(self.skip), self.stack[-1] if self.stack
                                      else "", arrays, outs))

    def before_backward(self, node):
        pass

    def after_backward(self, node, grads):
        pass


def _torch_ops(torch, stack):
    """A ``TorchFunctionMode`` recording every torch function call that returns tensors."""
    from torch.overrides import TorchFunctionMode, resolve_name

    skip = (os.path.dirname(os.path.abspath(torch.__file__)), _TAPEGRAD_DIR,
            os.path.dirname(contextlib.__file__))

    class Ops(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls = []
            self.busy = False  # reading a result back (detach, cpu) is no call of the model's

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = resolve_name(func) or getattr(func, "__name__", repr(func))
            if self.busy or name.endswith("__get__"):
                return out
            self.busy = True
            try:
                outs = [_numpy(o) for o in _flat(out) if isinstance(o, torch.Tensor)]
                if outs:
                    arrays = [_numpy(a) for a in _flat(list(args) + list((kwargs or {}).values()))
                              if isinstance(a, torch.Tensor)]
                    self.calls.append(_OpCall(name, _site(skip), stack[-1] if stack else "",
                                              arrays, outs))
            finally:
                self.busy = False
            return out

    return Ops()


def _line_groups(calls):
    """Runs of consecutive calls from one source line, keyed by (line, n-th run of it)."""
    groups, seen = [], {}
    for c in calls:
        if groups and groups[-1][1][-1].site == c.site:
            groups[-1][1].append(c)
            continue
        k = seen[c.site] = seen.get(c.site, -1) + 1
        groups.append(((c.site, k), [c]))
    return groups


def _first_op_divergence(ours, theirs, atol, rtol):
    """The first tapegrad op call whose output disagrees with its PyTorch counterpart: calls
    are paired within runs of one source line (the n-th run of a line with the n-th run on
    the other side); runs of equal length pair call by call, others by their last result
    (the line's value). When no line is shared (a port in its own source file), the runs
    pair in order. Returns ``(Divergence or None, calls compared)``."""
    ours_g, theirs_g = _line_groups(ours), _line_groups(theirs)
    theirs_by_key = dict(theirs_g)
    if not any(key in theirs_by_key for key, _ in ours_g):
        pairs_of_runs = [(a, b) for (_, a), (_, b) in zip(ours_g, theirs_g)]
    else:
        pairs_of_runs = [(group, theirs_by_key.get(key)) for key, group in ours_g
                         if key[0] is not None]
    checked = 0
    for group, other in pairs_of_runs:
        if other is None:
            continue
        pairs = list(zip(group, other)) if len(group) == len(other) else [(group[-1],
                                                                           other[-1])]
        for a, b in pairs:
            checked += 1
            ok, err = _agree(a.outputs[:1], b.outputs[:1], atol, rtol)
            if not ok:
                ins_ok, ins_err = (_agree(a.inputs, b.inputs, atol, rtol)
                                   if len(a.inputs) == len(b.inputs) else (None, 0.0))
                return Divergence(a.module, "op", err, ins_ok, ins_err, checked, op=a.name,
                                  torch_op=b.name, line=a.line()), checked
    return None, checked


def first_divergence(model, torch_model, inputs, atol=1e-9, rtol=1e-7, seed=0):
    """The first op, then module (forward outputs, then gradients), where ``model``
    (tapegrad) and ``torch_model`` (its PyTorch port, same structure) disagree; see the module
    docstring. ``model`` may be a function ``fn(T, *inputs)`` written against the namespace
    (``torch_model`` None) or a tapegrad function with its torch twin, as in ``verify``: then
    only its ops are compared."""
    torch = _torch()
    if torch is None:
        raise RuntimeError("first_divergence: PyTorch is not installed")
    ours, theirs = _sides(model, inputs, torch_model)
    op_calls = []
    for side in (ours, theirs):  # a forward with every op call recorded
        stack = []
        handles = _track_modules(side.module, stack)
        watcher = _TapegradOps(stack) if side is ours else _torch_ops(torch, stack)
        try:
            if side is ours:
                add_watcher(watcher)
                try:
                    side.forward()
                finally:
                    remove_watcher(watcher)
            else:
                with watcher:
                    side.forward()
        finally:
            for h in handles:
                h.remove()
        op_calls.append(watcher.calls)
    found, checked = _first_op_divergence(op_calls[0], op_calls[1], atol, rtol)
    if found is not None:
        return found
    records = []
    for side in (ours, theirs):  # modules: outputs, then gradients
        fwd, bwd, handles = _record(side.module)
        try:
            out = _flat(side.forward())[0]
            v = _reducer(out, seed)
            _loss(side.T, out, v).backward()
        finally:
            for h in handles:
                h.remove()
        records.append((fwd, bwd))
    (fa, ba), (fb, bb) = records
    for (name, ins_a, outs_a), (name_b, ins_b, outs_b) in zip(fa, fb):
        if name != name_b:
            raise RuntimeError(f"first_divergence: the models run different modules "
                               f"({name!r} vs {name_b!r}): they must have the same structure")
        checked += 1
        ok, err = _agree(outs_a, outs_b, atol, rtol)
        if not ok:
            ins_ok, ins_err = _agree(ins_a, ins_b, atol, rtol)
            return Divergence(name, "output", err, ins_ok, ins_err, checked)
    for (name, gout_a, gin_a), (_, gout_b, gin_b) in zip(ba, bb):
        checked += 1
        ok, err = _agree(gin_a, gin_b, atol, rtol)
        if not ok:
            gout_ok, gout_err = _agree(gout_a, gout_b, atol, rtol)
            return Divergence(name, "gradient", err, gout_ok, gout_err, checked)
    return Divergence(checked=checked)


__all__ = ["verify", "first_divergence", "Report", "Agreement", "Divergence", "max_error"]
