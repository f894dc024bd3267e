"""``tapegrad.autograd``: backward, grad, user Functions, gradcheck, anomaly detection."""
from tapegrad.backend import xp
from tapegrad.autograd import engine
from tapegrad.autograd.engine import Node, run_backward, toposort
from tapegrad.autograd.grad_mode import (no_grad, enable_grad, set_grad_enabled,
                                         inference_mode, is_grad_enabled)


def _root_grads(name, outputs, grad_outputs, create_graph):
    from tapegrad.tensor import Tensor
    from tapegrad.backend import xp

    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    if len(grad_outputs) != len(outputs):
        raise RuntimeError(f"{name}: got {len(grad_outputs)} gradients for {len(outputs)} "
                           "outputs")
    grads = []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs)):
        if not isinstance(out, Tensor):
            raise TypeError(f"{name}: expected Tensor outputs, got {type(out).__name__}")
        if not out._requires_grad:
            raise RuntimeError(
                f"{name}: element 0 of tensors does not require grad and does not have a "
                "grad_fn")
        if g is None:
            if out._data.size != 1:
                raise RuntimeError(
                    f"{name}: grad can be implicitly created only for scalar outputs (got "
                    f"shape {tuple(out.shape)}); pass gradient=")
            g = xp.ones_like(out._data)
        else:
            if not isinstance(g, Tensor):
                g = Tensor._from_data(g)
            if g._data.shape != out._data.shape:
                raise RuntimeError(
                    f"{name}: Mismatch in shape: grad_output[{i}] has a shape of "
                    f"{tuple(g.shape)} and output[{i}] has a shape of {tuple(out.shape)}.")
            if g._data.dtype != out._data.dtype:  # as PyTorch: cast to the output's dtype,
                g = g.to(out.dtype)               # so no gradient changes dtype on the way
            if create_graph:  # keep its graph: grad of grad flows
                grads.append(g)
                continue
            g = g._data
        grads.append(Tensor._make(g) if create_graph else g)
    if create_graph and engine.WATCH:  # ones made from the outputs' shapes: graph constants
        m = engine.observer("made_from_shapes")
        if m is not None:
            for g in grads:
                if not g._requires_grad:
                    m.made_from_shapes(g)
    return grads


def _as_list(x):
    from tapegrad.tensor import Tensor
    from tapegrad.backend import xp

    return [x] if isinstance(x, (Tensor, xp.ndarray)) else list(x)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """As ``torch.autograd.backward``: accumulate gradients into leaves' ``.grad``."""
    tensors = _as_list(tensors)
    if grad_tensors is not None:
        grad_tensors = _as_list(grad_tensors) if not isinstance(grad_tensors, list) \
            else grad_tensors
    if retain_graph is None:
        retain_graph = create_graph
    grads = _root_grads("backward", tensors, grad_tensors, create_graph)
    if inputs is not None:
        inputs = _as_list(inputs)
        found = run_backward(tensors, grads, retain_graph, create_graph, inputs=inputs)
        for t, g in zip(inputs, found):
            if g is None:
                continue
            if create_graph:
                t._grad = g if t._grad is None else t._grad + g
            elif t._grad is None:
                t._grad = engine.Tensor._make(xp.array(g))
            else:
                t._grad._data += g
            if engine.POST_HOOKS and t.grad_fn is None:
                engine.run_post_accumulate_hooks(t)
        return
    run_backward(tensors, grads, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=None, materialize_grads=False):
    """As ``torch.autograd.grad``: the gradients of ``outputs`` w.r.t. ``inputs``.

    >>> x = tapegrad.tensor(3.0, requires_grad=True)
    >>> (g,) = tapegrad.autograd.grad(x * x, x, create_graph=True)   # 6, with a graph
    """
    outputs = _as_list(outputs)
    single = not isinstance(inputs, (list, tuple))
    inputs = _as_list(inputs)
    if grad_outputs is not None:
        grad_outputs = _as_list(grad_outputs)
    for t in inputs:
        if not t._requires_grad:
            raise RuntimeError("grad: one of the differentiated Tensors does not require grad")
    if retain_graph is None:
        retain_graph = create_graph
    grads = _root_grads("grad", outputs, grad_outputs, create_graph)
    found = run_backward(outputs, grads, retain_graph, create_graph, inputs=inputs)
    result = []
    for i, (t, g) in enumerate(zip(inputs, found)):
        if g is None:
            if materialize_grads:
                from tapegrad.backend import xp

                g = xp.zeros_like(t._data)
                g = engine.Tensor._make(g) if create_graph else g
            elif not allow_unused:
                raise RuntimeError(
                    f"grad: one of the differentiated Tensors (input {i}, shape "
                    f"{tuple(t.shape)}) appears to not have been used in the graph. Set "
                    "allow_unused=True if this is the desired behavior.")
            else:
                result.append(None)
                continue
        result.append(g if create_graph else engine.Tensor._make(g))
    return tuple(result)


__all__ = ["Node", "backward", "grad", "toposort", "no_grad", "enable_grad",
           "set_grad_enabled", "inference_mode", "is_grad_enabled", "run_backward"]

from tapegrad.autograd.gradcheck import gradcheck, gradgradcheck, GradcheckError  # noqa: E402

__all__ += ["gradcheck", "gradgradcheck", "GradcheckError"]

from tapegrad.autograd.anomaly import (detect_anomaly, set_detect_anomaly,  # noqa: E402
                                       is_anomaly_enabled, is_anomaly_check_nan_enabled)

__all__ += ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
            "is_anomaly_check_nan_enabled"]

from tapegrad.autograd.function import Function, FunctionCtx, once_differentiable  # noqa: E402,F401
from tapegrad.autograd import function  # noqa: E402,F401

__all__ += ["Function", "FunctionCtx"]
