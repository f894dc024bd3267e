"""Printing tensors: ``repr``/``str`` with PyTorch's ``_tensor_str`` rules (precision 4,
threshold 1000, 3 edge items, line width 80). Split out of ``tensor.py``."""
import math

from tapegrad import dtypes
from tapegrad.backend import xp, to_host, array_module

# --- printing: PyTorch's _tensor_str rules (precision 4, threshold 1000, 3 edge items) -------
_PRECISION, _THRESHOLD, _EDGE, _LINEWIDTH = 4, 1000, 3, 80


class _Formatter:
    """One width and style (int, fixed or scientific) for all the elements printed."""

    def __init__(self, values, floating):
        self.floating, self.int_mode, self.sci_mode, self.width = floating, True, False, 1
        if not floating:
            self.width = max((len(str(v)) for v in values), default=1)
            return
        nonzero = [v for v in values if v != 0 and math.isfinite(v)]
        if not nonzero:
            return
        lo, hi = min(abs(v) for v in nonzero), max(abs(v) for v in nonzero)
        self.int_mode = all(v == math.ceil(v) for v in nonzero)
        self.sci_mode = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4
        if self.sci_mode:
            self.width = max(len(f"{v:.{_PRECISION}e}") for v in nonzero)
        elif self.int_mode:
            self.width = max(len(f"{v:.0f}") + 1 for v in nonzero)
        else:
            self.width = max(len(f"{v:.{_PRECISION}f}") for v in nonzero)

    def format(self, v):
        if not self.floating:
            s = str(v)
        elif self.sci_mode:
            s = f"{v:{self.width}.{_PRECISION}e}"
        elif self.int_mode:
            s = f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else ".")
        else:
            s = f"{v:.{_PRECISION}f}"
        return (self.width - len(s)) * " " + s


def _corners(a):
    """What a summarised print reads of ``a``: along each dim longer than ``2 * _EDGE + 1``,
    the first and last ``_EDGE`` entries and one between them (never shown: it keeps the dim
    longer than ``2 * _EDGE``, so the printer still writes its ``...``). Taken from the view,
    before any copy: an expanded tensor's elements need not fit in memory."""
    m = array_module(a)
    for d, n in enumerate(a.shape):
        if n > 2 * _EDGE + 1:  # slices are views: only what is kept is copied
            head = a[(slice(None),) * d + (slice(0, _EDGE + 1),)]
            tail = a[(slice(None),) * d + (slice(n - _EDGE, n),)]
            a = m.concatenate((head, tail), axis=d)
    return a


def _body(data, indent):
    """The bracketed values of non-empty ``data`` (a host or device array), summarised with
    ``...`` past ``_THRESHOLD`` elements."""
    summarize = data.size > _THRESHOLD
    if summarize:
        data = _corners(data)
    if type(data) is not xp.ndarray:
        data = to_host(data)
    floating = dtypes.is_floating(data.dtype)
    shown = data.astype(xp.float64) if floating else data
    sample = _summarized(shown) if summarize else shown
    fmt = _Formatter(sample.reshape(-1).tolist(), floating)
    return _nested_str(shown, indent, summarize, fmt)


def _summarized(a):
    if a.ndim == 0:
        return a
    if a.ndim == 1:
        return xp.concatenate((a[:_EDGE], a[-_EDGE:])) if a.shape[0] > 2 * _EDGE else a
    rows = list(range(_EDGE)) + list(range(len(a) - _EDGE, len(a))) \
        if a.shape[0] > 2 * _EDGE else range(a.shape[0])
    return xp.stack([_summarized(a[i]) for i in rows])


def _vector_str(a, indent, summarize, fmt):
    per_line = max(1, math.floor((_LINEWIDTH - indent) / (fmt.width + 2)))
    if summarize and a.shape[0] > 2 * _EDGE:
        data = [fmt.format(v) for v in a[:_EDGE].tolist()] + [" ..."] + \
            [fmt.format(v) for v in a[-_EDGE:].tolist()]
    else:
        data = [fmt.format(v) for v in a.tolist()]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _nested_str(a, indent, summarize, fmt):
    if a.ndim == 0:
        return fmt.format(a.item())
    if a.ndim == 1:
        return _vector_str(a, indent, summarize, fmt)
    if summarize and a.shape[0] > 2 * _EDGE:
        parts = [_nested_str(a[i], indent + 1, summarize, fmt) for i in range(_EDGE)] + \
            ["..."] + [_nested_str(a[i], indent + 1, summarize, fmt)
                       for i in range(len(a) - _EDGE, len(a))]
    else:
        parts = [_nested_str(a[i], indent + 1, summarize, fmt) for i in range(a.shape[0])]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


def _repr(t):
    if getattr(t._data, "value", None) is not None:  # tapegrad.func.vmap's value, as PyTorch
        d = t._data
        return f"BatchedTensor(bdim={d.bdim}, value=\n{_repr(d.value)}\n)"
    data, prefix = t._data, "tensor("
    indent = len(prefix)
    suffixes = []
    if type(data) is not xp.ndarray and t.device.type != "cpu":
        # a device array: printed from a host copy of what is shown, as PyTorch
        suffixes.append(f"device='{t.device}'")
    default = data.dtype == dtypes.get_default_dtype().np
    if data.size == 0:
        body = "[]"
        if data.ndim != 1:
            suffixes.append(f"size={tuple(data.shape)}")
        if not default:
            suffixes.append(f"dtype={t.dtype}")
    else:
        body = _body(data, indent)
        if not (default or data.dtype in (xp.int64, xp.bool_)):
            suffixes.append(f"dtype={t.dtype}")
    if t.grad_fn is not None:
        suffixes.append(f"grad_fn=<{t.grad_fn.name()}>")
    elif t._requires_grad:
        suffixes.append("requires_grad=True")
    out = prefix + body
    last = len(out) - out.rfind("\n") + 1
    for sfx in suffixes:
        if last + len(sfx) + 2 > _LINEWIDTH:
            out += ",\n" + " " * indent + sfx
            last = indent + len(sfx)
        else:
            out += ", " + sfx
            last += len(sfx) + 2
    return out + ")"
