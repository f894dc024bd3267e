"""Continuous univariate distributions (PyTorch's formulas, tapegrad's random stream)."""
import math
import numbers

import tapegrad
from tapegrad.autograd.grad_mode import no_grad
from tapegrad.backend import xp
from tapegrad.distributions import constraints
from tapegrad.distributions._math import standard_gamma
from tapegrad.special import digamma, erfinv, gammaln as lgamma, xlogy
from tapegrad.distributions.distribution import Distribution
from tapegrad.distributions.utils import (broadcast_all, _standard_normal, _uniform,
                                          _expand_params, eps_of, tiny_of)
from tapegrad.random import numpy_rng
from tapegrad.tensor import Tensor

__all__ = ["Normal", "Uniform", "Exponential", "Laplace", "Gamma", "Chi2", "Beta", "Dirichlet",
           "StudentT"]


def _numbers(*values):
    return all(isinstance(v, numbers.Number) for v in values)


def _broadcast_params(*values):
    """``broadcast_all(*values)`` and the batch shape PyTorch gives them: ``()`` when every
    value is a number, else the broadcast shape."""
    params = broadcast_all(*values)
    return params, (() if _numbers(*values) else params[0].shape)


class Normal(Distribution):
    """As ``torch.distributions.Normal(loc, scale)``."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True
    _mean_carrier_measure = 0

    def __init__(self, loc, scale, validate_args=None):
        (self.loc, self.scale), batch_shape = _broadcast_params(loc, scale)
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_params(self, Normal, batch_shape, ("loc", "scale"), _instance)

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return self.scale

    @property
    def variance(self):
        return self.stddev.pow(2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = _standard_normal(shape, self.loc.dtype)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        var = self.scale ** 2
        return (-((value - self.loc) ** 2) / (2 * var) - self.scale.log()
                - math.log(math.sqrt(2 * math.pi)))

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 * (1 + tapegrad.erf((value - self.loc) * self.scale.reciprocal()
                                       / math.sqrt(2)))

    def icdf(self, value):
        return self.loc + self.scale * erfinv(2 * value - 1) * math.sqrt(2)

    def entropy(self):
        return 0.5 + 0.5 * math.log(2 * math.pi) + self.scale.log()


class Uniform(Distribution):
    """As ``torch.distributions.Uniform(low, high)``: ``[low, high)``."""

    has_rsample = True

    @property
    def arg_constraints(self):
        return {"low": constraints.less_than(self.high),
                "high": constraints.greater_than(self.low)}

    def __init__(self, low, high, validate_args=None):
        (self.low, self.high), batch_shape = _broadcast_params(low, high)
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_params(self, Uniform, batch_shape, ("low", "high"), _instance)

    @constraints.dependent_property(is_discrete=False, event_dim=0)
    def support(self):
        return constraints.interval(self.low, self.high)

    @property
    def mean(self):
        return (self.high + self.low) / 2

    @property
    def mode(self):
        return math.nan * self.high

    @property
    def stddev(self):
        return (self.high - self.low) / 12 ** 0.5

    @property
    def variance(self):
        return (self.high - self.low).pow(2) / 12

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        rand = _uniform(shape, self.low.dtype)
        return self.low + rand * (self.high - self.low)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        lb = (self.low <= value).to(self.low.dtype)
        ub = (self.high > value).to(self.low.dtype)
        return tapegrad.log(lb * ub) - tapegrad.log(self.high - self.low)

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        result = (value - self.low) / (self.high - self.low)
        return result.clamp(min=0, max=1)

    def icdf(self, value):
        return value * (self.high - self.low) + self.low

    def entropy(self):
        return tapegrad.log(self.high - self.low)


class Exponential(Distribution):
    """As ``torch.distributions.Exponential(rate)``."""

    arg_constraints = {"rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, rate, validate_args=None):
        (self.rate,), batch_shape = _broadcast_params(rate)
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_params(self, Exponential, batch_shape, ("rate",), _instance)

    @property
    def mean(self):
        return self.rate.reciprocal()

    @property
    def mode(self):
        return tapegrad.zeros_like(self.rate)

    @property
    def stddev(self):
        return self.rate.reciprocal()

    @property
    def variance(self):
        return self.rate.pow(-2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        draws = numpy_rng(None).standard_exponential(shape).astype(self.rate._data.dtype)
        return Tensor._make(draws) / self.rate

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self.rate.log() - self.rate * value

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 1 - tapegrad.exp(-self.rate * value)

    def icdf(self, value):
        return -tapegrad.log1p(-value) / self.rate

    def entropy(self):
        return 1.0 - tapegrad.log(self.rate)


class Laplace(Distribution):
    """As ``torch.distributions.Laplace(loc, scale)``."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        (self.loc, self.scale), batch_shape = _broadcast_params(loc, scale)
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_params(self, Laplace, batch_shape, ("loc", "scale"), _instance)

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        return 2 * self.scale.pow(2)

    @property
    def stddev(self):
        return (2 ** 0.5) * self.scale

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        eps = eps_of(self.loc.dtype)
        u = Tensor._make(numpy_rng(None).uniform(eps - 1, 1, shape).astype(self.loc._data.dtype))
        return self.loc - self.scale * u.sign() * tapegrad.log1p(-u.abs())

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return -tapegrad.log(2 * self.scale) - tapegrad.abs(value - self.loc) / self.scale

    def cdf(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return 0.5 - 0.5 * (value - self.loc).sign() * tapegrad.expm1(
            -(value - self.loc).abs() / self.scale)

    def icdf(self, value):
        term = value - 0.5
        return self.loc - self.scale * term.sign() * tapegrad.log1p(-2 * term.abs())

    def entropy(self):
        return 1 + tapegrad.log(2 * self.scale)


class Gamma(Distribution):
    """As ``torch.distributions.Gamma(concentration, rate)``; ``rsample`` is differentiable
    in both (implicit reparameterisation for the concentration)."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.nonnegative
    has_rsample = True

    def __init__(self, concentration, rate, validate_args=None):
        (self.concentration, self.rate), batch_shape = _broadcast_params(concentration, rate)
        super().__init__(batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return _expand_params(self, Gamma, batch_shape, ("concentration", "rate"), _instance)

    @property
    def mean(self):
        return self.concentration / self.rate

    @property
    def mode(self):
        return ((self.concentration - 1) / self.rate).clamp(min=0)

    @property
    def variance(self):
        return self.concentration / self.rate.pow(2)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        value = standard_gamma(self.concentration.expand(shape), numpy_rng(None)) \
            / self.rate.expand(shape)
        with no_grad():
            value.detach().clamp_(min=tiny_of(value.dtype))
        return value

    def log_prob(self, value):
        value = tapegrad.as_tensor(value, dtype=self.rate.dtype)
        if self._validate_args:
            self._validate_sample(value)
        return (xlogy(self.concentration, self.rate) + xlogy(self.concentration - 1, value)
                - self.rate * value - lgamma(self.concentration))

    def cdf(self, value):
        """``P(concentration, rate * value)`` (``special.gammainc``): differentiable in ``rate``
        and ``value``; not in ``concentration``, as in PyTorch."""
        if self._validate_args:
            self._validate_sample(value)
        return tapegrad.special.gammainc(self.concentration, self.rate * value)

    def entropy(self):
        c = self.concentration
        return c - tapegrad.log(self.rate) + lgamma(c) + (1.0 - c) * digamma(c)


class Chi2(Gamma):
    """As ``torch.distributions.Chi2(df)``: Gamma(df / 2, 1 / 2)."""

    arg_constraints = {"df": constraints.positive}

    def __init__(self, df, validate_args=None):
        if isinstance(df, numbers.Number):
            df = tapegrad.tensor(float(df))
        super().__init__(0.5 * df, 0.5, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Chi2, _instance)
        return Gamma.expand(self, batch_shape, new)

    @property
    def df(self):
        return self.concentration * 2


class Dirichlet(Distribution):
    """As ``torch.distributions.Dirichlet(concentration)`` (event dim: the last)."""

    arg_constraints = {"concentration": constraints.independent(constraints.positive, 1)}
    support = constraints.simplex
    has_rsample = True

    def __init__(self, concentration, validate_args=None):
        if concentration.dim() < 1:
            raise ValueError("`concentration` parameter must be at least one-dimensional.")
        self.concentration = concentration
        shape = tuple(concentration.shape)
        super().__init__(shape[:-1], shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Dirichlet, _instance)
        batch_shape = tuple(batch_shape)
        new.concentration = self.concentration.expand(batch_shape + self.event_shape)
        Distribution.__init__(new, batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        gammas = standard_gamma(self.concentration.expand(shape), numpy_rng(None))
        x = gammas / gammas.sum(-1, keepdim=True)
        with no_grad():
            x.detach().clamp_(min=tiny_of(x.dtype), max=1 - eps_of(x.dtype))
        return x

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        c = self.concentration
        return (xlogy(c - 1.0, value).sum(-1) + lgamma(c.sum(-1)) - lgamma(c).sum(-1))

    @property
    def mean(self):
        return self.concentration / self.concentration.sum(-1, keepdim=True)

    @property
    def mode(self):
        cm1 = (self.concentration - 1).clamp(min=0.0)
        mode = cm1 / cm1.sum(-1, keepdim=True)
        below_one = (self.concentration < 1).all(-1, keepdim=True)
        k = cm1.shape[-1]
        hot = tapegrad.nn.functional.one_hot(mode.argmax(-1), k).to(mode.dtype)
        return tapegrad.where(below_one, hot, mode)

    @property
    def variance(self):
        con0 = self.concentration.sum(-1, keepdim=True)
        return (self.concentration * (con0 - self.concentration)
                / (con0.pow(2) * (con0 + 1)))

    def entropy(self):
        c = self.concentration
        k = c.shape[-1]
        a0 = c.sum(-1)
        return (lgamma(c).sum(-1) - lgamma(a0) - (k - a0) * digamma(a0)
                - ((c - 1.0) * digamma(c)).sum(-1))


class Beta(Distribution):
    """As ``torch.distributions.Beta(concentration1, concentration0)``."""

    arg_constraints = {"concentration1": constraints.positive,
                       "concentration0": constraints.positive}
    support = constraints.unit_interval
    has_rsample = True

    def __init__(self, concentration1, concentration0, validate_args=None):
        if _numbers(concentration1, concentration0):
            both = tapegrad.tensor([float(concentration1), float(concentration0)])
        else:
            c1, c0 = broadcast_all(concentration1, concentration0)
            both = tapegrad.stack([c1, c0], -1)
        self._dirichlet = Dirichlet(both, validate_args=validate_args)
        super().__init__(self._dirichlet._batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(Beta, _instance)
        new._dirichlet = self._dirichlet.expand(batch_shape)
        Distribution.__init__(new, tuple(batch_shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def concentration1(self):
        return self._dirichlet.concentration[..., 0]

    @property
    def concentration0(self):
        return self._dirichlet.concentration[..., 1]

    @property
    def mean(self):
        return self.concentration1 / (self.concentration1 + self.concentration0)

    @property
    def mode(self):
        return self._dirichlet.mode[..., 0]

    @property
    def variance(self):
        total = self.concentration1 + self.concentration0
        return self.concentration1 * self.concentration0 / (total.pow(2) * (total + 1))

    def rsample(self, sample_shape=()):
        return self._dirichlet.rsample(sample_shape)[..., 0]

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        heads_tails = tapegrad.stack([value, 1.0 - value], -1)
        return self._dirichlet.log_prob(heads_tails)

    def entropy(self):
        return self._dirichlet.entropy()


class StudentT(Distribution):
    """As ``torch.distributions.StudentT(df, loc=0., scale=1.)``."""

    arg_constraints = {"df": constraints.positive, "loc": constraints.real,
                       "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, df, loc=0.0, scale=1.0, validate_args=None):
        self.df, self.loc, self.scale = broadcast_all(df, loc, scale)
        self._chi2 = Chi2(self.df)
        super().__init__(self._chi2._batch_shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(StudentT, _instance)
        batch_shape = tuple(batch_shape)
        new.df = self.df.expand(batch_shape)
        new.loc = self.loc.expand(batch_shape)
        new.scale = self.scale.expand(batch_shape)
        new._chi2 = self._chi2.expand(batch_shape)
        Distribution.__init__(new, batch_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return tapegrad.where(self.df <= 1, math.nan, self.loc)

    @property
    def mode(self):
        return self.loc

    @property
    def variance(self):
        df = self.df
        finite = self.scale.pow(2) * df / tapegrad.where(df > 2, df - 2, 1.0)
        m = tapegrad.where(df > 2, finite, math.inf * tapegrad.ones_like(df))
        return tapegrad.where(df <= 1, math.nan, m)

    def rsample(self, sample_shape=()):
        shape = self._extended_shape(sample_shape)
        x = _standard_normal(shape, self.df.dtype)
        z = self._chi2.rsample(sample_shape)
        y = x * tapegrad.rsqrt(z / self.df)
        return self.loc + self.scale * y

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        y = (value - self.loc) / self.scale
        z = (self.scale.log() + 0.5 * self.df.log() + 0.5 * math.log(math.pi)
             + lgamma(0.5 * self.df) - lgamma(0.5 * (self.df + 1.0)))
        return -0.5 * (self.df + 1.0) * tapegrad.log1p(y ** 2.0 / self.df) - z

    def entropy(self):
        lbeta = lgamma(0.5 * self.df) + math.lgamma(0.5) - lgamma(0.5 * (self.df + 1))
        return (self.scale.log() + 0.5 * (self.df + 1)
                * (digamma(0.5 * (self.df + 1)) - digamma(0.5 * self.df))
                + 0.5 * self.df.log() + lbeta)
