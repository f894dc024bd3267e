"""As ``torch.distributions.constraints``: the regions parameters and samples must lie in.

``constraint.check(value)`` returns a bool Tensor of ``value``'s shape less ``event_dim``
trailing dims; the names, reprs and ``event_dim``/``is_discrete`` are PyTorch's.
"""
from tapegrad.backend import xp
from tapegrad.tensor import Tensor

__all__ = ["Constraint", "boolean", "cat", "dependent", "dependent_property", "greater_than",
           "greater_than_eq", "independent", "integer_interval", "interval",
           "half_open_interval", "is_dependent", "less_than", "lower_cholesky",
           "lower_triangular", "multinomial", "nonnegative", "nonnegative_integer", "one_hot",
           "positive", "positive_semidefinite", "positive_definite", "positive_integer", "real",
           "real_vector", "simplex", "square", "stack", "symmetric", "unit_interval"]


def _array(value):
    return value._data if isinstance(value, Tensor) else xp.asarray(value)


def _bound(b):
    return b._data if isinstance(b, Tensor) else b


def _result(mask):
    return Tensor._make(xp.asarray(mask, dtype=bool))


def _literal(b, value):
    return type(b) in (int, float) and b == value


def _named(name, *tests):
    return name if all(tests) else None


class Constraint:
    """A region over which a variable is valid (``is_discrete``, ``event_dim``, ``check``)."""

    is_discrete = False
    event_dim = 0
    # the name of the ``check_values`` predicate that is this constraint (its check, all
    # over the value), or None: a compiled graph checks each call's values through it
    predicate = None

    def check(self, value):
        raise NotImplementedError

    def __repr__(self):
        return self.__class__.__name__[1:] + "()"


class _Dependent(Constraint):
    """Placeholder for variables whose support depends on other variables."""

    def __init__(self, *, is_discrete=NotImplemented, event_dim=NotImplemented):
        self._is_discrete = is_discrete
        self._event_dim = event_dim
        super().__init__()

    @property
    def is_discrete(self):
        if self._is_discrete is NotImplemented:
            raise NotImplementedError(".is_discrete cannot be determined statically")
        return self._is_discrete

    @property
    def event_dim(self):
        if self._event_dim is NotImplemented:
            raise NotImplementedError(".event_dim cannot be determined statically")
        return self._event_dim

    def __call__(self, *, is_discrete=NotImplemented, event_dim=NotImplemented):
        if is_discrete is NotImplemented:
            is_discrete = self._is_discrete
        if event_dim is NotImplemented:
            event_dim = self._event_dim
        return _Dependent(is_discrete=is_discrete, event_dim=event_dim)

    def check(self, x):
        raise ValueError("Cannot determine validity of dependent constraint")


def is_dependent(constraint):
    """True if ``constraint`` is a dependent placeholder (``constraints.dependent``)."""
    return isinstance(constraint, _Dependent)


class _DependentProperty(property, _Dependent):
    """A property on instances, a dependent constraint on the class (``Uniform.support``)."""

    def __init__(self, fn=None, *, is_discrete=NotImplemented, event_dim=NotImplemented):
        property.__init__(self, fn)
        self._is_discrete = is_discrete
        self._event_dim = event_dim

    def __call__(self, fn):
        return _DependentProperty(fn, is_discrete=self._is_discrete, event_dim=self._event_dim)


class _IndependentConstraint(Constraint):
    """Aggregates ``reinterpreted_batch_ndims`` dims in ``check``."""

    def __init__(self, base_constraint, reinterpreted_batch_ndims):
        if not isinstance(base_constraint, Constraint):
            raise AssertionError(f"base_constraint must be a Constraint, got "
                                 f"{type(base_constraint).__name__}")
        if not isinstance(reinterpreted_batch_ndims, int) or reinterpreted_batch_ndims < 0:
            raise AssertionError(f"reinterpreted_batch_ndims must be an int >= 0, got "
                                 f"{reinterpreted_batch_ndims!r}")
        self.base_constraint = base_constraint
        self.reinterpreted_batch_ndims = reinterpreted_batch_ndims
        super().__init__()

    @property
    def is_discrete(self):
        return self.base_constraint.is_discrete

    @property
    def event_dim(self):
        return self.base_constraint.event_dim + self.reinterpreted_batch_ndims

    @property
    def predicate(self):
        return self.base_constraint.predicate

    def check(self, value):
        result = _array(self.base_constraint.check(value))
        n = self.reinterpreted_batch_ndims
        if result.ndim < n:
            raise ValueError(f"Expected value.dim() >= {self.base_constraint.event_dim + n} "
                             f"but got {_array(value).ndim}")
        return _result(result.reshape(result.shape[:result.ndim - n] + (-1,)).all(-1))

    def __repr__(self):
        return (f"{self.__class__.__name__[1:]}({repr(self.base_constraint)}, "
                f"{self.reinterpreted_batch_ndims})")


class _Boolean(Constraint):
    is_discrete = True
    predicate = "boolean"

    def check(self, value):
        v = _array(value)
        return _result((v == 0) | (v == 1))


class _OneHot(Constraint):
    is_discrete = True
    event_dim = 1

    def check(self, value):
        v = _array(value)
        return _result(((v == 0) | (v == 1)).all(-1) & (v.sum(-1) == 1))


class _IntegerInterval(Constraint):
    is_discrete = True

    def __init__(self, lower_bound, upper_bound):
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound
        super().__init__()

    def check(self, value):
        v = _array(value)
        return _result((v % 1 == 0) & (_bound(self.lower_bound) <= v)
                       & (v <= _bound(self.upper_bound)))

    def __repr__(self):
        return (f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound}, "
                f"upper_bound={self.upper_bound})")


class _IntegerGreaterThan(Constraint):
    is_discrete = True

    def __init__(self, lower_bound):
        self.lower_bound = lower_bound
        super().__init__()

    @property
    def predicate(self):
        b = self.lower_bound
        return "nonnegative_integer" if _literal(b, 0) else \
            "positive_integer" if _literal(b, 1) else None

    def check(self, value):
        v = _array(value)
        return _result((v % 1 == 0) & (v >= _bound(self.lower_bound)))

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound})"


class _Real(Constraint):
    predicate = "real"

    def check(self, value):
        v = _array(value)
        return _result(v == v)  # False for NaNs


class _GreaterThan(Constraint):
    def __init__(self, lower_bound):
        self.lower_bound = lower_bound
        super().__init__()

    @property
    def predicate(self):
        return _named("positive", _literal(self.lower_bound, 0))

    def check(self, value):
        return _result(_bound(self.lower_bound) < _array(value))

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound})"


class _GreaterThanEq(_GreaterThan):
    @property
    def predicate(self):
        return _named("nonnegative", _literal(self.lower_bound, 0))

    def check(self, value):
        return _result(_bound(self.lower_bound) <= _array(value))


class _LessThan(Constraint):
    def __init__(self, upper_bound):
        self.upper_bound = upper_bound
        super().__init__()

    def check(self, value):
        return _result(_array(value) < _bound(self.upper_bound))

    def __repr__(self):
        return f"{self.__class__.__name__[1:]}(upper_bound={self.upper_bound})"


class _Interval(Constraint):
    def __init__(self, lower_bound, upper_bound):
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound
        super().__init__()

    @property
    def predicate(self):
        return _named("unit_interval", _literal(self.lower_bound, 0),
                      _literal(self.upper_bound, 1))

    def check(self, value):
        v = _array(value)
        return _result((_bound(self.lower_bound) <= v) & (v <= _bound(self.upper_bound)))

    def __repr__(self):
        return (f"{self.__class__.__name__[1:]}(lower_bound={self.lower_bound}, "
                f"upper_bound={self.upper_bound})")


class _HalfOpenInterval(_Interval):
    predicate = None

    def check(self, value):
        v = _array(value)
        return _result((_bound(self.lower_bound) <= v) & (v < _bound(self.upper_bound)))


class _Simplex(Constraint):
    event_dim = 1
    predicate = "simplex"

    def check(self, value):
        v = _array(value)
        return _result((v >= 0).all(-1) & (abs(v.sum(-1) - 1) < 1e-6))


class _Multinomial(Constraint):
    is_discrete = True
    event_dim = 1

    def __init__(self, upper_bound):
        self.upper_bound = upper_bound

    def check(self, x):
        v = _array(x)
        return _result((v >= 0).all(-1) & (v.sum(-1) <= _bound(self.upper_bound)))


def _lower_triangular(v):
    return (xp.tril(v) == v).reshape(v.shape[:-2] + (-1,)).min(-1)


class _LowerTriangular(Constraint):
    event_dim = 2

    def check(self, value):
        return _result(_lower_triangular(_array(value)))


class _LowerCholesky(Constraint):
    event_dim = 2

    def check(self, value):
        v = _array(value)
        diagonal = xp.diagonal(v, axis1=-2, axis2=-1)
        return _result(_lower_triangular(v) & (diagonal > 0).min(-1))


class _Square(Constraint):
    event_dim = 2

    def check(self, value):
        v = _array(value)
        return _result(xp.full(v.shape[:-2], v.shape[-2] == v.shape[-1], dtype=bool))


class _Symmetric(_Square):
    def check(self, value):
        square = super().check(value)
        if not square._data.all():
            return square
        v = _array(value)
        vt = xp.swapaxes(v, -1, -2)
        return _result(xp.isclose(v, vt, atol=1e-6).all(-2).all(-1))


def _cholesky_ok(v):
    out = xp.ones(v.shape[:-2], dtype=bool)
    flat_in = v.reshape((-1,) + v.shape[-2:])
    flat = out.reshape(-1)
    for i, m in enumerate(flat_in):
        try:
            xp.linalg.cholesky(m)
        except xp.linalg.LinAlgError:
            flat[i] = False
    return flat.reshape(v.shape[:-2])


class _PositiveSemidefinite(_Symmetric):
    def check(self, value):
        sym = super().check(value)
        if not sym._data.all():
            return sym
        return _result((xp.linalg.eigvalsh(_array(value)) >= 0).all(-1))


class _PositiveDefinite(_Symmetric):
    def check(self, value):
        sym = super().check(value)
        if not sym._data.all():
            return sym
        return _result(_cholesky_ok(_array(value)))


class _Cat(Constraint):
    """Applies constraints ``cseq`` to consecutive slices along ``dim`` (as ``torch.cat``)."""

    def __init__(self, cseq, dim=0, lengths=None):
        self.cseq = list(cseq)
        self.lengths = list(lengths) if lengths is not None else [1] * len(self.cseq)
        if len(self.lengths) != len(self.cseq):
            raise AssertionError(f"lengths ({len(self.lengths)}) must match cseq "
                                 f"({len(self.cseq)})")
        self.dim = dim
        super().__init__()

    @property
    def is_discrete(self):
        return any(c.is_discrete for c in self.cseq)

    @property
    def event_dim(self):
        return max(c.event_dim for c in self.cseq)

    def check(self, value):
        v = _array(value)
        checks, start = [], 0
        for constraint, length in zip(self.cseq, self.lengths):
            part = xp.take(v, xp.arange(start, start + length), axis=self.dim)
            checks.append(_array(constraint.check(Tensor._make(part))))
            start += length
        return _result(xp.concatenate(checks, self.dim))


class _Stack(Constraint):
    """Applies constraints ``cseq`` to the slices along ``dim`` (as ``torch.stack``)."""

    def __init__(self, cseq, dim=0):
        self.cseq = list(cseq)
        self.dim = dim
        super().__init__()

    @property
    def is_discrete(self):
        return any(c.is_discrete for c in self.cseq)

    @property
    def event_dim(self):
        dim = max(c.event_dim for c in self.cseq)
        return dim + 1 if self.dim + dim < 0 else dim

    def check(self, value):
        v = _array(value)
        parts = [xp.take(v, i, axis=self.dim) for i in range(v.shape[self.dim])]
        return _result(xp.stack([_array(c.check(Tensor._make(p)))
                                 for p, c in zip(parts, self.cseq)], self.dim))


dependent = _Dependent()
dependent_property = _DependentProperty
independent = _IndependentConstraint
boolean = _Boolean()
one_hot = _OneHot()
nonnegative_integer = _IntegerGreaterThan(0)
positive_integer = _IntegerGreaterThan(1)
integer_interval = _IntegerInterval
real = _Real()
real_vector = independent(real, 1)
positive = _GreaterThan(0.0)
nonnegative = _GreaterThanEq(0.0)
greater_than = _GreaterThan
greater_than_eq = _GreaterThanEq
less_than = _LessThan
multinomial = _Multinomial
unit_interval = _Interval(0.0, 1.0)
interval = _Interval
half_open_interval = _HalfOpenInterval
simplex = _Simplex()
lower_triangular = _LowerTriangular()
lower_cholesky = _LowerCholesky()
square = _Square()
symmetric = _Symmetric()
positive_semidefinite = _PositiveSemidefinite()
positive_definite = _PositiveDefinite()
cat = _Cat
stack = _Stack
