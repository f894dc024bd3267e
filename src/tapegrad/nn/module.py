"""``nn.Module``: the base of every layer: parameters, buffers, submodules, state dicts, hooks.

Behaviour follows ``torch.nn.Module``: attribute assignment routes Parameters, Modules and
buffers into ``_parameters``/``_modules``/``_buffers``; ``state_dict`` keys and their order
are PyTorch's for the same module tree; ``repr`` prints the tree as PyTorch does. One
deliberate strengthening: ``load_state_dict`` validates everything first and copies
nothing when it raises (PyTorch may have copied part of the state by then).
"""
import functools
import itertools
import threading
import warnings
from collections import OrderedDict, namedtuple
from collections.abc import Mapping

from tapegrad import dtypes
from tapegrad.autograd import engine as _engine
from tapegrad.autograd.function import Function
from tapegrad.autograd.grad_mode import no_grad, state as grad_state
from tapegrad.backend.device import device as device_type, no_cuda
from tapegrad.nn.parameter import Buffer, Parameter
from tapegrad.tensor import Tensor, _to_target

__all__ = ["Module", "RemovableHandle"]


# A number that moves whenever any Module's attributes, parameters, buffers, children or
# hooks change through these methods (set, delete, register, a hook handle made or removed):
# a compiled function re-checks the modules it reads only when it moved since its last check.
MODULE_EPOCH = [0]
_next_epoch = itertools.count(1).__next__  # (one C call: two threads never take one number)


def _bumps_epoch(method):
    @functools.wraps(method)
    def bumped(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        finally:
            MODULE_EPOCH[0] = _next_epoch()

    return bumped


class RemovableHandle:
    """As ``torch.utils.hooks.RemovableHandle``: ``handle.remove()`` unregisters a hook."""

    next_id = 0

    @_bumps_epoch
    def __init__(self, hooks_dict, *, extra_dict=None):
        self.hooks_dict = hooks_dict
        self.id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        if extra_dict is None:
            extra_dict = []
        self.extra_dicts = [extra_dict] if isinstance(extra_dict, dict) else list(extra_dict)

    @_bumps_epoch
    def remove(self) -> None:
        for d in [self.hooks_dict, *self.extra_dicts]:
            d.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _addindent(s, num_spaces):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    rest = [(num_spaces * " ") + line if line.strip() else "" for line in lines]
    return first + "\n" + "\n".join(rest)


def _typename(value):
    if isinstance(value, Tensor):
        return "tapegrad." + type(value).__name__
    module = type(value).__module__
    name = type(value).__qualname__
    return name if module == "builtins" else f"{module}.{name}"


def _cast(t, dtype):
    """``t`` as ``dtype`` (floating tensors only; others are returned unchanged)."""
    if dtype is None or not t.dtype.is_floating_point or t.dtype is dtype:
        return t
    return Tensor._make(t._data.astype(dtype.np))


def _copy_into(dst, src):
    """``dst.copy_(src)`` without recording: write in place and bump the version counter."""
    dst._data[...] = src._data
    dst._version[0] += 1


_EXTRA_STATE = "_extra_state"


class _Loading(threading.local):
    copies = None  # the queue of a load_state_dict in progress (per thread)


_loading = _Loading()


def _forward_unimplemented(self, *input):
    raise NotImplementedError(
        f'Module [{type(self).__name__}] is missing the required "forward" function')


class Module:
    """As ``torch.nn.Module``: subclass it, create layers in ``__init__``, define ``forward``.

    >>> class MLP(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(4, 2)
    ...     def forward(self, x):
    ...         return self.fc(x).relu()
    """

    _version = 1
    training: bool
    call_super_init = False

    def __init__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword "
                            f"argument '{next(iter(kwargs))}'")
        if args:
            raise TypeError(f"{type(self).__name__}.__init__() takes 1 positional argument "
                            f"but {len(args) + 1} were given")
        set_ = super().__setattr__
        set_("training", True)
        set_("_parameters", {})
        set_("_buffers", {})
        set_("_non_persistent_buffers_set", set())
        set_("_backward_hooks", OrderedDict())
        set_("_backward_pre_hooks", OrderedDict())
        set_("_forward_hooks", OrderedDict())
        set_("_forward_hooks_with_kwargs", OrderedDict())
        set_("_forward_hooks_always_called", OrderedDict())
        set_("_forward_pre_hooks", OrderedDict())
        set_("_forward_pre_hooks_with_kwargs", OrderedDict())
        set_("_state_dict_hooks", OrderedDict())
        set_("_state_dict_pre_hooks", OrderedDict())
        set_("_load_state_dict_pre_hooks", OrderedDict())
        set_("_load_state_dict_post_hooks", OrderedDict())
        set_("_modules", {})

    forward = _forward_unimplemented

    # --- registration -----------------------------------------------------------------
    @_bumps_epoch
    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """As ``Module.register_buffer``: state that is not a parameter (e.g. running_mean).

        Non-persistent buffers are left out of ``state_dict``.
        """
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"buffer name should be a string. Got {_typename(name)}")
        if "." in name:
            raise KeyError('buffer name can\'t contain "."')
        if name == "":
            raise KeyError('buffer name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{_typename(tensor)}' object to buffer '{name}' "
                            "(tapegrad Tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    @_bumps_epoch
    def register_parameter(self, name: str, param) -> None:
        """As ``Module.register_parameter``: ``param`` is a ``Parameter`` or None."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"parameter name should be a string. Got {_typename(name)}")
        if "." in name:
            raise KeyError('parameter name can\'t contain "."')
        if name == "":
            raise KeyError('parameter name can\'t be empty string ""')
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is None:
            self._parameters[name] = None
        elif not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{_typename(param)}' object to parameter '{name}' "
                            "(tapegrad.nn.Parameter or None required)")
        elif param.grad_fn is not None:
            raise ValueError(
                f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                f"created explicitly. To express '{name}' as a function of another Tensor, "
                "compute the value in the forward() method.")
        else:
            self._parameters[name] = param

    @_bumps_epoch
    def add_module(self, name: str, module) -> None:
        """As ``Module.add_module``: register ``module`` as the child ``name``."""
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{_typename(module)} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {_typename(name)}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        self._modules[name] = module

    def register_module(self, name: str, module) -> None:
        """Alias of ``add_module``."""
        self.add_module(name, module)

    def get_submodule(self, target: str) -> "Module":
        """As ``Module.get_submodule("block.0.fc")``."""
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError("`" + item + "` is not an nn.Module")
        return mod

    def get_parameter(self, target: str) -> Parameter:
        """As ``Module.get_parameter("block.0.fc.weight")``."""
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        param = getattr(mod, name)
        if not isinstance(param, Parameter):
            raise AttributeError("`" + name + "` is not an nn.Parameter")
        return param

    def get_buffer(self, target: str) -> Tensor:
        """As ``Module.get_buffer("bn.running_mean")``."""
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        if name not in mod._buffers:
            raise AttributeError("`" + name + "` is not a buffer")
        return getattr(mod, name)

    # --- attribute routing ------------------------------------------------------------
    def __getattr__(self, name: str):
        d = self.__dict__
        if "_parameters" in d:
            if name in d["_parameters"]:
                return d["_parameters"][name]
            if name in d["_buffers"]:
                return d["_buffers"][name]
            if name in d["_modules"]:
                return d["_modules"][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    @_bumps_epoch
    def __setattr__(self, name: str, value) -> None:
        d = self.__dict__

        def remove_from(*dicts_or_sets):
            for s in dicts_or_sets:
                if name in s:
                    if isinstance(s, dict):
                        del s[name]
                    else:
                        s.discard(name)

        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(d, self._buffers, self._modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{_typename(value)}' as parameter '{name}' "
                                "(tapegrad.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        else:
            modules = d.get("_modules")
            if isinstance(value, Module):
                if modules is None:
                    raise AttributeError("cannot assign module before Module.__init__() call")
                remove_from(d, self._parameters, self._buffers, self._non_persistent_buffers_set)
                modules[name] = value
            elif modules is not None and name in modules:
                if value is not None:
                    raise TypeError(f"cannot assign '{_typename(value)}' as child module "
                                    f"'{name}' (tapegrad.nn.Module or None expected)")
                modules[name] = value
            else:
                buffers = d.get("_buffers")
                if isinstance(value, Buffer) or (buffers is not None and name in buffers):
                    if value is not None and not isinstance(value, Tensor):
                        raise TypeError(f"cannot assign '{_typename(value)}' as buffer "
                                        f"'{name}' (tapegrad.nn.Buffer, tapegrad.Tensor or "
                                        "None expected)")
                    if isinstance(value, Buffer):
                        persistent = value.persistent
                    else:
                        persistent = name not in self._non_persistent_buffers_set
                    self.register_buffer(name, value, persistent)
                else:
                    super().__setattr__(name, value)

    @_bumps_epoch
    def __delattr__(self, name: str) -> None:
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            super().__delattr__(name)

    def __dir__(self):
        keys = (dir(self.__class__) + list(self.__dict__) + list(self._parameters)
                + list(self._modules) + list(self._buffers))
        return sorted(k for k in keys if not k[0].isdigit())

    # --- traversal --------------------------------------------------------------------
    def _named_members(self, get_members, prefix="", recurse=True, remove_duplicate=True):
        memo = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or id(v) in memo:
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield module_prefix + ("." if module_prefix else "") + k, v

    def parameters(self, recurse: bool = True):
        """As ``Module.parameters()``: each Parameter once, in registration order."""
        cls = type(self)
        if not recurse or cls.named_parameters is not Module.named_parameters or \
                cls.named_modules is not Module.named_modules:
            for _, param in self.named_parameters(recurse=recurse):
                yield param
            return
        # named_parameters' walk without its names (a training step calls this each step:
        # clip_grad_norm_(model.parameters())): preorder over the modules, each module and
        # each parameter once
        modules, params = set(), set()
        stack = [self]
        while stack:
            m = stack.pop()
            if m in modules:
                continue
            modules.add(m)
            for p in m._parameters.values():
                if p is not None and id(p) not in params:
                    params.add(id(p))
                    yield p
            kids = [c for c in m._modules.values() if c is not None]
            kids.reverse()
            stack += kids

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True):
        """As ``Module.named_parameters()``: ``("fc.weight", Parameter)`` pairs."""
        return self._named_members(lambda m: m._parameters.items(), prefix=prefix,
                                   recurse=recurse, remove_duplicate=remove_duplicate)

    def buffers(self, recurse: bool = True):
        """As ``Module.buffers()``."""
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True):
        """As ``Module.named_buffers()``: persistent and non-persistent buffers."""
        return self._named_members(lambda m: m._buffers.items(), prefix=prefix,
                                   recurse=recurse, remove_duplicate=remove_duplicate)

    def children(self):
        """As ``Module.children()``: the immediate submodules."""
        for _, module in self.named_children():
            yield module

    def named_children(self):
        """As ``Module.named_children()``."""
        memo = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in memo:
                memo.add(id(module))
                yield name, module

    def modules(self, remove_duplicate: bool = True):
        """As ``Module.modules()``: self first, then every submodule, depth first."""
        for _, module in self.named_modules(remove_duplicate=remove_duplicate):
            yield module

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        """As ``Module.named_modules()``: ``("", self)``, then ``("block.0", ...)`` ..."""
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            yield from module.named_modules(memo, prefix + ("." if prefix else "") + name,
                                            remove_duplicate)

    __hash__ = object.__hash__

    # --- modes, conversion ------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """As ``Module.train(mode=True)``: sets ``training`` here and in every submodule."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def eval(self) -> "Module":
        """As ``Module.eval()``: ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        """As ``Module.requires_grad_``: set ``requires_grad`` on every parameter."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    @_engine.hook_point
    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``Module.zero_grad(set_to_none=True)``."""
        if not set_to_none and _engine.WATCH and type(self).zero_grad is Module.zero_grad:
            m = _engine.observer("zero_grads")  # the compiler's tracer records the writes
            if m is not None:
                return m.zero_grads(self, Module._zero_grad, list(self.parameters()))
        self._zero_grad(set_to_none)

    def _zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                g = p.grad if p.grad.grad_fn is None else p.grad.detach()
                g._requires_grad = False
                g._data[...] = 0
                g._version[0] += 1
                p.grad = g

    def apply(self, fn) -> "Module":
        """As ``Module.apply(fn)``: ``fn(m)`` for every submodule (children first), then self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def _apply(self, fn, recurse=True):
        """Replace every parameter's and buffer's storage by ``fn(tensor)`` (in place)."""
        if recurse:
            for module in self.children():
                module._apply(fn)
        with no_grad():
            for param in self._parameters.values():
                if param is None:
                    continue
                param.data = fn(param)
                if param.grad is not None:
                    param.grad = fn(param.grad)
            for key, buf in self._buffers.items():
                if buf is not None:
                    self._buffers[key] = fn(buf)
        return self

    def to(self, *args, **kwargs) -> "Module":
        """As ``Module.to(dtype)``, ``.to(device)``, ``.to(tensor)``, ``.to(device, dtype)``.

        Only floating-point parameters and buffers change dtype, as in PyTorch.
        """
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"to() got an unexpected keyword argument '{next(iter(kwargs))}'")
        for a in args:
            if isinstance(a, Tensor):
                dtype = a.dtype
            elif isinstance(a, dtypes.dtype) or a in (float, int, bool):
                dtype = dtypes.to_dtype(a)
            elif isinstance(a, bool):
                continue  # non_blocking
            elif isinstance(a, int):
                device = device_type(a)  # an accelerator index
            elif a is not None:
                device = a
        dev = _to_target(device)  # cuda: through the CUDA backend, else PyTorch's CPU error
        if dtype is not None:
            dtype = dtypes.to_dtype(dtype)
            if not dtype.is_floating_point:
                raise TypeError("nn.Module.to only accepts floating point or complex dtypes, "
                                f"but got desired dtype={dtype}")
        return self._apply(lambda t: _cast(t if dev is None else t.to(dev), dtype))

    def cpu(self) -> "Module":
        """As ``Module.cpu()``: parameters and buffers copied to the cpu (a no-op there)."""
        return self._apply(lambda t: t.cpu())

    def cuda(self, device=None) -> "Module":
        """As ``Module.cuda()``: parameters and buffers copied to the CUDA device; raises as
        PyTorch's CPU-only build does without CuPy or a device."""
        if device is not None and not isinstance(device, (str, device_type)):
            device = f"cuda:{int(device)}"
        try:
            return self.to("cuda" if device is None else device)
        except AssertionError:
            raise no_cuda("cuda") from None

    def float(self) -> "Module":
        """As ``Module.float()``: floating parameters and buffers to float32."""
        return self._apply(lambda t: _cast(t, dtypes.float32))

    def double(self) -> "Module":
        """As ``Module.double()``: floating parameters and buffers to float64."""
        return self._apply(lambda t: _cast(t, dtypes.float64))

    def half(self) -> "Module":
        """As ``Module.half()``: floating parameters and buffers to float16."""
        return self._apply(lambda t: _cast(t, dtypes.float16))

    def bfloat16(self) -> "Module":
        """As ``Module.bfloat16()``."""
        if dtypes.bfloat16 is None:
            raise RuntimeError("bfloat16: needs the ml_dtypes package")
        return self._apply(lambda t: _cast(t, dtypes.bfloat16))

    def type(self, dst_type) -> "Module":
        """As ``Module.type(dst_type)``: cast every parameter and buffer to ``dst_type``."""
        dst = dtypes.to_dtype(dst_type)
        return self._apply(lambda t: t if t.dtype is dst else Tensor._make(t._data.astype(dst.np)))

    # --- calling and hooks ------------------------------------------------------------
    def register_forward_pre_hook(self, hook, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """As ``Module.register_forward_pre_hook``: ``hook(module, args)`` runs before forward.

        It may return replacement args (a tuple, or a single value that gets wrapped); with
        ``with_kwargs=True`` it is ``hook(module, args, kwargs)`` returning ``(args, kwargs)``.
        """
        handle = RemovableHandle(self._forward_pre_hooks,
                                 extra_dict=self._forward_pre_hooks_with_kwargs)
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """As ``Module.register_forward_hook``: ``hook(module, args, output)`` after forward.

        A non-None return value replaces the output.
        """
        handle = RemovableHandle(self._forward_hooks, extra_dict=[
            self._forward_hooks_with_kwargs, self._forward_hooks_always_called])
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_pre_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """As ``Module.register_full_backward_pre_hook``: ``hook(module, grad_output)`` runs
        when the gradients of the module's outputs are known; it may return replacements."""
        handle = RemovableHandle(self._backward_pre_hooks)
        self._backward_pre_hooks[handle.id] = hook
        if prepend:
            self._backward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_full_backward_hook(self, hook, prepend: bool = False) -> RemovableHandle:
        """As ``Module.register_full_backward_hook``: ``hook(module, grad_input, grad_output)``
        runs when the gradients of the module's (positional tensor) inputs are known; it may
        return replacements for ``grad_input``. ``None`` stands for non-tensor inputs and for
        inputs that do not require grad."""
        handle = RemovableHandle(self._backward_hooks)
        self._backward_hooks[handle.id] = hook
        if prepend:
            self._backward_hooks.move_to_end(handle.id, last=False)
        return handle

    def _call_impl(self, *args, **kwargs):
        if not (self._forward_hooks or self._forward_pre_hooks or self._backward_hooks
                or self._backward_pre_hooks):
            return self.forward(*args, **kwargs)
        called = set()
        result = None
        try:
            for hook_id, hook in list(self._forward_pre_hooks.items()):
                if hook_id in self._forward_pre_hooks_with_kwargs:
                    out = hook(self, args, kwargs)
                    if out is not None:
                        if not (isinstance(out, tuple) and len(out) == 2):
                            raise RuntimeError("forward pre-hook must return None or a tuple of "
                                               f"(new_args, new_kwargs), but got {out}.")
                        args, kwargs = out
                else:
                    out = hook(self, args)
                    if out is not None:
                        args = out if isinstance(out, tuple) else (out,)
            backward_hook = None
            if self._backward_hooks or self._backward_pre_hooks:
                backward_hook = _BackwardHook(self)
                args = backward_hook.setup_input(args)
            result = self.forward(*args, **kwargs)
            for hook_id, hook in list(self._forward_hooks.items()):
                called.add(hook_id)
                if hook_id in self._forward_hooks_with_kwargs:
                    out = hook(self, args, kwargs, result)
                else:
                    out = hook(self, args, result)
                if out is not None:
                    result = out
            if backward_hook is not None:
                result = backward_hook.setup_output(result)
            return result
        except Exception:
            for hook_id, hook in list(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called and hook_id not in called:
                    try:
                        if hook_id in self._forward_hooks_with_kwargs:
                            hook(self, args, kwargs, result)
                        else:
                            hook(self, args, result)
                    except Exception:  # the forward's own error is the one to report
                        pass
            raise

    __call__ = _call_impl

    # --- state dict -------------------------------------------------------------------
    def register_state_dict_pre_hook(self, hook) -> RemovableHandle:
        """As ``Module.register_state_dict_pre_hook``: ``hook(module, prefix, keep_vars)``."""
        handle = RemovableHandle(self._state_dict_pre_hooks)
        self._state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_state_dict_post_hook(self, hook) -> RemovableHandle:
        """As ``Module.register_state_dict_post_hook``:
        ``hook(module, state_dict, prefix, local_metadata)`` may edit the dict in place."""
        handle = RemovableHandle(self._state_dict_hooks)
        self._state_dict_hooks[handle.id] = hook
        return handle

    def register_load_state_dict_pre_hook(self, hook) -> RemovableHandle:
        """As ``Module.register_load_state_dict_pre_hook``: ``hook(module, state_dict, prefix,
        local_metadata, strict, missing_keys, unexpected_keys, error_msgs)``."""
        handle = RemovableHandle(self._load_state_dict_pre_hooks)
        self._load_state_dict_pre_hooks[handle.id] = hook
        return handle

    def register_load_state_dict_post_hook(self, hook) -> RemovableHandle:
        """As ``Module.register_load_state_dict_post_hook``: ``hook(module, incompatible_keys)``
        runs after a successful load."""
        handle = RemovableHandle(self._load_state_dict_post_hooks)
        self._load_state_dict_post_hooks[handle.id] = hook
        return handle

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, param in self._parameters.items():
            if param is not None:
                destination[prefix + name] = param if keep_vars else param.detach()
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = buf if keep_vars else buf.detach()
        if type(self).get_extra_state is not Module.get_extra_state:
            destination[prefix + _EXTRA_STATE] = self.get_extra_state()

    def get_extra_state(self):
        """As ``Module.get_extra_state``: override (with ``set_extra_state``) to store any
        picklable extra state under the ``"_extra_state"`` key of ``state_dict``."""
        raise RuntimeError("get_extra_state: override it (and set_extra_state) in your Module "
                           "to store extra state")

    def set_extra_state(self, state) -> None:
        """As ``Module.set_extra_state``: receives what ``get_extra_state`` returned."""
        raise RuntimeError("set_extra_state: the state_dict holds extra state for a Module that "
                           "does not override set_extra_state")

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """As ``Module.state_dict()``: an OrderedDict of parameters and persistent buffers.

        Keys and their order are PyTorch's (each module's parameters, then its buffers, then
        its children's entries); values are detached tensors sharing the module's storage.
        """
        if args:
            warnings.warn("Positional args are being deprecated, use kwargs instead.",
                          FutureWarning, stacklevel=2)
            destination = args[0] if destination is None else destination
            prefix = args[1] if len(args) > 1 and prefix == "" else prefix
            keep_vars = args[2] if len(args) > 2 and keep_vars is False else keep_vars
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        local_metadata = dict(version=self._version)
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = local_metadata
        for hook in self._state_dict_pre_hooks.values():
            hook(self, prefix, keep_vars)
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".",
                                  keep_vars=keep_vars)
        for hook in self._state_dict_hooks.values():
            if hook(self, destination, prefix, local_metadata) is not None:
                raise RuntimeError("state_dict post-hook must return None")
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        """Check this module's own entries of ``state_dict`` (not its children's).

        Inside ``load_state_dict`` the valid copies are queued and applied only once the whole
        tree has been checked; called directly (PyTorch's signature, as subclasses' overrides
        do), valid entries are copied at once.
        """
        for hook in self._load_state_dict_pre_hooks.values():
            hook(self, state_dict, prefix, local_metadata, strict, missing_keys,
                 unexpected_keys, error_msgs)
        persistent = {k: v for k, v in self._buffers.items()
                      if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in itertools.chain(self._parameters.items(),
                                                        persistent.items()) if v is not None}
        assign = local_metadata.get("assign_to_params_buffers", False)
        queue = _loading.copies
        pending = [] if queue is None else queue
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            source = state_dict[key]
            if not isinstance(source, Tensor):
                error_msgs.append(
                    f'While copying the parameter named "{key}", expected tapegrad.Tensor or '
                    f"Tensor-like object from checkpoint but received {type(source)}")
                continue
            if param.ndim == 0 and source.shape == (1,):
                source = Tensor._make(source._data.reshape(()))
            if source.shape != param.shape:
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape "
                    f"{tuple(source.shape)} from checkpoint, the shape in current model is "
                    f"{tuple(param.shape)}.")
                continue
            pending.append(functools.partial(_load_one, self, name, param, source, assign))
        extra_key = prefix + _EXTRA_STATE
        if type(self).set_extra_state is not Module.set_extra_state:
            if extra_key in state_dict:
                pending.append(functools.partial(self.set_extra_state, state_dict[extra_key]))
            elif strict:
                missing_keys.append(extra_key)
        elif strict and extra_key in state_dict:
            unexpected_keys.append(extra_key)
        if strict:
            for key in state_dict:
                if key.startswith(prefix) and key != extra_key:
                    input_name = key[len(prefix):].split(".", 1)
                    if len(input_name) > 1:
                        if input_name[0] not in self._modules:
                            unexpected_keys.append(key)
                    elif input_name[0] not in local_state:
                        unexpected_keys.append(key)
        if queue is None:
            _apply_copies(pending)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """As ``Module.load_state_dict(state_dict, strict=True)``.

        Returns ``(missing_keys, unexpected_keys)``. With ``strict`` a key mismatch raises;
        a shape mismatch always raises. The error lists every missing and unexpected key and
        every shape mismatch with both shapes, and nothing is loaded when it is raised.
        Values are copied into the existing tensors (``assign=True`` replaces them).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing_keys, unexpected_keys, error_msgs, copies = [], [], [], []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)
        if metadata is not None:
            state_dict._metadata = metadata
        loaded = []

        def load(module, local_state_dict, prefix=""):
            local_metadata = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                local_metadata["assign_to_params_buffers"] = assign
            module._load_from_state_dict(local_state_dict, prefix, local_metadata, True,
                                         missing_keys, unexpected_keys, error_msgs)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    load(child, {k: v for k, v in local_state_dict.items()
                                 if k.startswith(child_prefix)}, child_prefix)
            loaded.append(module)

        outer, _loading.copies = _loading.copies, copies
        try:
            load(self, state_dict)
        finally:
            _loading.copies = outer
        del load
        if strict:
            if unexpected_keys:
                error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in unexpected_keys)))
            if missing_keys:
                error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{k}"' for k in missing_keys)))
        if error_msgs:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                self.__class__.__name__, "\n\t".join(error_msgs)))
        _apply_copies(copies)
        result = _IncompatibleKeys(missing_keys, unexpected_keys)
        for module in loaded:
            for hook in module._load_state_dict_post_hooks.values():
                if hook(module, result) is not None:
                    raise AssertionError(
                        "Hooks registered with ``register_load_state_dict_post_hook`` are not "
                        "expected to return new values, if incompatible_keys need to be "
                        "modified, it should be done inplace.")
        return result

    # --- printing ---------------------------------------------------------------------
    def _get_name(self):
        return self.__class__.__name__

    def extra_repr(self) -> str:
        """As ``Module.extra_repr``: the one-line summary shown inside ``repr``."""
        return ""

    def __repr__(self):
        extra_lines = []
        extra_repr = self.extra_repr()
        if extra_repr:
            extra_lines = extra_repr.split("\n")
        child_lines = []
        for key, module in self._modules.items():
            child_lines.append("(" + key + "): " + _addindent(repr(module), 2))
        lines = extra_lines + child_lines
        main_str = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main_str += extra_lines[0]
            else:
                main_str += "\n  " + "\n  ".join(lines) + "\n"
        return main_str + ")"


class _HookIdentity(Function):
    """Identity on a module's inputs or outputs: its backward sees their gradients (as
    PyTorch's hooks do: None for an unused output; zeros for an input that needs no grad)."""

    @staticmethod
    def forward(ctx, callback, materialize, *tensors):
        ctx.callback = callback
        ctx.set_materialize_grads(materialize)
        ctx.mark_non_differentiable(*[t for t in tensors if not t.requires_grad])
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        return (None, None) + tuple(ctx.callback(grads))


class _BackwardHook:
    """One call's full backward hooks (PyTorch's ``BackwardHook``): the outputs' identity
    records ``grad_output`` (running the pre-hooks); the inputs' identity then calls the hooks
    with ``grad_input`` and passes on what they return."""

    def __init__(self, module):
        self.module = module
        self.hooks = list(module._backward_hooks.values())
        self.pre_hooks = list(module._backward_pre_hooks.values())
        self.grad_outputs = None
        self.n_inputs = self.n_outputs = 0
        self.input_index = self.output_index = None

    @staticmethod
    def _pack(index, values, size):
        out = [None] * size
        for i, v in zip(index, values):
            out[i] = v
        return tuple(out)

    def _wrap(self, values, callback, materialize):
        index = [i for i, v in enumerate(values) if isinstance(v, Tensor)]
        tensors = [values[i] for i in index]
        if not (grad_state.enabled and any(t.requires_grad for t in tensors)):
            return values, None
        new = _HookIdentity.apply(callback, materialize, *tensors)
        values = list(values)
        for i, t in zip(index, new):
            values[i] = t
        return tuple(values), index

    def setup_input(self, args):
        self.n_inputs = len(args)
        args, self.input_index = self._wrap(args, self._on_grad_input, True)
        return args

    def setup_output(self, result):
        single = not isinstance(result, tuple)
        values = (result,) if single else result
        self.n_outputs = len(values)
        values, self.output_index = self._wrap(values, self._on_grad_output, False)
        return values[0] if single else values

    def _on_grad_output(self, grads):
        self.grad_outputs = self._pack(self.output_index, grads, self.n_outputs)
        for hook in self.pre_hooks:
            out = hook(self.module, self.grad_outputs)
            if out is None:
                continue
            out = out if isinstance(out, tuple) else (out,)
            if len(out) != len(self.grad_outputs):
                raise RuntimeError("Backward pre hook returned an invalid number of grad_output, "
                                   f"got {len(out)}, but expected {len(self.grad_outputs)}")
            self.grad_outputs = out
        local = self.grad_outputs
        if self.input_index is None:  # no input needs grad: the hooks fire here, with Nones
            warnings.warn("Full backward hook is firing when gradients are computed with respect "
                          "to module outputs since no inputs require gradients.", stacklevel=2)
            grad_inputs = (None,) * self.n_inputs
            for hook in self.hooks:
                res = hook(self.module, grad_inputs, self.grad_outputs)
                if res is not None and not (isinstance(res, tuple)
                                            and all(r is None for r in res)):
                    raise RuntimeError("Backward hook for Modules where no input requires "
                                       "gradient should always return None or None for all "
                                       "gradients.")
            self.grad_outputs = None
        return [local[i] for i in self.output_index]

    def _on_grad_input(self, grads):
        if self.grad_outputs is None:
            return grads
        res = self._pack(self.input_index, grads, self.n_inputs)
        for hook in self.hooks:
            out = hook(self.module, res, self.grad_outputs)
            if out is None:
                continue
            out = out if isinstance(out, tuple) else (out,)
            if len(out) != len(res):
                raise RuntimeError("Backward hook returned an invalid number of grad_input, got "
                                   f"{len(out)}, but expected {len(res)}")
            res = out
        self.grad_outputs = None
        return [res[i] for i in self.input_index]


def _load_one(module, name, target, source, assign):
    if not assign:
        _copy_into(target, source)
    elif isinstance(target, Parameter):
        value = source if isinstance(source, Parameter) else \
            Parameter(source, requires_grad=target.requires_grad)
        value.requires_grad_(target.requires_grad)
        module._parameters[name] = value
    else:
        module._buffers[name] = source


def _apply_copies(copies):
    """Run the queued loads (copies, assignments, set_extra_state calls) without recording."""
    with no_grad():
        for load in copies:
            load()
