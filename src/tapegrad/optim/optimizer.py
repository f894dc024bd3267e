"""The optimizer base: parameter groups, per-parameter state, state_dict, and batching.

Each optimizer is one pure per-parameter update, ``update(param, grad, state, group)``, over
backend arrays: ``param`` is ``p._data`` (updated in place), ``grad`` is ``p.grad._data``,
``state`` maps state names to arrays (updated in place; new entries are kept) and ``group``
is the parameter group (hyperparameters). The base class owns everything around it:
lazy state, the loop over parameters, and the batching: small parameters of a group that
share a dtype and their scalar state (``step``) are concatenated into one flat buffer and
the same update runs once over it (per-call overhead dominates small tensors; large ones
run one by one, where a concatenation would cost more than it saves). The batched result is
bit-identical to the loop. ``foreach=False`` turns batching off; ``None``/``True`` keep it.
"""
from collections import defaultdict
from copy import deepcopy
from itertools import chain

from tapegrad import dtypes
from tapegrad.autograd import engine as _engine
from tapegrad.autograd.grad_mode import enable_grad, no_grad
from tapegrad.backend import xp, DEVICE_TYPES, device_of, to_device
from tapegrad.tensor import Tensor


class _RequiredParameter:
    """Marks a hyperparameter every parameter group must give (``optim.optimizer.required``)."""

    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


def scalar_dtype():
    """The dtype of scalar state (``step``): float64 under a float64 default, else float32."""
    return xp.float64 if dtypes.get_default_dtype() is dtypes.float64 else xp.float32


def check_unsupported(differentiable=False, fused=None):
    """PyTorch's differentiable and fused modes have no tapegrad counterpart: say so."""
    if differentiable:
        raise NotImplementedError("tapegrad optimizers do not support differentiable=True")
    if fused:
        raise NotImplementedError("tapegrad optimizers have no fused kernels (fused=True); "
                                  "small parameters are batched into flat updates already")


def check_betas(betas):
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")


def check_nonnegative(**values):
    """Raise PyTorch's ``Invalid <name>: <value>`` for a negative hyperparameter."""
    names = {"lr": "learning rate", "eps": "epsilon value"}
    for key, value in values.items():
        if not 0.0 <= value:
            raise ValueError(f"Invalid {names.get(key, key + ' value')}: {value}")


# --- array idioms, written as PyTorch's CPU kernels evaluate them --------------------------
def lerp_(start, end, weight):
    """``start.lerp_(end, weight)`` in place; PyTorch's two-sided formula for accuracy."""
    if abs(weight) < 0.5:
        start += weight * (end - start)
    else:
        xp.subtract(end, (end - start) * (1 - weight), out=start)


def addcmul_(out, t1, t2, value=1.0):
    """``out.addcmul_(t1, t2, value=value)``: out + value * t1 * t2."""
    prod = t1 * value
    prod *= t2
    out += prod


def addcdiv_(out, t1, t2, value=1.0):
    """``out.addcdiv_(t1, t2, value=value)``: out + value * t1 / t2."""
    quot = t1 * value
    quot /= t2
    out += quot


class Optimizer:
    """As ``torch.optim.Optimizer(params, defaults)``: the base of every optimizer.

    Subclasses set ``update`` (the pure per-parameter step, see the module docstring) and
    ``init_state(param_array, group) -> dict`` (fresh state arrays, in PyTorch's key order).
    ``elementwise = True`` says the update treats every element alike (given the same
    scalar state), which is what lets the base class run it once over a flat buffer.
    """

    update = None
    elementwise = False
    _scalar_state = ("step",)  # 0-d state shared by a flat batch (e.g. step, mu_product)
    flat_max_numel = 1024  # parameters up to this size are batched into flat updates

    def __init__(self, params, defaults: dict):
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {type(params).__name__}")
        lr = defaults.get("lr")
        if isinstance(lr, Tensor):
            raise TypeError(f"{type(self).__name__}: tapegrad optimizers take lr as a Python "
                            "number, not a Tensor")
        self.state = defaultdict(dict)
        self.param_groups = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state,
                "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self):
        s = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += f"\nParameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    s += f"    {key}: {group[key]}\n"
        return s + ")"

    # --- parameter groups -----------------------------------------------------------------
    def add_param_group(self, param_group: dict) -> None:
        """As ``Optimizer.add_param_group``: append a group; missing options take defaults.

        Unlike PyTorch (which only warns), a parameter repeated within one group raises, as
        it does across groups: it would be stepped twice.
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(
                "optimizer parameters need to be organized in ordered collections, but the "
                "ordering of tensors in sets will change between runs. Please use a list instead.")
        else:
            params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        params = [p[1] if isinstance(p, tuple) else p for p in params]
        if names:
            if len(names) != len(params):
                raise ValueError("all optimizer params should be with/without names. Some param "
                                 "names are missing")
            param_group["param_names"] = names
        param_group["params"] = params
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                f"{type(p).__module__}.{type(p).__name__}")
            if not (p.is_leaf or p.retains_grad):
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError("parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            param_group.setdefault(name, default)
        if len({id(p) for p in params}) != len(params):
            raise ValueError("optimizer contains a parameter group with duplicate parameters")
        seen = set()
        for group in self.param_groups:
            seen.update(id(p) for p in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                which = "with names" if "param_names" in param_group else "without names"
                raise ValueError("all optimizer param groups should be with/without names. "
                                 f"cannot add param group {which} to the optimizer")
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    @_engine.hook_point
    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``Optimizer.zero_grad``: drop every ``.grad`` (or zero it in place)."""
        if not set_to_none and _engine.WATCH and type(self).zero_grad is Optimizer.zero_grad:
            m = _engine.observer("zero_grads")  # the compiler's tracer records the writes
            if m is not None:
                return m.zero_grads(self, Optimizer._zero_grad)
        self._zero_grad(set_to_none)

    def _zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                g = p._grad  # the slot behind the .grad property: no property call per step
                if g is None:
                    continue
                if set_to_none:
                    p._grad = None
                else:
                    if g.grad_fn is not None:
                        g.detach_()
                    else:
                        g._requires_grad = False
                    if type(g._data) is xp.ndarray:
                        g._data[...] = 0
                    else:  # a 0-d result held as a numpy scalar
                        g._data = xp.zeros_like(g._data)
                    g._version[0] += 1

    # --- the step ---------------------------------------------------------------------------
    def init_state(self, param, group) -> dict:
        """Fresh state arrays for one parameter (its backend array); none by default."""
        return {}

    @_engine.hook_point
    def step(self, closure=None):
        """As ``Optimizer.step(closure=None)``: one update of every parameter with a grad.

        The update runs on backend arrays, so it never records onto the tape; ``closure``
        (which re-evaluates the loss) runs with grad enabled and its loss is returned.
        """
        if closure is None and _engine.WATCH and type(self).step is Optimizer.step:
            m = _engine.observer("optimizer_step")  # the compiler's tracer: one graph node
            if m is not None:
                return m.optimizer_step(self, Optimizer._run_step)
        return self._run_step(closure)

    def _run_step(self, closure=None):
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        with no_grad():
            for group in self.param_groups:
                params = [p for p in group["params"] if p._grad is not None]
                if self.elementwise and group.get("foreach") is not False and len(params) > 1:
                    small = [p for p in params if p._data.size <= self.flat_max_numel]
                    if len(small) > 1:
                        self._step_flat(small, group)
                        params = [p for p in params if p._data.size > self.flat_max_numel]
                self._step_each(params, group)
        return loss

    def _state_arrays(self, p, group):
        if type(p._data) is not xp.ndarray and type(p._data) not in DEVICE_TYPES:
            p._data = xp.asarray(p._data)  # a numpy scalar cannot be updated in place
        state = self.state[p]
        if not state:
            for k, v in self.init_state(p._data, group).items():
                state[k] = Tensor._make(v)
        return state, {k: v._data for k, v in state.items()}

    @staticmethod
    def _keep_new(state, arrays):
        if len(arrays) != len(state):
            for k, v in arrays.items():
                if k not in state:
                    state[k] = Tensor._make(v)

    def _step_each(self, params, group):
        update = self.update
        for p in params:
            state, arrays = self._state_arrays(p, group)
            update(p._data, p._grad._data, arrays, group)
            self._keep_new(state, arrays)
            p._version[0] += 1

    def _step_flat(self, params, group):
        """One update per batch of parameters that share a dtype and their scalar state."""
        batches = defaultdict(list)
        for p in params:
            state, arrays = self._state_arrays(p, group)
            scalars = tuple((k, arrays[k].item()) for k in self._scalar_state if k in arrays)
            key = (p._data.dtype, p._grad._data.dtype, tuple(arrays), scalars)
            batches[key].append((p, state, arrays))
        for batch in batches.values():
            if len(batch) == 1:
                p, state, arrays = batch[0]
                self.update(p._data, p._grad._data, arrays, group)
                self._keep_new(state, arrays)
                p._version[0] += 1
                continue
            flat = {k: (v.copy() if v.ndim == 0 and k in self._scalar_state else
                        xp.concatenate([a[k].ravel() for _, _, a in batch]))
                    for k, v in batch[0][2].items()}
            flat_param = xp.concatenate([p._data.ravel() for p, _, _ in batch])
            flat_grad = xp.concatenate([p._grad._data.ravel() for p, _, _ in batch])
            self.update(flat_param, flat_grad, flat, group)
            offset = 0
            for p, state, arrays in batch:
                n = p._data.size
                p._data[...] = flat_param[offset:offset + n].reshape(p._data.shape)
                for k, v in flat.items():
                    if k in arrays:
                        if k in self._scalar_state and v.ndim == 0:
                            arrays[k][...] = v
                        else:
                            arrays[k][...] = v[offset:offset + n].reshape(arrays[k].shape)
                    else:  # created by the update (SGD's momentum buffer on its first step)
                        state[k] = Tensor._make(v[offset:offset + n].reshape(p._data.shape))
                p._version[0] += 1
                offset += n

    # --- state_dict -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """As ``Optimizer.state_dict()``: ``{'state': {index: {...}}, 'param_groups': [...]}``.

        Parameters are replaced by their position over all groups; as in PyTorch, the state
        tensors are the live ones (save or copy them before stepping again).
        """
        index = {}
        start = 0
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                index.setdefault(id(p), i)
            packed["params"] = [index[id(p)] for p in group["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {(index[id(k)] if isinstance(k, Tensor) else k): v
                 for k, v in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """As ``Optimizer.load_state_dict``: restore state and hyperparameters by position.

        Floating-point state is copied and cast to its parameter's dtype, except ``step``
        (PyTorch's rule: so NAdam's ``mu_product`` comes back in the parameter's dtype).
        """
        groups = self.param_groups
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))

        def cast(param, value, key=None):
            if isinstance(value, Tensor):
                data = value._data
                if key != "step" and dtypes.is_floating(param._data.dtype):
                    data = data.astype(param._data.dtype)
                if key != "step" and type(data) is not type(param._data) and (
                        type(data) in DEVICE_TYPES or type(param._data) in DEVICE_TYPES):
                    # to the parameter's device, as PyTorch (``step`` stays on the cpu)
                    return Tensor._make(to_device(data, device_of(param._data)))
                return Tensor._make(data.copy())
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(cast(param, v) for v in value)
            return value

        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = self._normalise_state(cast(param, v))
            else:
                state[k] = v
        for group, new_group in zip(groups, saved_groups):
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
        self.__setstate__({"state": state, "param_groups": saved_groups})

    def _normalise_state(self, state):
        """Scalar state saved as a plain number (old checkpoints) becomes a 0-d tensor."""
        for k in self._scalar_state:
            if k in state and not isinstance(state[k], Tensor):
                state[k] = Tensor._make(xp.asarray(float(state[k]), dtype=scalar_dtype()))
        return state
