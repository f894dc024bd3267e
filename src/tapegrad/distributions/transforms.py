"""As ``torch.distributions.transforms``: invertible maps with log-det-Jacobians.

``ExpTransform``, ``AffineTransform``, ``SigmoidTransform``, ``TanhTransform``,
``ComposeTransform`` and the inverse ``t.inv`` of each; ``cache_size=1`` keeps the last
``(x, y)`` pair so that ``inv(t(x))`` returns ``x`` exactly (as PyTorch).
"""
import math
import numbers
import weakref

import tapegrad
import tapegrad.nn.functional as F
from tapegrad.backend import xp
from tapegrad.distributions import constraints
from tapegrad.tensor import Tensor

__all__ = ["Transform", "ComposeTransform", "ExpTransform", "AffineTransform",
           "SigmoidTransform", "TanhTransform", "identity_transform"]


class Transform:
    """Base: ``y = t(x)``, ``x = t.inv(y)``, ``t.log_abs_det_jacobian(x, y)``."""

    bijective = False
    domain = constraints.real
    codomain = constraints.real

    def __init__(self, cache_size=0):
        if cache_size not in (0, 1):
            raise ValueError("cache_size must be 0 or 1")
        self._cache_size = cache_size
        self._inv = None
        self._cached_x_y = None, None

    @property
    def event_dim(self):
        if self.domain.event_dim == self.codomain.event_dim:
            return self.domain.event_dim
        raise ValueError("Please use either .domain.event_dim or .codomain.event_dim")

    @property
    def inv(self):
        inv = self._inv() if self._inv is not None else None
        if inv is None:
            inv = _InverseTransform(self)
            self._inv = weakref.ref(inv)
        return inv

    @property
    def sign(self):
        raise NotImplementedError

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        if type(self).__init__ is Transform.__init__:
            return type(self)(cache_size=cache_size)
        raise NotImplementedError(f"{type(self)}.with_cache is not implemented")

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return id(self)

    def __call__(self, x):
        if self._cache_size == 0:
            return self._call(x)
        x_old, y_old = self._cached_x_y
        if x is x_old:
            return y_old
        y = self._call(x)
        self._cached_x_y = x, y
        return y

    def _inv_call(self, y):
        if self._cache_size == 0:
            return self._inverse(y)
        x_old, y_old = self._cached_x_y
        if y is y_old:
            return x_old
        x = self._inverse(y)
        self._cached_x_y = x, y
        return x

    def _call(self, x):
        raise NotImplementedError

    def _inverse(self, y):
        raise NotImplementedError

    def log_abs_det_jacobian(self, x, y):
        raise NotImplementedError

    def forward_shape(self, shape):
        return shape

    def inverse_shape(self, shape):
        return shape

    def __repr__(self):
        return self.__class__.__name__ + "()"


class _InverseTransform(Transform):
    def __init__(self, transform):
        super().__init__(cache_size=transform._cache_size)
        self._inv = transform

    @property
    def domain(self):
        return self._inv.codomain

    @property
    def codomain(self):
        return self._inv.domain

    @property
    def bijective(self):
        return self._inv.bijective

    @property
    def sign(self):
        return self._inv.sign

    @property
    def inv(self):
        return self._inv

    def with_cache(self, cache_size=1):
        return self.inv.with_cache(cache_size).inv

    def __eq__(self, other):
        return isinstance(other, _InverseTransform) and self._inv == other._inv

    def __hash__(self):
        return hash(("inv", self._inv))

    def __repr__(self):
        return f"{self.__class__.__name__}({repr(self._inv)})"

    def __call__(self, x):
        return self._inv._inv_call(x)

    def log_abs_det_jacobian(self, x, y):
        return -self._inv.log_abs_det_jacobian(y, x)

    def forward_shape(self, shape):
        return self._inv.inverse_shape(shape)

    def inverse_shape(self, shape):
        return self._inv.forward_shape(shape)


class ComposeTransform(Transform):
    """Applies ``parts`` in order; the log-det sums the parts' over the right event dims."""

    def __init__(self, parts, cache_size=0):
        if cache_size:
            parts = [part.with_cache(cache_size) for part in parts]
        super().__init__(cache_size=cache_size)
        self.parts = list(parts)

    def __eq__(self, other):
        return isinstance(other, ComposeTransform) and self.parts == other.parts

    def __hash__(self):
        return hash(tuple(self.parts))

    @property
    def domain(self):
        if not self.parts:
            return constraints.real
        domain = self.parts[0].domain
        event_dim = self.parts[-1].codomain.event_dim
        for part in reversed(self.parts):
            event_dim += part.domain.event_dim - part.codomain.event_dim
            event_dim = max(event_dim, part.domain.event_dim)
        if event_dim > domain.event_dim:
            domain = constraints.independent(domain, event_dim - domain.event_dim)
        return domain

    @property
    def codomain(self):
        if not self.parts:
            return constraints.real
        codomain = self.parts[-1].codomain
        event_dim = self.parts[0].domain.event_dim
        for part in self.parts:
            event_dim += part.codomain.event_dim - part.domain.event_dim
            event_dim = max(event_dim, part.codomain.event_dim)
        if event_dim > codomain.event_dim:
            codomain = constraints.independent(codomain, event_dim - codomain.event_dim)
        return codomain

    @property
    def bijective(self):
        return all(p.bijective for p in self.parts)

    @property
    def sign(self):
        sign = 1
        for p in self.parts:
            sign = sign * p.sign
        return sign

    @property
    def inv(self):
        return ComposeTransform([p.inv for p in reversed(self.parts)])

    def __call__(self, x):
        for part in self.parts:
            x = part(x)
        return x

    def log_abs_det_jacobian(self, x, y):
        from tapegrad.distributions.utils import _sum_rightmost
        if not self.parts:
            return tapegrad.zeros_like(x)
        xs = [x]
        for part in self.parts[:-1]:
            xs.append(part(xs[-1]))
        xs.append(y)
        terms = []
        event_dim = self.domain.event_dim
        for part, a, b in zip(self.parts, xs[:-1], xs[1:]):
            terms.append(_sum_rightmost(part.log_abs_det_jacobian(a, b),
                                        event_dim - part.domain.event_dim))
            event_dim += part.codomain.event_dim - part.domain.event_dim
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return total

    def forward_shape(self, shape):
        for part in self.parts:
            shape = part.forward_shape(shape)
        return shape

    def inverse_shape(self, shape):
        for part in reversed(self.parts):
            shape = part.inverse_shape(shape)
        return shape

    def __repr__(self):
        inner = ",\n    ".join(repr(p) for p in self.parts)
        return self.__class__.__name__ + "(\n    " + inner + "\n)"


identity_transform = ComposeTransform([])


class ExpTransform(Transform):
    """``y = exp(x)``."""

    domain = constraints.real
    codomain = constraints.positive
    bijective = True
    sign = +1

    def __eq__(self, other):
        return isinstance(other, ExpTransform)

    def __hash__(self):
        return hash(ExpTransform)

    def _call(self, x):
        return x.exp()

    def _inverse(self, y):
        return y.log()

    def log_abs_det_jacobian(self, x, y):
        return x


class SigmoidTransform(Transform):
    """``y = sigmoid(x)``, clipped into the open unit interval (as PyTorch)."""

    domain = constraints.real
    codomain = constraints.unit_interval
    bijective = True
    sign = +1

    def __eq__(self, other):
        return isinstance(other, SigmoidTransform)

    def __hash__(self):
        return hash(SigmoidTransform)

    def _call(self, x):
        info = xp.finfo(x.dtype.np)
        return tapegrad.clamp(tapegrad.sigmoid(x), min=float(info.tiny),
                              max=1.0 - float(info.eps))

    def _inverse(self, y):
        info = xp.finfo(y.dtype.np)
        y = y.clamp(min=float(info.tiny), max=1.0 - float(info.eps))
        return y.log() - tapegrad.log1p(-y)

    def log_abs_det_jacobian(self, x, y):
        return -F.softplus(-x) - F.softplus(x)


class TanhTransform(Transform):
    """``y = tanh(x)``; the log-det uses the stable ``2 (log 2 - x - softplus(-2x))``."""

    domain = constraints.real
    codomain = constraints.interval(-1.0, 1.0)
    bijective = True
    sign = +1

    def __eq__(self, other):
        return isinstance(other, TanhTransform)

    def __hash__(self):
        return hash(TanhTransform)

    def _call(self, x):
        return x.tanh()

    def _inverse(self, y):
        return 0.5 * (tapegrad.log1p(y) - tapegrad.log1p(-y))

    def log_abs_det_jacobian(self, x, y):
        return 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))


class AffineTransform(Transform):
    """``y = loc + scale * x`` (``event_dim`` trailing dims form one event)."""

    bijective = True

    def __init__(self, loc, scale, event_dim=0, cache_size=0):
        super().__init__(cache_size=cache_size)
        self.loc = loc
        self.scale = scale
        self._event_dim = event_dim

    @property
    def event_dim(self):
        return self._event_dim

    @property
    def domain(self):
        if self._event_dim == 0:
            return constraints.real
        return constraints.independent(constraints.real, self._event_dim)

    @property
    def codomain(self):
        return self.domain

    def with_cache(self, cache_size=1):
        if self._cache_size == cache_size:
            return self
        return AffineTransform(self.loc, self.scale, self._event_dim, cache_size=cache_size)

    def __eq__(self, other):
        if not isinstance(other, AffineTransform):
            return False
        for a, b in ((self.loc, other.loc), (self.scale, other.scale)):
            if isinstance(a, numbers.Number) and isinstance(b, numbers.Number):
                if a != b:
                    return False
            else:
                diff = a - b
                if not bool((xp.asarray(diff._data if isinstance(diff, Tensor) else diff)
                             == 0).all()):
                    return False
        return True

    def __hash__(self):
        return id(self)

    @property
    def sign(self):
        if isinstance(self.scale, numbers.Real):
            return 1 if float(self.scale) > 0 else -1 if float(self.scale) < 0 else 0
        return self.scale.sign()

    def _call(self, x):
        return self.loc + self.scale * x

    def _inverse(self, y):
        return (y - self.loc) / self.scale

    def log_abs_det_jacobian(self, x, y):
        shape = tuple(x.shape)
        scale = self.scale
        if isinstance(scale, numbers.Real):
            result = tapegrad.full_like(x, math.log(abs(scale)))
        else:
            result = tapegrad.abs(scale).log()
        if self._event_dim:
            result = result.reshape(tuple(result.shape[:result.ndim - self._event_dim])
                                    + (-1,)).sum(-1)
            shape = shape[:len(shape) - self._event_dim]
        return result.expand(shape)

    def forward_shape(self, shape):
        return tuple(xp.broadcast_shapes(tuple(shape), tuple(getattr(self.loc, "shape", ())),
                                         tuple(getattr(self.scale, "shape", ()))))

    def inverse_shape(self, shape):
        return self.forward_shape(shape)
