"""The error function as tapegrad computes it (``torch.erf``, exact GELU and its gradient):
Cephes' formulas as array operations in float64, with numpy's own ``exp``.

    |x| <= 1:  x T(x^2) / U(x^2)
    |x| >  1:  sign(x) (1 - exp(-a^2) P(a) / Q(a)),   a = min(|x|, 6)

T, U, P, Q are Cephes' fits (ndtr.c; scipy's ``erf`` is the same algorithm), evaluated by
Horner's rule in Cephes' order. Beyond |x| = 6 erfc(x) < 2^-54, so the result rounds to +-1
exactly (Cephes switches to a third fit at 8 whose values round to the same 1); the clamp
keeps ``P(a)`` finite where a huge |x| would give ``exp(-a^2) P(a) = 0 * inf``.

Why tapegrad's own and not scipy's: scipy evaluates Cephes one element at a time with the C
library's ``exp`` (~15 ns an element here, no vectorisation) and is an optional dependency;
``math.erf`` per element (the fallback without scipy) is slower still. Written as array
operations the same formulas need only numpy, and the compiler's numba kernels reproduce them
bit for bit (``compiler.kernels``, ``erf64``): the one transcendental, ``exp``, is numpy's
ufunc in both (computed by numpy before the kernel runs), the rest is ``+ - * /`` in the same
order, which the kernel's loop vectorises. numpy's SIMD ``exp`` differs from the C library's
by an ulp on a few inputs, so values differ from scipy's by at most an ulp on ~0.1% of inputs
(``tests/ops/test_elementwise.py``: against scipy and ``math.erf``; PyTorch agreement at 1e-12 as
for every op).
"""
from tapegrad.backend import xp

# Cephes ndtr.c: erf = x T(x^2) / U(x^2) on |x| <= 1; erfc = exp(-x^2) P(|x|) / Q(|x|) on
# 1 < |x| < 8 (U and Q monic: their leading 1 is not stored, as Cephes' ``p1evl``)
CEPHES = {
    "T": (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
          7.00332514112805075473E3, 5.55923013010394962768E4),
    "U": (3.35617141647503099647E1, 5.21357949780152679795E2, 4.59432382970980127987E3,
          2.26290000613890934246E4, 4.92673942608635921086E4),
    "P": (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
          4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
          9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2),
    "Q": (1.32281951154744992508E1, 8.67072140885989742329E1, 3.54937778887819891062E2,
          9.75708501743205489753E2, 1.82390916687909736289E3, 2.24633760818710981792E3,
          1.65666309194161350182E3, 5.57535340817727675546E2),
}
CLAMP = 6.0  # |x| beyond which erf(x) rounds to +-1 in float64


def _polevl(x, coeffs, monic, out):
    """Horner's rule into ``out`` in Cephes' order (``p1evl`` when ``monic``)."""
    if monic:
        xp.add(x, coeffs[0], out=out)
    else:
        out.fill(coeffs[0])
    for c in coeffs[1:]:
        xp.multiply(out, x, out=out)
        xp.add(out, c, out=out)
    return out


def erf64(x):
    """erf of a float64 array (any shape, 0-d included), as a new float64 array.

    The small-argument formula runs over every element; the other only over the elements
    with |x| > 1 (gathered, then written back): the same operations per element either way,
    so the values do not depend on which elements share the call."""
    x = xp.asarray(x, dtype=xp.float64)
    shape = x.shape
    x = x.reshape(-1)
    with xp.errstate(over="ignore", invalid="ignore"):  # discarded lanes: inf / inf
        z = x * x
        out = _polevl(z, CEPHES["T"], False, xp.empty_like(z))
        q = _polevl(z, CEPHES["U"], True, xp.empty_like(z))
        xp.multiply(x, out, out=out)
        xp.divide(out, q, out=out)
        big = xp.abs(x) > 1.0  # NaN stays in the first formula: NaN
        if big.any():
            xb = x[big]
            a = xp.minimum(xp.abs(xb), CLAMP)
            e = xp.multiply(-a, a)
            xp.exp(e, out=e)
            xp.multiply(e, _polevl(a, CEPHES["P"], False, xp.empty_like(a)), out=e)
            xp.divide(e, _polevl(a, CEPHES["Q"], True, xp.empty_like(a)), out=e)
            xp.subtract(1.0, e, out=e)
            out[big] = xp.copysign(e, xb, out=e)
    return out.reshape(shape)
