"""Recurrent layers and cells as single ops: the whole time loop of one layer in one
direction (``rnn_layer``), and one step of a cell (``rnn_cell``), each with a hand-written
backward through time (``rnn_layer_backward``, ``rnn_cell_backward``).

Modes and gate orders are PyTorch's: ``LSTM`` (i, f, g, o; optional projection ``w_hr``),
``GRU`` (r, z, n with ``n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn))``), ``RNN_TANH`` and
``RNN_RELU``. The layer op takes the input projection ``xw = x W_ih^T + b_ih`` of every time
step, done before it as one GEMM; inside, the recurrence runs on preallocated buffers with
in-place ufuncs, one ``h W_hh^T`` GEMM per step.

An op has one output, so the layer's output packs what its users read: per time step the
hidden state, and for an LSTM the cell state beside it, ``(T, B, P + H)``; the layer slices
``h_n`` and ``c_n`` out of the last step. The gates are not part of it (every user's gradient
would then carry a dense block of zeros for them): the backward recomputes the gate
pre-activations of all steps at once, one GEMM over ``[h_0 .. h_{T-2}]``, then runs the
recurrence of the gradients step by step and leaves the weight gradients to one GEMM over all
steps at the end. Its result is one flat buffer holding the gradient of each input in turn,
which the forward op's rule cuts up with views. The LSTM kernels work on the gates reordered
(i, f, o, g) with the sigmoid gates' weights negated (``_lstm_operands``), so one
exp-add-reciprocal pass gives the three sigmoids of a step. A cell is one step: its kernels
recompute the gates from ``x`` and ``h`` (two GEMMs) and skip the layer's all-steps
precomputation, which one step cannot amortise.

The forward ops' rules are the backward ops, so ``create_graph`` records them. The backward
ops' own rules (second order) and the forward ops' forward-mode rules run the step-by-step
composition (``reference_layer``, ``reference_cell``: the same math through ``step``, as
ops) under recording and differentiate it: slower, and exact. The nn layers run that
composition directly where the fused ops do not apply (autocast, bfloat16, mixed dtypes).
"""
from tapegrad.backend import array_module
from tapegrad.ops.registry import op, xp, read_bytes, written_bytes
from tapegrad.ops import registry as _registry
from tapegrad.ops.indexing import getitem
from tapegrad.ops.movement import reshape_op as reshape, cat_op, stack_op

GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


# --- the composition: one step as ops (the reference the fused ops are checked against) ---
def step(mode, H, xw, h, c, w_hh_t, b_hh, w_hr_t=None):
    """One time step of a ``mode`` cell with hidden size ``H``, on Tensors: ``xw`` is the
    input's projection (bias included); the hidden and projection weights come transposed.
    Returns ``(h, c)`` (``c`` None but LSTM)."""
    hw = h @ w_hh_t
    if b_hh is not None:
        hw = hw + b_hh
    if mode == "RNN_TANH":
        return (xw + hw).tanh(), None
    if mode == "RNN_RELU":
        return (xw + hw).relu(), None
    if mode == "LSTM":
        gates = xw + hw
        s = gates.sigmoid()  # one op for i, f and o (g's quarter is computed and unused)
        i, f, o = s[:, 0:H], s[:, H:2 * H], s[:, 3 * H:4 * H]
        g = gates[:, 2 * H:3 * H].tanh()
        c = f * c + i * g
        h = o * c.tanh()
        return (h if w_hr_t is None else h @ w_hr_t), c
    rz = (hw[:, 0:2 * H] + xw[:, 0:2 * H]).sigmoid()
    r, z = rz[:, 0:H], rz[:, H:2 * H]
    n = (xw[:, 2 * H:3 * H] + hw[:, 2 * H:3 * H] * r).tanh()
    return (h - n) * z + n, None


def reference_layer(xw, h0, c0, w_hh, b_hh, w_hr, mode, reverse=False):
    """``rnn_layer`` as a composition of ops (Tensors in, the same packed output)."""
    H = w_hh.shape[0] // GATES[mode]
    w_hh_t = w_hh.T
    w_hr_t = None if w_hr is None else w_hr.T
    steps = xw.shape[0]
    hs, cs = [None] * steps, [None] * steps
    h, c = h0, c0
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        h, c = step(mode, H, xw[t], h, c, w_hh_t, b_hh, w_hr_t)
        hs[t], cs[t] = h, c
    out = stack_op(hs, dim=0)
    return cat_op([out, stack_op(cs, dim=0)], dim=2) if mode == "LSTM" else out


def reference_cell(x, h, c, w_ih, w_hh, b_ih, b_hh, mode):
    """``rnn_cell`` as a composition of ops."""
    xw = x @ w_ih.T
    if b_ih is not None:
        xw = xw + b_ih
    h, c = step(mode, w_hh.shape[1], xw, h, c, w_hh.T, b_hh)
    return cat_op([h, c], dim=1) if mode == "LSTM" else h


# --- checks --------------------------------------------------------------------------------
def _shape_error(name, what, arrays):
    shapes = ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in arrays if a is not None)
    return ValueError(f"{name}: {what} (inputs: {shapes})")


def _check_layer(name, xw, h0, c0, w_hh, b_hh, w_hr, mode):
    arrays = (xw, h0, c0, w_hh, b_hh, w_hr)
    if mode not in GATES:
        raise ValueError(f"{name}: unknown mode {mode!r} (expected one of {sorted(GATES)})")
    if xw.ndim != 3 or h0.ndim != 2 or w_hh.ndim != 2:
        raise _shape_error(name, "expected xw (T, B, gates * H), h0 (B, P), w_hh "
                           "(gates * H, P)", arrays)
    steps, batch, width = xw.shape
    G = w_hh.shape[0]
    if G % GATES[mode] or width != G or h0.shape != (batch, w_hh.shape[1]):
        raise _shape_error(name, f"shapes do not fit a {mode} layer", arrays)
    H = G // GATES[mode]
    if (mode == "LSTM") != (c0 is not None) or (c0 is not None and c0.shape != (batch, H)):
        raise _shape_error(name, "c0 (B, H) is given for LSTM and only for LSTM", arrays)
    if b_hh is not None and b_hh.shape != (G,):
        raise _shape_error(name, "b_hh must be (gates * H,)", arrays)
    P = H if w_hr is None else w_hr.shape[0]
    if w_hr is not None and (mode != "LSTM" or w_hr.shape != (P, H)):
        raise _shape_error(name, "w_hr (P, H) is for LSTM only", arrays)
    if w_hh.shape[1] != P:
        raise _shape_error(name, "w_hh's width must be the state size", arrays)
    if steps == 0:
        raise _shape_error(name, "expected at least one time step", arrays)
    dt = xw.dtype
    if dt.kind != "f" or any(a is not None and a.dtype != dt for a in arrays):
        raise _shape_error(name, "expected floating inputs of one dtype", arrays)
    return steps, batch, G, H, P


# --- numpy kernels ---------------------------------------------------------------------------
def _sigmoid_(a):
    """``a = 1 / (1 + exp(-a))`` in place (as PyTorch's formula; exp overflowing to inf for
    very negative a gives the exact limit 0, so callers silence the overflow warning)."""
    m = array_module(a)
    m.negative(a, out=a)
    m.exp(a, out=a)
    a += 1
    m.reciprocal(a, out=a)


def _sigmoid_of_negated_(a):
    """``a = 1 / (1 + exp(a))``: the sigmoid of ``-a`` in place, one pass fewer than
    ``_sigmoid_`` (the LSTM kernels negate the sigmoid gates' weights once instead)."""
    m = array_module(a)
    m.exp(a, out=a)
    a += 1
    m.reciprocal(a, out=a)


def _lstm_operands(m, xw, w_hh, b_hh, H):
    """``(w_t, xwb)``: ``w_hh^T`` and ``xw + b_hh`` with the gates reordered (i, f, o, g) and
    the sigmoid gates' columns negated, so that each step's ``h w_t + xwb`` holds ``-pre``
    for i, f and o in one contiguous block (one exp-add-reciprocal pass gives their sigmoids)
    and ``pre`` for g. Negation is exact, so these are the pre-activations bit for bit."""
    w_t = m.empty((w_hh.shape[1], 4 * H), w_hh.dtype)
    xwb = m.empty(xw.shape, xw.dtype)
    # (slices, not an index array: a cell pays this every step)
    for dst, src, negate in ((slice(0, 2 * H), slice(0, 2 * H), True),
                             (slice(2 * H, 3 * H), slice(3 * H, 4 * H), True),
                             (slice(3 * H, 4 * H), slice(2 * H, 3 * H), False)):
        xb = xwb[..., dst]
        if b_hh is not None:
            m.add(xw[..., src], b_hh[src], out=xb)
        else:
            xb[...] = xw[..., src]
        if negate:
            m.negative(w_hh[src].T, out=w_t[:, dst])
            m.negative(xb, out=xb)
        else:
            w_t[:, dst] = w_hh[src].T
    return w_t, xwb


def _order(steps, reverse):
    return range(steps - 1, -1, -1) if reverse else range(steps)


def _layer_forward(xw, h0, c0, w_hh, b_hh, w_hr, mode, reverse):
    steps, batch, G, H, P = _check_layer("rnn_layer", xw, h0, c0, w_hh, b_hh, w_hr, mode)
    m = array_module(xw)
    dt = xw.dtype
    lstm = mode == "LSTM"
    out = m.empty((steps, batch, P + H if lstm else H), dt)
    w_t = m.ascontiguousarray(w_hh.T)
    h, c = h0, c0
    with xp.errstate(over="ignore"):
        if lstm:
            w_t, xwb = _lstm_operands(m, xw, w_hh, b_hh, H)
            gates = m.empty((batch, G), dt)
            ig = m.empty((batch, H), dt)
            tg = m.empty((batch, H), dt)
            w_hr_t = None if w_hr is None else m.ascontiguousarray(w_hr.T)
            mh = None if w_hr is None else m.empty((batch, H), dt)
            i, f, o, g = (gates[:, k * H:(k + 1) * H] for k in range(4))
            for t in _order(steps, reverse):
                m.matmul(h, w_t, out=gates)
                gates += xwb[t]
                m.tanh(g, out=tg)
                # over the whole contiguous buffer (g's quarter computed, unused): faster
                # than over the strided i, f, o block
                _sigmoid_of_negated_(gates)
                ct = out[t, :, P:]
                m.multiply(f, c, out=ct)
                m.multiply(i, tg, out=ig)
                ct += ig
                ht = out[t, :, :P]
                if w_hr is None:
                    m.tanh(ct, out=ht)
                    ht *= o
                else:
                    m.tanh(ct, out=mh)
                    mh *= o
                    m.matmul(mh, w_hr_t, out=ht)
                h, c = ht, ct
        elif mode == "GRU":
            hw = m.empty((batch, G), dt)
            rz = m.empty((batch, 2 * H), dt)
            n = m.empty((batch, H), dt)
            r, z = rz[:, :H], rz[:, H:]
            for t in _order(steps, reverse):
                m.matmul(h, w_t, out=hw)
                if b_hh is not None:
                    hw += b_hh
                x = xw[t]
                m.add(hw[:, :2 * H], x[:, :2 * H], out=rz)
                _sigmoid_(rz)
                m.multiply(hw[:, 2 * H:], r, out=n)
                n += x[:, 2 * H:]
                m.tanh(n, out=n)
                ht = out[t]
                m.subtract(h, n, out=ht)
                ht *= z
                ht += n
                h = ht
        else:
            relu = mode == "RNN_RELU"
            for t in _order(steps, reverse):
                ht = out[t]
                m.matmul(h, w_t, out=ht)
                if b_hh is not None:
                    ht += b_hh
                ht += xw[t]
                if relu:
                    m.maximum(ht, 0, out=ht)
                else:
                    m.tanh(ht, out=ht)
                h = ht
    return out


def _previous(first, seq, reverse):
    """The state each step starts from: ``first`` then ``seq`` shifted by one step."""
    prev = array_module(seq).empty(seq.shape, seq.dtype)
    if reverse:
        prev[-1] = first
        prev[:-1] = seq[1:]
    else:
        prev[0] = first
        prev[1:] = seq[:-1]
    return prev


def _layer_backward(g, xw, h0, c0, w_hh, b_hh, w_hr, out, mode, reverse, flat=None):
    """The gradients of ``rnn_layer`` w.r.t. each of its inputs given ``g`` (the packed
    output's gradient), concatenated flat in input order (None inputs have none)."""
    steps, batch, G, H, P = _check_layer("rnn_layer_backward", xw, h0, c0, w_hh, b_hh,
                                         w_hr, mode)
    m = array_module(xw)
    dt = xw.dtype
    rows = steps * batch
    if flat is None:
        flat = m.empty(sum(a.size for a in (xw, h0, c0, w_hh, b_hh, w_hr) if a is not None),
                       dt)
    grads, at = [], 0
    for a in (xw, h0, c0, w_hh, b_hh, w_hr):
        if a is None:
            grads.append(None)
            continue
        grads.append(flat[at:at + a.size].reshape(a.shape))
        at += a.size
    gxw, gh0, gc0, gw_hh, gb_hh, gw_hr = grads
    lstm = mode == "LSTM"
    hseq = out[..., :P] if lstm else out
    hprev = _previous(h0, hseq, reverse)
    hprev2 = hprev.reshape(rows, P)
    carry = gh0  # d loss / d h_{t-1} through the recurrence, written in place each step
    carry[...] = 0
    with xp.errstate(over="ignore"):
        if lstm:
            # the activations of every step at once (the forward's per-step GEMMs as one),
            # in _lstm_operands' layout: i, f, o, g
            w_t, xwb = _lstm_operands(m, xw, w_hh, b_hh, H)
            a = m.matmul(hprev2, w_t).reshape(steps, batch, G)
            a += xwb
            ga = m.tanh(a[..., 3 * H:])
            _sigmoid_of_negated_(a)  # (g's quarter computed, unused: contiguous is faster)
            o = a[..., 2 * H:3 * H]
            cseq = out[..., P:]
            cprev = _previous(c0, cseq, reverse)
            tc = m.tanh(cseq)
            # per step, gate k's pre-activation gradient is dc (i, f, g) or dm (o) times a
            # factor that does not depend on the gradients: the other operand of its product
            # times its activation's derivative, s (1 - s) or 1 - tanh^2. All steps at once:
            i, f = a[..., :H], a[..., H:2 * H]
            fac = m.empty((steps, batch, 3, H), dt)  # i, f, g: (g, c_prev, i) * derivative
            der = m.subtract(1, i)
            der *= i
            m.multiply(der, ga, out=fac[:, :, 0])
            m.subtract(1, f, out=der)
            der *= f
            m.multiply(der, cprev, out=fac[:, :, 1])
            m.multiply(ga, ga, out=der)
            m.subtract(1, der, out=der)
            m.multiply(der, i, out=fac[:, :, 2])
            fac_o = m.subtract(1, o)  # o: tanh(c) * o (1 - o)
            fac_o *= o
            fac_o *= tc
            od = m.multiply(tc, tc)  # o (1 - tanh(c)^2): dc per unit of dm
            m.subtract(1, od, out=od)
            od *= o
            gh, gc = g[..., :P], g[..., P:]
            gx4 = gxw.reshape(steps, batch, 4, H)  # a view: gxw is a contiguous slice of flat
            dc = gc0
            dc[...] = 0
            dc3 = dc[:, None, :]
            dh = m.empty((batch, P), dt)
            dm = m.empty((batch, H), dt) if w_hr is not None else None
            tmp = m.empty((batch, H), dt)
            dh_all = m.empty((steps, batch, P), dt) if w_hr is not None else None
            for t in _order(steps, not reverse):
                m.add(gh[t], carry, out=dh)
                if w_hr is None:
                    dmt = dh
                else:
                    dh_all[t] = dh
                    m.matmul(dh, w_hr, out=dm)
                    dmt = dm
                m.multiply(dmt, od[t], out=tmp)
                dc += gc[t]
                dc += tmp
                m.multiply(dc3, fac[t], out=gx4[t, :, :3])
                m.multiply(dmt, fac_o[t], out=gx4[t, :, 3])
                dc *= f[t]
                m.matmul(gxw[t], w_hh, out=carry)
            ghw = gxw
            if w_hr is not None:
                mh = m.multiply(o, tc)
                m.matmul(dh_all.reshape(rows, P).T, mh.reshape(rows, H), out=gw_hr)
        elif mode == "GRU":
            # every step's hidden projection at once (the forward's per-step GEMMs as one)
            hw = m.matmul(hprev2, m.ascontiguousarray(w_hh.T)).reshape(steps, batch, G)
            if b_hh is not None:
                hw += b_hh
            rz = m.add(hw[..., :2 * H], xw[..., :2 * H])
            _sigmoid_(rz)
            r, z = rz[..., :H], rz[..., H:]
            hn = hw[..., 2 * H:]
            n = m.multiply(hn, r)
            n += xw[..., 2 * H:]
            m.tanh(n, out=n)
            drz = m.subtract(1, rz)
            drz *= rz  # s (1 - s) for r and z
            dn = m.multiply(n, n)
            m.subtract(1, dn, out=dn)
            dn *= 1 - z  # d h / d (n's pre-activation): (1 - z)(1 - n^2)
            hmn = m.subtract(hprev, n)
            ghw = m.empty((steps, batch, G), dt)
            dh = m.empty((batch, H), dt)
            for t in _order(steps, not reverse):
                m.add(g[t], carry, out=dh)
                gt, ht_ = gxw[t], ghw[t]
                gn = gt[:, 2 * H:]
                m.multiply(dh, dn[t], out=gn)
                m.multiply(gn, r[t], out=ht_[:, 2 * H:])
                m.multiply(gn, hn[t], out=gt[:, :H])
                m.multiply(dh, hmn[t], out=gt[:, H:2 * H])
                gt[:, :2 * H] *= drz[t]
                ht_[:, :2 * H] = gt[:, :2 * H]
                m.matmul(ht_, w_hh, out=carry)
                dh *= z[t]
                carry += dh
        else:
            d = (hseq > 0).astype(dt) if mode == "RNN_RELU" else 1 - hseq * hseq
            for t in _order(steps, not reverse):
                gt = gxw[t]
                m.add(g[t], carry, out=gt)
                gt *= d[t]
                m.matmul(gt, w_hh, out=carry)
            ghw = gxw
    ghw2 = ghw.reshape(rows, G)
    m.matmul(ghw2.T, hprev2, out=gw_hh)
    if b_hh is not None:
        ghw2.sum(axis=0, out=gb_hh)
    return flat


# --- the ops ---------------------------------------------------------------------------------
def _cut(flat, inputs, needs):
    """Views of ``flat``'s consecutive pieces shaped as ``inputs`` (None where an input is
    None or its gradient is not wanted), through ops so ``create_graph`` records them."""
    recorded = isinstance(flat, _registry.Tensor)  # else plain views (no op-call overhead)
    grads, at = [], 0
    for a, want in zip(inputs, needs):
        if a is None:
            grads.append(None)
            continue
        size = 1
        for s in a.shape:
            size *= s
        if not want:
            grads.append(None)
        elif recorded:
            grads.append(reshape(getitem(flat, index=(slice(at, at + size),)),
                                 shape=tuple(a.shape)))
        else:
            grads.append(flat[at:at + size].reshape(a.shape))
        at += size
    return grads


@op(saves="both", needs=True, fused=True)
def rnn_layer(xw, h0, c0, w_hh, b_hh, w_hr, mode, reverse=False):
    """One recurrent layer in one direction over all time steps: ``xw`` (T, B, gates * H) the
    input projections with ``b_ih`` added, ``h0`` (B, P), ``c0`` (B, H) for LSTM else None,
    ``w_hh`` (gates * H, P), ``b_hh`` or None, ``w_hr`` (P, H) for a projected LSTM else None.
    Returns (T, B, P + H) for LSTM (each step's h, then c), else (T, B, H). ``reverse`` runs
    from the last step to the first (the backward direction of a bidirectional layer)."""
    return _layer_forward(xw, h0, c0, w_hh, b_hh, w_hr, mode, reverse)


@rnn_layer.grad
def _(g, out, xw, h0, c0, w_hh, b_hh, w_hr, mode, reverse=False, needs=(True,) * 6):
    flat = rnn_layer_backward(g, xw, h0, c0, w_hh, b_hh, w_hr, out, mode=mode,
                              reverse=reverse)
    return tuple(_cut(flat, (xw, h0, c0, w_hh, b_hh, w_hr), needs))


@op(saves="inputs", fused=True)
def rnn_layer_backward(g, xw, h0, c0, w_hh, b_hh, w_hr, out, mode, reverse=False):
    """``rnn_layer``'s gradients for ``g``, back through time by hand: one flat buffer holding
    the gradient of xw, h0, c0, w_hh, b_hh, w_hr in turn (those that are not None)."""
    if g.shape != out.shape or g.dtype != out.dtype:
        raise _shape_error("rnn_layer_backward", "g must match the layer's output", (g, out))
    return _layer_backward(g, xw, h0, c0, w_hh, b_hh, w_hr, out, mode, reverse)


@op(saves="both", needs=True, fused=True)
def rnn_cell(x, h, c, w_ih, w_hh, b_ih, b_hh, mode):
    """One step of an RNN/LSTM/GRU cell: ``x`` (B, I), ``h`` (B, H), ``c`` (B, H) for LSTM else
    None, weights (gates * H, I) and (gates * H, H), biases or None. Returns (B, 2H) for LSTM
    (h', then c'), else h' (B, H)."""
    xw = _cell_projection("rnn_cell", x, w_ih, b_ih, w_hh)
    _check_layer("rnn_cell", xw[None], h, c, w_hh, b_hh, None, mode)
    with xp.errstate(over="ignore"):
        return _cell_activations(xw, h, c, w_hh, b_hh, mode)[0]


@rnn_cell.grad
def _(g, out, x, h, c, w_ih, w_hh, b_ih, b_hh, mode, needs=(True,) * 7):
    flat = rnn_cell_backward(g, x, h, c, w_ih, w_hh, b_ih, b_hh, out, mode=mode)
    return tuple(_cut(flat, (x, h, c, w_ih, w_hh, b_ih, b_hh), needs))


@op(saves="inputs", fused=True)
def rnn_cell_backward(g, x, h, c, w_ih, w_hh, b_ih, b_hh, out, mode):
    """``rnn_cell``'s gradients for ``g``: one flat buffer holding the gradient of x, h, c,
    w_ih, w_hh, b_ih, b_hh in turn (those that are not None)."""
    if g.shape != out.shape or g.dtype != out.dtype:
        raise _shape_error("rnn_cell_backward", "g must match the cell's output", (g, out))
    m = array_module(x)
    if mode not in GATES:
        raise ValueError(f"rnn_cell_backward: unknown mode {mode!r}")
    # (the forward checked the shapes; dispatch names the op if a direct call's do not fit)
    flat = m.empty(sum(a.size for a in (x, h, c, w_ih, w_hh, b_ih, b_hh) if a is not None),
                   x.dtype)
    grads, at = [], 0
    for a in (x, h, c, w_ih, w_hh, b_ih, b_hh):
        grads.append(None if a is None else flat[at:at + a.size].reshape(a.shape))
        at += 0 if a is None else a.size
    gx, gh, gc, gw_ih, gw_hh, gb_ih, gb_hh = grads
    H = w_hh.shape[1]
    if mode in ("LSTM", "GRU"):  # the gates, again (an RNN cell's derivative is its output's)
        xw = _cell_projection("rnn_cell_backward", x, w_ih, b_ih, w_hh)
        with xp.errstate(over="ignore"):
            _, saved = _cell_activations(xw, h, c, w_hh, b_hh, mode, state=False)
    if mode == "LSTM":
        s, tg = saved  # the gates' sigmoids (g's quarter unused) and tanh of g's
        i, f, o = s[:, :H], s[:, H:2 * H], s[:, 3 * H:]
        dh, dc_out = g[:, :H], g[:, H:]
        tc = m.tanh(out[:, H:])
        dxw = m.empty(xw.shape, xw.dtype)  # the gates' pre-activation gradient
        dc = m.multiply(tc, tc)
        m.subtract(1, dc, out=dc)
        dc *= o
        dc *= dh
        dc += dc_out
        m.multiply(dc, tg, out=dxw[:, :H])
        m.multiply(dc, c, out=dxw[:, H:2 * H])
        m.multiply(dc, i, out=dxw[:, 2 * H:3 * H])
        m.multiply(dh, tc, out=dxw[:, 3 * H:])
        ds = m.subtract(1, s)  # s (1 - s), and 1 - tanh(g)^2 in g's quarter
        ds *= s
        dg = ds[:, 2 * H:3 * H]
        m.multiply(tg, tg, out=dg)
        m.subtract(1, dg, out=dg)
        dxw *= ds
        m.multiply(dc, f, out=gc)
        dhw = dxw
        m.matmul(dhw, w_hh, out=gh)
    elif mode == "GRU":
        rz, n, hn = saved
        r, z = rz[:, :H], rz[:, H:]
        dh = g
        dxw = m.empty(xw.shape, xw.dtype)
        dhw = m.empty(xw.shape, xw.dtype)
        gn = dxw[:, 2 * H:]
        m.multiply(n, n, out=gn)
        m.subtract(1, gn, out=gn)
        gn *= 1 - z
        gn *= dh
        m.multiply(gn, r, out=dhw[:, 2 * H:])
        m.multiply(gn, hn, out=dxw[:, :H])
        m.subtract(h, n, out=dxw[:, H:2 * H])
        dxw[:, H:2 * H] *= dh
        drz = m.subtract(1, rz)
        drz *= rz
        dxw[:, :2 * H] *= drz
        dhw[:, :2 * H] = dxw[:, :2 * H]
        m.matmul(dhw, w_hh, out=gh)
        gh += dh * z
    else:
        dxw = (out > 0).astype(out.dtype) if mode == "RNN_RELU" else 1 - out * out
        dxw *= g
        dhw = dxw
        m.matmul(dhw, w_hh, out=gh)
    m.matmul(dxw, w_ih, out=gx)
    m.matmul(dxw.T, x, out=gw_ih)
    m.matmul(dhw.T, h, out=gw_hh)
    if b_ih is not None:
        dxw.sum(axis=0, out=gb_ih)
    if b_hh is not None:
        dhw.sum(axis=0, out=gb_hh)
    return flat


def _cell_activations(xw, h, c, w_hh, b_hh, mode, state=True):
    """One step from ``xw`` (consumed: its buffer is reused): ``(out, saved)``, ``saved``
    what the cell's backward reads besides the output (``out`` None without ``state``: the
    backward has it). The gates are added as PyTorch's cells add them,
    ``(x W_ih^T + b_ih) + (h W_hh^T + b_hh)``."""
    m = array_module(xw)
    H = w_hh.shape[1]
    hw = m.matmul(h, w_hh.T)
    if b_hh is not None:
        hw += b_hh
    if mode == "LSTM":
        gates = xw
        gates += hw
        tg = m.tanh(gates[:, 2 * H:3 * H])
        _sigmoid_(gates)  # one pass for i, f and o (g's quarter: computed, unused)
        if not state:
            return None, (gates, tg)
        out = m.empty((xw.shape[0], 2 * H), xw.dtype)
        hn, cn = out[:, :H], out[:, H:]
        m.multiply(gates[:, H:2 * H], c, out=cn)
        m.multiply(gates[:, :H], tg, out=hn)
        cn += hn
        m.tanh(cn, out=hn)
        hn *= gates[:, 3 * H:]
        return out, (gates, tg)
    if mode == "GRU":
        rz = m.add(xw[:, :2 * H], hw[:, :2 * H])
        _sigmoid_(rz)
        hn = hw[:, 2 * H:]
        n = m.multiply(rz[:, :H], hn)
        n += xw[:, 2 * H:]
        m.tanh(n, out=n)
        if not state:
            return None, (rz, n, hn)
        out = m.subtract(h, n)
        out *= rz[:, H:]
        out += n
        return out, (rz, n, hn)
    out = xw
    out += hw
    if mode == "RNN_RELU":
        m.maximum(out, 0, out=out)
    else:
        m.tanh(out, out=out)
    return out, None


def _cell_projection(name, x, w_ih, b_ih, w_hh):
    if x.ndim != 2 or w_ih.ndim != 2 or x.shape[1] != w_ih.shape[1] \
            or w_ih.shape[0] != w_hh.shape[0]:
        raise _shape_error(name, "expected x (B, I), w_ih (gates * H, I), w_hh "
                           "(gates * H, H)", (x, w_ih, w_hh))
    if x.dtype != w_ih.dtype or (b_ih is not None and b_ih.dtype != x.dtype):
        raise _shape_error(name, "expected floating inputs of one dtype", (x, w_ih, b_ih))
    xw = array_module(x).matmul(x, w_ih.T)
    if b_ih is not None:
        xw += b_ih
    return xw


# --- second order and forward mode: through the composition -----------------------------
def _stand_ins(values):
    """Tensors to differentiate with respect to, one per value (None stays None): a fresh
    leaf for an array or a Tensor that needs no gradient, else a recorded alias of the
    Tensor, so that a gradient w.r.t. it is the partial derivative along the paths through
    it only (never through another argument computed from the same Tensor), and the result
    stays connected to the Tensor's graph for the next order."""
    T = _registry.Tensor
    out = []
    for a in values:
        if a is None:
            out.append(None)
        elif not isinstance(a, T):
            out.append(T._make(a).requires_grad_())
        elif not a._requires_grad:
            out.append(a.detach().requires_grad_())
        else:
            out.append(reshape(a, shape=tuple(a.shape)))
    return out


def _flat_vjp(reference, g, ps):
    """vjp(reference)(ps; g) for the non-None ``ps``, flattened as a backward op lays it out
    (recorded, so it can be differentiated again)."""
    from tapegrad.autograd import grad

    present = [p for p in ps if p is not None]
    first = grad(reference(*ps), present, g, create_graph=True, allow_unused=True,
                 materialize_grads=True)
    return cat_op([reshape(f, shape=(-1,)) for f in first], dim=0)


def _vjp_of_vjp(reference, gg, g, primals):
    """Gradients of ``<gg, vjp(reference)(primals; g)>`` w.r.t. ``g`` and each primal (None
    for a None primal): a backward op's rule, by differentiating the composition twice. With
    Tensor arguments (``create_graph``) the result is recorded, so higher orders work too."""
    from tapegrad.autograd import grad
    from tapegrad.autograd.grad_mode import enable_grad

    T = _registry.Tensor
    create = any(isinstance(a, T) for a in (gg, g, *primals))
    with enable_grad():
        gt, *ps = _stand_ins((g, *primals))
        flat = _flat_vjp(reference, gt, ps)
        total = (flat * (gg if isinstance(gg, T) else T._make(gg))).sum()
        wrt = [gt] + [p for p in ps if p is not None]
        second = iter(grad(total, wrt, create_graph=create, allow_unused=True,
                           materialize_grads=True))
    result = [next(second)] + [None if p is None else next(second) for p in ps]
    return [r if r is None or create else r._data for r in result]


def _jvp_by_composition(reference, tangents, primals):
    """``J t`` of ``reference`` at ``primals``: the transpose of its VJP (linear in u), by
    reverse mode twice over the composition. Arrays in, an array out; Tensors, a Tensor."""
    from tapegrad.autograd import grad
    from tapegrad.autograd.grad_mode import enable_grad

    T = _registry.Tensor
    used = [i for i, (p, t) in enumerate(zip(primals, tangents))
            if p is not None and t is not None]
    if not used:
        return None
    raw = not any(isinstance(a, T) for a in (*primals, *tangents))
    with enable_grad():
        ps = _stand_ins(primals)
        y = reference(*ps)
        u = T._make(array_module(y._data).zeros(y.shape, y._data.dtype)).requires_grad_()
        vjps = grad(y, [ps[i] for i in used], u, create_graph=True, allow_unused=True,
                    materialize_grads=True)
        total = None
        for v, i in zip(vjps, used):
            t = tangents[i]
            term = (v * (t if isinstance(t, T) else T._make(t))).sum()
            total = term if total is None else total + term
        (jvp,) = grad(total, [u], create_graph=not raw, allow_unused=True,
                      materialize_grads=True)
    return jvp._data if raw else jvp


@rnn_layer_backward.grad
def _(gg, out, g, xw, h0, c0, w_hh, b_hh, w_hr, y, mode, reverse=False):
    def reference(*ps):
        return reference_layer(*ps, mode=mode, reverse=reverse)
    grads = _vjp_of_vjp(reference, gg, g, (xw, h0, c0, w_hh, b_hh, w_hr))
    return (*grads, None)  # y is a function of the inputs, differentiated through them


@rnn_cell_backward.grad
def _(gg, out, g, x, h, c, w_ih, w_hh, b_ih, b_hh, y, mode):
    def reference(*ps):
        return reference_cell(*ps, mode=mode)
    return (*_vjp_of_vjp(reference, gg, g, (x, h, c, w_ih, w_hh, b_ih, b_hh)), None)


@rnn_layer.jvp
def _(t, out, xw, h0, c0, w_hh, b_hh, w_hr, mode, reverse=False):
    return _jvp_by_composition(
        lambda *ps: reference_layer(*ps, mode=mode, reverse=reverse), t,
        (xw, h0, c0, w_hh, b_hh, w_hr))


@rnn_cell.jvp
def _(t, out, x, h, c, w_ih, w_hh, b_ih, b_hh, mode):
    return _jvp_by_composition(lambda *ps: reference_cell(*ps, mode=mode), t,
                               (x, h, c, w_ih, w_hh, b_ih, b_hh))


def _backward_jvp(reference, nprimal):
    """Forward mode of a backward op ``F(g, primals) = vjp(reference)(primals; g)``: the JVP
    of that VJP of the composition (reverse mode three times over it; exact, and slow)."""
    def rule(t, out, g, *rest, **params):
        def vjp(gv, *ps):
            return _flat_vjp(lambda *qs: reference(*qs, **params), gv, ps)
        return _jvp_by_composition(vjp, t[:nprimal + 1], (g, *rest[:nprimal]))
    return rule


rnn_layer_backward.jvp(_backward_jvp(reference_layer, 6))
rnn_cell_backward.jvp(_backward_jvp(reference_cell, 7))


# --- costs -----------------------------------------------------------------------------------
def _layer_cost(arrays, out, params):
    xw, h0 = arrays[0], arrays[1]
    steps, batch, G = xw.shape
    # the recurrent GEMMs (2 per multiply-add), a projection's, and ~10 per gate element
    flops = 2 * steps * batch * G * h0.shape[1] + 10 * steps * batch * G
    if arrays[5] is not None:
        flops += 2 * steps * batch * arrays[5].size
    return flops, read_bytes([a for a in arrays if a is not None]), written_bytes(out)


def _cell_cost(arrays, out, params):
    x, w_ih, w_hh = arrays[0], arrays[3], arrays[4]
    batch, G = x.shape[0], w_ih.shape[0]
    flops = 2 * batch * G * (x.shape[1] + w_hh.shape[1]) + 10 * batch * G
    return flops, read_bytes([a for a in arrays if a is not None]), written_bytes(out)


rnn_layer.costs(_layer_cost)
rnn_cell.costs(_cell_cost)
# backward: recomputing the gates, the gradient recurrence and the weight GEMMs (~3x forward)
rnn_layer_backward.costs(lambda arrays, out, params: (
    3 * _layer_cost(arrays[1:7], out, params)[0], read_bytes([a for a in arrays if a is not None]),
    written_bytes(out)))
rnn_cell_backward.costs(lambda arrays, out, params: (
    3 * _cell_cost(arrays[1:8], out, params)[0], read_bytes([a for a in arrays if a is not None]),
    written_bytes(out)))


# --- vmap: the mapped dim folds into the batch ---------------------------------------------
def _batch_size(args, bdims):
    return next(a.shape[b] for a, b in zip(args, bdims) if b is not None)


def _fold(a, b, size, batch_dim):
    """Physical ``a`` (batch dim ``b``, None: unbatched) with the vmapped dim merged into its
    logical dim ``batch_dim`` (the RNN batch), mapped element outermost."""
    R = _registry.REGISTRY
    if a is None:
        return None
    if b is None:
        shape = tuple(a.shape)
        a = R["broadcast_to"](R["reshape"](a, shape=(1,) + shape), shape=(size,) + shape)
    elif b != 0:
        a = R["permute"](a, dims=(b,) + tuple(d for d in range(a.dim()) if d != b))
    if batch_dim:  # (V, T, B, S) -> (T, V, B, S)
        a = R["permute"](a, dims=(1, 0) + tuple(range(2, a.dim())))
    shape = tuple(a.shape)
    return R["reshape"](a, shape=shape[:batch_dim] + (-1,) + shape[batch_dim + 2:])


def _unfold(a, size, batch_dim):
    shape = tuple(a.shape)
    return _registry.REGISTRY["reshape"](
        a, shape=shape[:batch_dim] + (size, shape[batch_dim] // size) + shape[batch_dim + 1:])


@rnn_layer.batch
def _(args, bdims, mode, reverse=False):
    # shared weights: the mapped elements are more rows of the batch, one op for them all
    if any(b is not None for b in bdims[3:]):
        return NotImplemented
    size = _batch_size(args, bdims)
    xw, h0, c0 = (_fold(a, b, size, d) for a, b, d in zip(args[:3], bdims[:3], (1, 0, 0)))
    out = rnn_layer(xw, h0, c0, *args[3:], mode=mode, reverse=reverse)
    return _unfold(out, size, 1), 1


@rnn_cell.batch
def _(args, bdims, mode):
    if any(b is not None for b in bdims[3:]):
        return NotImplemented
    size = _batch_size(args, bdims)
    x, h, c = (_fold(a, b, size, 0) for a, b in zip(args[:3], bdims[:3]))
    return _unfold(rnn_cell(x, h, c, *args[3:], mode=mode), size, 0), 0


def _per_element_weight_grads(ghw, hprev, size, with_bias):
    """Each mapped element's ``sum_{t, b} ghw^T hprev`` (and ``sum ghw``): the weight
    gradients that folding into the batch would have summed over the elements."""
    R = _registry.REGISTRY
    ghw, hprev = _unfold(ghw, size, 1), _unfold(hprev, size, 1)  # (T, V, B, .)
    gw = R["einsum"]([ghw, hprev], equation="tvbg,tvbp->vgp")
    gb = R["sum"](ghw, dims=(0, 2)) if with_bias else None
    return gw, gb


def _hidden_side_grad(mode, gxw, hprev, xw, w_hh, b_hh):
    """The gradient of the hidden-side pre-activations ``hprev @ w_hh.T + b_hh`` from the
    input side's ``gxw``: the same, except a GRU's n gate, whose hidden term is scaled by the
    reset gate r (recomputed from ``hprev`` and ``xw``)."""
    if mode != "GRU":
        return gxw
    R = _registry.REGISTRY
    H = w_hh.shape[0] // 3
    hw = R["matmul"](hprev, R["permute"](w_hh, dims=(1, 0)))
    if b_hh is not None:
        hw = hw + b_hh
    r = R["sigmoid"](getitem(hw, index=(Ellipsis, slice(0, H)))
                     + getitem(xw, index=(Ellipsis, slice(0, H))))
    return cat_op([getitem(gxw, index=(Ellipsis, slice(0, 2 * H))),
                   getitem(gxw, index=(Ellipsis, slice(2 * H, 3 * H))) * r],
                  dim=len(gxw.shape) - 1)


@rnn_layer_backward.batch
def _(args, bdims, mode, reverse=False):
    g, xw, h0, c0, w_hh, b_hh, w_hr, out = args
    if any(b is not None for b in bdims[4:7]) or w_hr is not None:
        return NotImplemented  # per-element weights, or a projection: the loop
    R = _registry.REGISTRY
    size = _batch_size(args, bdims)
    g, xw, out = (_fold(a, b, size, 1) for a, b in ((g, bdims[0]), (xw, bdims[1]),
                                                     (out, bdims[7])))
    h0, c0 = _fold(h0, bdims[2], size, 0), _fold(c0, bdims[3], size, 0)
    flat = rnn_layer_backward(g, xw, h0, c0, w_hh, b_hh, None, out, mode=mode,
                              reverse=reverse)
    gxw, gh0, gc0 = _cut(flat, (xw, h0, c0), (True, True, c0 is not None))
    hseq = getitem(out, index=(Ellipsis, slice(0, h0.shape[-1])))
    first = reshape(h0, shape=(1,) + tuple(h0.shape))
    steps = out.shape[0]
    later = getitem(hseq, index=(slice(1, steps),)) if reverse else \
        getitem(hseq, index=(slice(0, steps - 1),))
    hprev = cat_op([later, first] if reverse else [first, later], dim=0)
    ghw = _hidden_side_grad(mode, gxw, hprev, xw, w_hh, b_hh)
    gw, gb = _per_element_weight_grads(ghw, hprev, size, b_hh is not None)
    pieces = [_unfold(gxw, size, 1), _unfold(gh0, size, 0)]
    pieces[0] = R["permute"](pieces[0], dims=(1, 0, 2, 3))
    if c0 is not None:
        pieces.append(_unfold(gc0, size, 0))
    pieces.append(gw)
    if gb is not None:
        pieces.append(gb)
    return cat_op([reshape(p, shape=(size, -1)) for p in pieces], dim=1), 0


@rnn_cell_backward.batch
def _(args, bdims, mode):
    g, x, h, c, w_ih, w_hh, b_ih, b_hh, out = args
    if any(b is not None for b in bdims[4:8]):
        return NotImplemented
    R = _registry.REGISTRY
    size = _batch_size(args, bdims)
    g, x, h, c, out = (_fold(a, b, size, 0) for a, b in zip((g, x, h, c, out),
                                                            (bdims[0], *bdims[1:4], bdims[8])))
    flat = rnn_cell_backward(g, x, h, c, w_ih, w_hh, b_ih, b_hh, out, mode=mode)
    gx, gh, gc = _cut(flat, (x, h, c), (True, True, c is not None))
    # the cell is a one-step layer: its weight gradients per element, from xw's gradient
    xw = R["linear"](x, w_ih, b_ih) if b_ih is not None else R["linear"](x, w_ih)
    inner = rnn_layer_backward(
        reshape(g, shape=(1,) + tuple(g.shape)), reshape(xw, shape=(1,) + tuple(xw.shape)),
        h, c, w_hh, b_hh, None, reshape(out, shape=(1,) + tuple(out.shape)), mode=mode)
    (gxw,) = _cut(inner, (xw,), (True,))
    hprev = reshape(h, shape=(1,) + tuple(h.shape))
    ghw = _hidden_side_grad(mode, gxw, h, xw, w_hh, b_hh)
    ghw = reshape(ghw, shape=(1,) + tuple(ghw.shape))
    gw_hh, gb_hh = _per_element_weight_grads(ghw, hprev, size, b_hh is not None)
    xs = reshape(x, shape=(1,) + tuple(x.shape))
    gxw1 = reshape(gxw, shape=(1,) + tuple(gxw.shape))
    gw_ih, gb_ih = _per_element_weight_grads(gxw1, xs, size, b_ih is not None)
    pieces = [_unfold(gx, size, 0), _unfold(gh, size, 0)]
    if c is not None:
        pieces.append(_unfold(gc, size, 0))
    pieces += [gw_ih, gw_hh] + [p for p in (gb_ih, gb_hh) if p is not None]
    return cat_op([reshape(p, shape=(size, -1)) for p in pieces], dim=1), 0
