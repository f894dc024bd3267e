"""As ``torch.distributions.Distribution``: shapes, argument and sample validation."""
import warnings

from tapegrad.autograd.grad_mode import no_grad, state as grad_state
from tapegrad.backend import xp
from tapegrad.distributions import constraints
from tapegrad.distributions.utils import lazy_property
from tapegrad.ops.indexing import recorder, value_checked
from tapegrad.tensor import Tensor

__all__ = ["Distribution"]


def _all_true(check):
    return bool(xp.all(check._data if isinstance(check, Tensor) else check))


def _check(constraint, value, message):
    """Raise ValueError with ``message`` and ``value``'s printout unless ``value`` satisfies
    ``constraint``. Under the compiler's tracer a constraint with a ``check_values``
    predicate becomes a graph check, so each compiled call checks its own values."""
    if (grad_state.modes and constraint.predicate is not None and isinstance(value, Tensor)
            and recorder() is not None):
        value_checked(value, constraint.predicate, message, show=True)
    elif not _all_true(constraint.check(value)):
        raise ValueError(f"{message}{value}")


def _size(shape):
    return tuple(int(s) for s in shape)


class Distribution:
    """Base of every distribution: ``batch_shape``, ``event_shape``, ``sample``/``rsample``,
    ``log_prob``, ``entropy`` and validation (on by default, as PyTorch's; turn it off per
    instance with ``validate_args=False`` or globally with ``set_default_validate_args``).

    >>> d = Normal(torch.zeros(3), torch.ones(3))
    >>> d.log_prob(d.sample((2,))).shape
    (2, 3)
    """

    has_rsample = False
    has_enumerate_support = False
    _validate_args = __debug__

    @staticmethod
    def set_default_validate_args(value: bool) -> None:
        """Turn argument validation on or off for every new distribution."""
        if value not in [True, False]:
            raise ValueError
        Distribution._validate_args = value

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self._batch_shape = _size(batch_shape)
        self._event_shape = _size(event_shape)
        if validate_args is not None:
            self._validate_args = validate_args
        if self._validate_args:
            try:
                arg_constraints = self.arg_constraints
            except NotImplementedError:
                arg_constraints = {}
                warnings.warn(f"{self.__class__} does not define `arg_constraints`. Please set "
                              "`arg_constraints = {}` or initialize the distribution with "
                              "`validate_args=False` to turn off validation.", stacklevel=2)
            for param, constraint in arg_constraints.items():
                if constraints.is_dependent(constraint):
                    continue
                if param not in self.__dict__ and isinstance(getattr(type(self), param),
                                                             lazy_property):
                    continue
                value = getattr(self, param)
                _check(constraint, value, f"Expected parameter {param} "
                       f"({type(value).__name__} of shape {tuple(value.shape)}) "
                       f"of distribution {repr(self)} "
                       f"to satisfy the constraint {repr(constraint)}, "
                       "but found invalid values:\n")
        super().__init__()

    def expand(self, batch_shape, _instance=None):
        """A new distribution with parameters expanded to ``batch_shape`` (no copies)."""
        raise NotImplementedError

    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    @property
    def arg_constraints(self):
        raise NotImplementedError

    @property
    def support(self):
        raise NotImplementedError

    @property
    def mean(self):
        raise NotImplementedError

    @property
    def mode(self):
        raise NotImplementedError(f"{self.__class__} does not implement mode")

    @property
    def variance(self):
        raise NotImplementedError

    @property
    def stddev(self):
        return self.variance.sqrt()

    def sample(self, sample_shape=()):
        """``sample_shape + batch_shape + event_shape`` draws, without a graph."""
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()):
        """Reparameterised draws: gradients flow into the parameters."""
        raise NotImplementedError

    def sample_n(self, n):
        warnings.warn("`sample_n(n)` will be deprecated. Use `sample((n,))` instead.",
                      FutureWarning, stacklevel=2)
        return self.sample((n,))

    def log_prob(self, value):
        raise NotImplementedError

    def cdf(self, value):
        raise NotImplementedError

    def icdf(self, value):
        raise NotImplementedError

    def enumerate_support(self, expand=True):
        raise NotImplementedError

    def entropy(self):
        raise NotImplementedError

    def perplexity(self):
        return self.entropy().exp()

    def _extended_shape(self, sample_shape=()):
        if isinstance(sample_shape, int):
            sample_shape = (sample_shape,)
        return _size(sample_shape) + self._batch_shape + self._event_shape

    def _validate_sample(self, value):
        if not isinstance(value, Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        event_dim_start = len(value.shape) - len(self._event_shape)
        if tuple(value.shape[event_dim_start:]) != self._event_shape:
            raise ValueError(f"The right-most size of value must match event_shape: "
                             f"{tuple(value.shape)} vs {self._event_shape}.")
        actual_shape = tuple(value.shape)
        expected_shape = self._batch_shape + self._event_shape
        for i, j in zip(reversed(actual_shape), reversed(expected_shape)):
            if i != 1 and j != 1 and i != j:
                raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: "
                                 f"{actual_shape} vs {expected_shape}.")
        try:
            support = self.support
        except NotImplementedError:
            warnings.warn(f"{self.__class__} does not define `support` to enable sample "
                          "validation. Please initialize the distribution with "
                          "`validate_args=False` to turn off validation.", stacklevel=2)
            return
        _check(support, value, "Expected value argument "
               f"({type(value).__name__} of shape {tuple(value.shape)}) "
               f"to be within the support ({repr(support)}) "
               f"of the distribution {repr(self)}, "
               "but found invalid values:\n")

    def _get_checked_instance(self, cls, _instance=None):
        if _instance is None and type(self).__init__ != cls.__init__:
            raise NotImplementedError(
                f"Subclass {self.__class__.__name__} of {cls.__name__} that defines a custom "
                "__init__ method must also define a custom .expand() method.")
        return self.__new__(type(self)) if _instance is None else _instance

    def __repr__(self):
        names = [k for k in self.arg_constraints if k in self.__dict__]
        args = ", ".join(
            f"{p}: {self.__dict__[p] if self.__dict__[p].numel() == 1 else self.__dict__[p].size()}"
            for p in names)
        return self.__class__.__name__ + "(" + args + ")"
