"""Recurrent layers: ``RNN``, ``LSTM``, ``GRU`` and the single-step ``RNNCell``,
``LSTMCell``, ``GRUCell`` (as in ``torch.nn``), built from core ops.

Parameter names (``weight_ih_l0``, ``bias_hh_l1_reverse`` ...; the cells' ``weight_ih`` ...),
their order and the gate order inside each weight (LSTM: input, forget, cell, output; GRU:
reset, update, new) are PyTorch's, so state dicts load both ways. Each layer projects the
whole input sequence at once (one GEMM), then runs each layer and direction's time loop as
one op, ``rnn_layer``, with its own backward through time; a cell is one op, ``rnn_cell``.
Under autocast or with bfloat16 tensors the layers and cells run the same math step by step
as ops (``ops.recurrent.step``), which promote mixed dtypes as PyTorch does there.
"""
import math
import numbers
import warnings

import tapegrad
from tapegrad.amp import autocast_mode
from tapegrad.nn import functional as F
from tapegrad.nn import init
from tapegrad.nn.module import Module
from tapegrad.nn.layers._utils import empty_parameter
from tapegrad.ops.recurrent import GATES, rnn_cell, rnn_layer, step as _step

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = GATES


def _fused(*tensors):
    """Whether the fused ops (``ops.recurrent``) run this layer or cell: float32/float64
    tensors of one dtype outside autocast. Elsewhere (autocast's bfloat16 with float32
    states, bfloat16 weights) the step-by-step composition runs, promoting as its ops do."""
    if autocast_mode.lower_precision_region():
        return False
    dt = tensors[0].dtype
    return dt in _FLOATS and all(t is None or t.dtype is dt for t in tensors)


_FLOATS = (tapegrad.float32, tapegrad.float64)


class RNNBase(Module):
    """What RNN, LSTM and GRU share: parameters, checks, repr and the layer/direction loop."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None, dtype=None):
        super().__init__()
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        num_directions = 2 if bidirectional else 1
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout <= 1):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        if not isinstance(bias, bool):
            raise TypeError(f"bias should be of type bool, got: {type(bias).__name__}")
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first should be of type bool, got: "
                            f"{type(batch_first).__name__}")
        if not isinstance(input_size, int):
            raise TypeError(f"input_size should be of type int, got: {type(input_size).__name__}")
        if input_size <= 0:
            raise ValueError("input_size must be greater than zero")
        if not isinstance(hidden_size, int):
            raise TypeError(f"hidden_size should be of type int, got: "
                            f"{type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + mode)
        gate_size = _GATES[mode] * hidden_size
        real_hidden_size = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input_size = input_size if layer == 0 else real_hidden_size * num_directions
                shapes = [(gate_size, layer_input_size), (gate_size, real_hidden_size)]
                names = ["weight_ih_l{}{}", "weight_hh_l{}{}"]
                if bias:
                    shapes += [(gate_size,), (gate_size,)]
                    names += ["bias_ih_l{}{}", "bias_hh_l{}{}"]
                if proj_size > 0:
                    shapes += [(proj_size, hidden_size)]
                    names += ["weight_hr_l{}{}"]
                suffix = "_reverse" if direction == 1 else ""
                names = [n.format(layer, suffix) for n in names]
                for name, shape in zip(names, shapes):
                    setattr(self, name, empty_parameter(shape, device, dtype))
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    @property
    def _flat_weights(self):
        return [getattr(self, name) for name in self._flat_weights_names]

    @property
    def all_weights(self):
        """As ``RNNBase.all_weights``: per layer and direction, its parameters."""
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """As ``RNNBase.flatten_parameters``: packs weights for cuDNN in PyTorch, a no-op on
        the cpu there and here (scripts that call it before every forward keep working)."""

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if self.proj_size != 0:
            s += ", proj_size={proj_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        return s.format(**self.__dict__)

    # --- checks -----------------------------------------------------------------------
    def _check_input(self, input):
        w = getattr(self, self._flat_weights_names[0])
        if input.dtype != w.dtype:
            raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype "
                             f"({w.dtype}). Convert input: input.to({w.dtype}), or convert "
                             f"model: model.to({input.dtype})")
        if input.dim() != 3:
            raise RuntimeError(f"input must have 3 dimensions, got {input.dim()}")
        if self.input_size != input.shape[-1]:
            raise RuntimeError("input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {input.shape[-1]}")
        if input.shape[1 if self.batch_first else 0] == 0:  # (an empty batch is fine)
            raise RuntimeError(f"{self._get_name()}: Expected sequence length to be larger than "
                               f"0 in RNN, got input of shape {tuple(input.shape)}")

    def _hidden_shape(self, input, size):
        batch = input.shape[0] if self.batch_first else input.shape[1]
        return (self.num_layers * (2 if self.bidirectional else 1), batch, size)

    @staticmethod
    def _check_hidden(hx, expected, msg="Expected hidden size {}, got {}"):
        if tuple(hx.shape) != expected:
            raise RuntimeError(msg.format(expected, list(hx.shape)))

    def _zeros(self, input, size):
        return tapegrad.zeros(self._hidden_shape(input, size), dtype=input.dtype,
                              device=input.device)

    # --- the computation --------------------------------------------------------------
    def _cell(self, xw, h, c, w_hh_t, b_hh, w_hr_t):
        return _step(self.mode, self.hidden_size, xw, h, c, w_hh_t, b_hh, w_hr_t)

    def _run(self, input, hx, cx):
        """Time-major ``input`` (T, B, I) through every layer and direction.

        Returns the last layer's output (T, B, D*H) and the final h (and c) stacked as
        (num_layers * D, B, H), index ``layer * D + direction``, as PyTorch.
        """
        num_directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        layer_input = input
        weights = self.all_weights
        amp = autocast_mode.lower_precision_region()
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(num_directions):
                index = layer * num_directions + direction
                w = list(weights[index])
                c = cx[index] if cx is not None else None
                if amp and self.mode == "LSTM":
                    # PyTorch's CPU LSTM is one mkldnn_rnn_layer per layer and direction,
                    # listed lower precision: input, states and weights run in bfloat16
                    out, h, c = autocast_mode.run_lower_precision(
                        "mkldnn_rnn_layer", self._direction, layer_input, hx[index], c,
                        direction, *w)
                else:
                    if amp:  # RNN/GRU: linear(x, w, b) per projection, the bias cast with it
                        w[2:4] = autocast_mode.cast_lower_precision(*w[2:4])
                    out, h, c = self._direction(layer_input, hx[index], c, direction, *w)
                outputs.append(out)
                h_n.append(h)
                c_n.append(c)
            layer_input = outputs[0] if num_directions == 1 else tapegrad.cat(outputs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        return layer_input, tapegrad.stack(h_n), (tapegrad.stack(c_n) if cx is not None
                                                  else None)

    def _direction(self, layer_input, h, c, direction, *w):
        """One layer in one direction over time-major ``layer_input``: (output, h, c)."""
        if _fused(layer_input, h, c, *w):
            b_ih, b_hh = (w[2], w[3]) if self.bias else (None, None)
            xw = F.linear(layer_input, w[0], b_ih)  # every step's input projection: one GEMM
            out = rnn_layer(xw, h, c, w[1], b_hh, w[-1] if self.proj_size > 0 else None,
                            mode=self.mode, reverse=direction == 1)
            last = -1 if direction == 0 else 0  # the step the direction ends at
            if self.mode != "LSTM":
                return out, out[last], None
            size = h.shape[-1]
            return out[:, :, :size], out[last, :, :size], out[last, :, size:]
        steps = layer_input.shape[0]
        w_ih, w_hh_t = w[0], w[1].T
        b_ih, b_hh = (w[2], w[3]) if self.bias else (None, None)
        w_hr_t = w[-1].T if self.proj_size > 0 else None
        xw = layer_input @ w_ih.T
        if b_ih is not None:
            xw = xw + b_ih
        seq = [None] * steps
        order = range(steps) if direction == 0 else range(steps - 1, -1, -1)
        for t in order:
            h, c = self._cell(xw[t], h, c, w_hh_t, b_hh, w_hr_t)
            seq[t] = h
        return tapegrad.stack(seq), h, c

    def _forward(self, input, hx, cx):
        """Batch-first/unbatched handling around ``_run``; hx/cx are 3-D by now."""
        x = input.transpose(0, 1) if self.batch_first else input
        out, h, c = self._run(x, hx, cx)
        return (out.transpose(0, 1) if self.batch_first else out), h, c

    def _batch(self, input):
        if input.dim() not in (2, 3):
            raise ValueError(f"{self._get_name()}: Expected input to be 2D or 3D, got "
                             f"{input.dim()}D tensor instead")
        is_batched = input.dim() == 3
        if not is_batched:
            input = input.unsqueeze(0 if self.batch_first else 1)
        return input, is_batched


class RNN(RNNBase):
    """As ``torch.nn.RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh',
    bias=True, batch_first=False, dropout=0.0, bidirectional=False)``:
    ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``.

    ``forward(input, hx=None)`` returns ``(output, h_n)``.
    """

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            self.nonlinearity = args[3]
            args = args[:3] + args[4:]
        else:
            self.nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if self.nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif self.nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{self.nonlinearity}'. Select from 'tanh' "
                             "or 'relu'.")
        super().__init__(mode, *args, **kwargs)

    def forward(self, input, hx=None):
        input, is_batched = self._batch(input)
        if hx is not None:
            if not is_batched:
                if hx.dim() != 2:
                    raise RuntimeError("For unbatched 2-D input, hx should also be 2-D but got "
                                       f"{hx.dim()}-D tensor")
                hx = hx.unsqueeze(1)
            elif hx.dim() != 3:
                raise RuntimeError("For batched 3-D input, hx should also be 3-D but got "
                                   f"{hx.dim()}-D tensor")
        self._check_input(input)
        if hx is None:
            hx = self._zeros(input, self.hidden_size)
        self._check_hidden(hx, self._hidden_shape(input, self.hidden_size))
        output, hidden, _ = self._forward(input, hx, None)
        if not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            hidden = hidden.squeeze(1)
        return output, hidden


class LSTM(RNNBase):
    """As ``torch.nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False, proj_size=0)``; gates (i, f, g, o) in PyTorch's order.

    ``forward(input, (h_0, c_0)=None)`` returns ``(output, (h_n, c_n))``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)

    def forward(self, input, hx=None):
        input, is_batched = self._batch(input)
        real_hidden_size = self.proj_size if self.proj_size > 0 else self.hidden_size
        self._check_input(input)
        if hx is None:
            hx = (self._zeros(input, real_hidden_size), self._zeros(input, self.hidden_size))
        else:
            h0, c0 = hx
            if is_batched:
                if h0.dim() != 3 or c0.dim() != 3:
                    raise RuntimeError("For batched 3-D input, hx and cx should also be 3-D but "
                                       f"got ({h0.dim()}-D, {c0.dim()}-D) tensors")
            else:
                if h0.dim() != 2 or c0.dim() != 2:
                    raise RuntimeError("For unbatched 2-D input, hx and cx should also be 2-D "
                                       f"but got ({h0.dim()}-D, {c0.dim()}-D) tensors")
                hx = (h0.unsqueeze(1), c0.unsqueeze(1))
        self._check_hidden(hx[0], self._hidden_shape(input, real_hidden_size),
                           "Expected hidden[0] size {}, got {}")
        self._check_hidden(hx[1], self._hidden_shape(input, self.hidden_size),
                           "Expected hidden[1] size {}, got {}")
        output, h, c = self._forward(input, hx[0], hx[1])
        if not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            h, c = h.squeeze(1), c.squeeze(1)
        return output, (h, c)


class GRU(RNNBase):
    """As ``torch.nn.GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False)``; gates (r, z, n) in PyTorch's order.

    ``forward(input, hx=None)`` returns ``(output, h_n)``.
    """

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)

    forward = RNN.forward


class RNNCellBase(Module):
    """What RNNCell, LSTMCell and GRUCell share: ``weight_ih`` (chunks*H, I), ``weight_hh``
    (chunks*H, H), ``bias_ih``/``bias_hh`` (chunks*H,), all U(-1/sqrt(H), 1/sqrt(H))."""

    _mode = None

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device=None, dtype=None):
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = empty_parameter((num_chunks * hidden_size, input_size), device, dtype)
        self.weight_hh = empty_parameter((num_chunks * hidden_size, hidden_size), device, dtype)
        if bias:
            self.bias_ih = empty_parameter((num_chunks * hidden_size,), device, dtype)
            self.bias_hh = empty_parameter((num_chunks * hidden_size,), device, dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if "bias" in self.__dict__ and self.bias is not True:
            s += ", bias={bias}"
        if "nonlinearity" in self.__dict__ and self.nonlinearity != "tanh":
            s += ", nonlinearity={nonlinearity}"
        return s.format(**self.__dict__)

    reset_parameters = RNNBase.reset_parameters

    def _batch(self, input, hidden):
        """PyTorch's input checks; unbatched (1-D) input and states get a batch dim of 1."""
        name = self._get_name()
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D "
                             "instead")
        for i, h in enumerate(hidden):
            if h is not None and h.dim() not in (1, 2):
                what = "hidden" if len(hidden) == 1 else f"hx[{i}]"
                raise ValueError(f"{name}: Expected {what} to be 1D or 2D, got {h.dim()}D "
                                 "instead")
        is_batched = input.dim() == 2
        if not is_batched:
            input = input.unsqueeze(0)
            hidden = [None if h is None else h.unsqueeze(0) for h in hidden]
        if input.shape[1] != self.input_size:
            raise RuntimeError(f"{name}: input has inconsistent input_size: got "
                               f"{input.shape[1]} expected {self.input_size} (input "
                               f"{tuple(input.shape)})")
        batch = input.shape[0]
        zeros = None
        for i, h in enumerate(hidden):
            if h is None:
                if zeros is None:
                    zeros = tapegrad.zeros((batch, self.hidden_size), dtype=input.dtype,
                                           device=input.device)
                hidden[i] = zeros
            elif h.shape[0] != batch:
                raise RuntimeError(f"{name}: Input batch size {batch} doesn't match hidden{i} "
                                   f"batch size {h.shape[0]}")
            elif h.dim() != 2:
                raise RuntimeError(f"{name}: hidden{i} of shape {tuple(h.shape)} is 1-D but "
                                   f"the input {tuple(input.shape)} is batched")
            elif h.shape[1] != self.hidden_size:
                raise RuntimeError(f"{name}: hidden{i} has inconsistent hidden_size: got "
                                   f"{h.shape[1]}, expected {self.hidden_size}")
        return input, hidden, is_batched

    def _cell(self, input, h, c=None):
        b_ih, b_hh = self.bias_ih, self.bias_hh
        if _fused(input, h, c, self.weight_ih, self.weight_hh, b_ih, b_hh):
            out = rnn_cell(input, h, c, self.weight_ih, self.weight_hh, b_ih, b_hh,
                           mode=self._mode)
            if c is None:
                return out, None
            return out[:, :self.hidden_size], out[:, self.hidden_size:]
        if autocast_mode.lower_precision_region():  # linear(x, w, b): the bias cast with it
            b_ih, b_hh = autocast_mode.cast_lower_precision(b_ih, b_hh)
        xw = input @ self.weight_ih.T
        if b_ih is not None:
            xw = xw + b_ih
        return _step(self._mode, self.hidden_size, xw, h, c, self.weight_hh.T, b_hh)


class RNNCell(RNNCellBase):
    """As ``torch.nn.RNNCell(input_size, hidden_size, bias=True, nonlinearity='tanh')``:
    ``h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)``; ``forward(input, hx=None)`` returns h'.
    """

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device,
                         dtype=dtype)
        self.nonlinearity = nonlinearity

    @property
    def _mode(self):
        return "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"

    def forward(self, input, hx=None):
        if self.nonlinearity not in ("tanh", "relu"):
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        input, (hx,), is_batched = self._batch(input, [hx])
        h, _ = self._cell(input, hx)
        return h if is_batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """As ``torch.nn.LSTMCell(input_size, hidden_size, bias=True)``; gates (i, f, g, o) in
    PyTorch's order. ``forward(input, (h, c)=None)`` returns ``(h', c')``."""

    _mode = "LSTM"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device,
                         dtype=dtype)

    def forward(self, input, hx=None):
        input, (h, c), is_batched = self._batch(input, [None, None] if hx is None else
                                                list(hx))
        h, c = self._cell(input, h, c)
        return (h, c) if is_batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """As ``torch.nn.GRUCell(input_size, hidden_size, bias=True)``; gates (r, z, n) in
    PyTorch's order. ``forward(input, hx=None)`` returns h'."""

    _mode = "GRU"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device,
                         dtype=dtype)

    def forward(self, input, hx=None):
        input, (hx,), is_batched = self._batch(input, [hx])
        h, _ = self._cell(input, hx)
        return h if is_batched else h.squeeze(0)
