"""As ``torch.func``: composable function transforms.

``grad``, ``grad_and_value``, ``vjp``, ``jvp`` (true forward mode), ``linearize``,
``jacrev``, ``jacfwd``, ``hessian``, ``hvp``, ``vmap``, ``functional_call``,
``stack_module_state``, and JAX's ``check_grads``. Each transform is an interpreter on the
per-thread DispatchMode stack (forward mode, vmap) or the tape (reverse mode), so they nest in
any order: ``vmap(grad(f))``, ``jacfwd(jacrev(f))``, ``jvp(grad(f))``, ``grad(grad(f))``.
"""
import contextlib

from tapegrad.func._forward import ForwardLevel, fallback_ops as jvp_fallback_ops
from tapegrad.func._transforms import (grad, grad_and_value, vjp, jvp, linearize, jacrev,
                                       jacfwd, hessian, hvp)
from tapegrad.func._vmap import vmap, VmapLevel
from tapegrad.func import _batching
from tapegrad.func._batching import rules as batch_rule_ops


@contextlib.contextmanager
def _swapped(module, tensors, tie_weights):
    """Temporarily replace ``module``'s named parameters and buffers by ``tensors``."""
    saved = []
    try:
        for name, value in tensors.items():
            *path, leaf = name.split(".")
            mod = module
            for p in path:
                mod = getattr(mod, p)
            d = mod.__dict__
            if leaf in d.get("_parameters", {}):
                table = d["_parameters"]
            elif leaf in d.get("_buffers", {}):
                table = d["_buffers"]
            else:
                raise AttributeError(f"functional_call: the module has no parameter or buffer "
                                     f"named '{name}'")
            saved.append((table, leaf, table[leaf]))
            table[leaf] = value
        yield
    finally:
        for table, leaf, old in reversed(saved):
            table[leaf] = old


def functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *,
                    tie_weights=True, strict=False):
    """As ``torch.func.functional_call``: run ``module`` with its parameters and buffers
    replaced by the given tensors (a dict, or a tuple of dicts).

    >>> params = {k: v.detach() for k, v in model.named_parameters()}
    >>> grad(lambda p, x: functional_call(model, p, (x,)).sum())(params, x)
    """
    dicts = parameter_and_buffer_dicts
    if isinstance(dicts, dict):
        merged = dict(dicts)
    else:
        merged = {}
        for d in dicts:
            for k, v in d.items():
                if k in merged:
                    raise ValueError(f"functional_call: {k} appeared in multiple dictionaries; "
                                     "behavior of functional call is ambiguous")
                merged[k] = v
    if strict:
        expected = {k for k, _ in module.named_parameters()} | \
                   {k for k, _ in module.named_buffers()}
        missing, unexpected = expected - set(merged), set(merged) - expected
        if missing or unexpected:
            raise RuntimeError(f"functional_call: Error(s) in reparametrizing for "
                               f"{type(module).__name__}: missing keys {sorted(missing)}, "
                               f"unexpected keys {sorted(unexpected)}")
    if args is None:
        args = ()
    elif not isinstance(args, tuple):
        args = (args,)
    with _swapped(module, merged, tie_weights):
        return module(*args, **(kwargs or {}))


def stack_module_state(models):
    """As ``torch.func.stack_module_state``: ``(params, buffers)``, each a dict of the
    models' tensors stacked along a new leading dim (for ``vmap`` over an ensemble)."""
    from tapegrad.ops.movement import stack

    models = list(models)
    if not models:
        raise RuntimeError("stack_module_state: Expected at least one model, got 0.")
    if not (all(m.training for m in models) or not any(m.training for m in models)):
        raise RuntimeError("stack_module_state: Expected all models to have the same training/"
                           "eval mode.")
    kinds = {type(m) for m in models}
    if len(kinds) != 1:
        raise RuntimeError("stack_module_state: Expected all models to be of the same class.")
    params = {k: stack([dict(m.named_parameters())[k] for m in models]).detach()
              for k, _ in models[0].named_parameters()}
    for v in params.values():
        v.requires_grad_(True)
    buffers = {k: stack([dict(m.named_buffers())[k] for m in models]).detach()
               for k, _ in models[0].named_buffers()}
    return params, buffers


def check_grads(f, args, order=2, modes=("fwd", "rev"), eps=1e-6, atol=1e-5, rtol=1e-3):
    """As ``jax.test_util.check_grads``: check ``f``'s derivatives up to ``order`` against
    central differences, in forward mode (``jvp``) and/or reverse mode (``vjp``) along random
    directions; raises AssertionError naming the mode and order that disagree.

    >>> check_grads(lambda x: (x.sin() * x).sum(), (x,), order=2)
    """
    from tapegrad.func._check import check_grads as impl

    return impl(f, args, order, modes, eps, atol, rtol)


__all__ = ["grad", "grad_and_value", "vjp", "jvp", "linearize", "jacrev", "jacfwd", "hessian",
           "hvp", "vmap", "functional_call", "stack_module_state", "check_grads",
           "ForwardLevel", "VmapLevel", "jvp_fallback_ops", "batch_rule_ops"]
