"""Anomaly mode: name the op whose forward or backward first produced NaN/inf, and where
the user's code created it.

    with tapegrad.autograd.detect_anomaly():
        loss = model(x)
        loss.backward()       # RuntimeError: Function 'DivBackward' returned nan ...

While it is on, an op watcher (see ``autograd.engine.WATCH``; anomaly mode is process-wide, as in PyTorch) records a trimmed traceback
on every Node as it is created (``node.stack``) and checks every op's result:

- forward: the first op whose output holds NaN although its inputs held none raises,
  naming the op and the line that called it. An inf that appears from finite inputs is
  remembered, not raised (``-inf`` masks are legitimate), and named in a later error,
  since overflow is the usual origin of a NaN;
- backward: a gradient rule that returns NaN or inf raises as PyTorch's does ("Function
  'XBackward' returned nan values in its 0th output."), followed by the traceback of the
  forward call that created that Node.

Off (the default), it costs nothing: the watcher list is empty.
"""
import functools
import os
import traceback

from tapegrad.autograd.engine import add_watcher, remove_watcher
from tapegrad import dtypes
from tapegrad.backend import xp

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# frames inside the machinery (op dispatch, the tape, Tensor operators) are not the user's
_MACHINERY = tuple(os.path.join(_PACKAGE, d) for d in ("ops", "autograd", "tensor.py",
                                                       "utils" + os.sep + "checkpoint.py"))
_KEEP = 12  # innermost frames shown


def _user_stack():
    frames = traceback.extract_stack()
    kept = [f for f in frames if not f.filename.startswith(_MACHINERY)]
    return traceback.StackSummary.from_list(kept[-_KEEP:])


def _nonfinite(a):
    """'nan', 'inf' or None for an array (or Tensor) of floats."""
    if hasattr(a, "_data"):
        a = a._data
    if not isinstance(a, xp.ndarray) or not (a.dtype.kind == "c" or dtypes.is_floating(a.dtype)):
        return None
    if xp.isfinite(a).all():
        return None
    return "nan" if xp.isnan(a).any() else "inf"


def _format(stack):
    if not stack:
        return ("(no forward traceback: the forward ran outside anomaly mode; run it inside "
                "detect_anomaly() too)")
    return "".join(traceback.format_list(stack)).rstrip()


class _Watcher:
    __slots__ = ("check_nan", "first_inf")

    def __init__(self, check_nan):
        self.check_nan = check_nan
        self.first_inf = None  # (op name, stack) of the first op whose forward made an inf

    def _inf_note(self):
        if self.first_inf is None:
            return ""
        name, stack = self.first_inf
        return (f"\n\nNote: the first inf appeared earlier, in the forward of '{name}', "
                f"created at:\n{_format(stack)}")

    def before_op(self, op):
        pass

    def after_op(self, op, args, out):
        node = getattr(out, "grad_fn", None)
        stack = None
        if node is not None and node.op is op:
            stack = node.stack = _user_stack()
        if not self.check_nan:
            return
        bad = _nonfinite(out)
        if bad is None:
            return
        inputs_bad = None
        for a in (args[0] if args and type(args[0]) is list else args):
            kind = _nonfinite(a)
            if kind == "nan" or (kind == "inf" and inputs_bad is None):
                inputs_bad = kind
        if bad == "nan" and inputs_bad != "nan":
            raise RuntimeError(
                f"Anomaly: the forward of '{op.name}' produced nan values (output of shape "
                f"{tuple(out.shape)}, from inputs without nan), created at:\n"
                f"{_format(stack or _user_stack())}{self._inf_note()}")
        if bad == "inf" and inputs_bad is None and self.first_inf is None:
            self.first_inf = (op.name, stack or _user_stack())

    def before_backward(self, node):
        pass

    def after_backward(self, node, grads):
        if not self.check_nan:
            return
        for i, g in enumerate(grads):
            if g is None:
                continue
            bad = _nonfinite(g)
            if bad is not None:
                raise RuntimeError(
                    f"Function '{node.name()}' returned {bad} values in its {i}th output.\n"
                    f"Traceback of the forward call that created it:\n{_format(node.stack)}"
                    f"{self._inf_note()}")


_watcher = None  # the active watcher, or None
_check_nan = True  # PyTorch's check-nan flag: set along with the mode, True by default


def is_anomaly_enabled() -> bool:
    """As ``torch.is_anomaly_enabled()``."""
    return _watcher is not None


def is_anomaly_check_nan_enabled() -> bool:
    """As ``torch.is_anomaly_check_nan_enabled()``."""
    return _check_nan


def _set(mode, check_nan):
    global _watcher, _check_nan
    _check_nan = bool(check_nan)
    if _watcher is not None:
        remove_watcher(_watcher)
        _watcher = None
    if mode:
        _watcher = _Watcher(check_nan)
        add_watcher(_watcher, all_threads=True)  # process-wide, as in PyTorch


class set_detect_anomaly:
    """As ``torch.autograd.set_detect_anomaly(mode, check_nan=True)``: turn anomaly mode on
    or off now; used as a context manager, the previous mode comes back on exit."""

    def __init__(self, mode: bool, check_nan: bool = True):
        self.prev = (is_anomaly_enabled(), is_anomaly_check_nan_enabled())
        _set(bool(mode), bool(check_nan))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _set(*self.prev)
        return False


class detect_anomaly:
    """As ``torch.autograd.detect_anomaly(check_nan=True)``: a context manager (and
    decorator) under which NaN/inf are traced to the op and the user line that made them.

    >>> with tapegrad.autograd.detect_anomaly():
    ...     (x / 0 * 0).sum().backward()     # names 'mul' and this line
    """

    def __init__(self, check_nan: bool = True):
        self.check_nan = bool(check_nan)

    def __enter__(self):
        self.prev = (is_anomaly_enabled(), is_anomaly_check_nan_enabled())
        _set(True, self.check_nan)
        return self

    def __exit__(self, *exc):
        _set(*self.prev)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with detect_anomaly(self.check_nan):
                return fn(*args, **kwargs)

        return wrapper


__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled"]
