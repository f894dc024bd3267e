"""As ``torch.distributions``: probability distributions with PyTorch's parameterisations,
shapes, validation and formulas; samples come from tapegrad's generator.

    >>> from tapegrad.distributions import Normal, kl_divergence
    >>> p = Normal(torch.zeros(3, requires_grad=True), torch.ones(3))
    >>> x = p.rsample((5,))             # reparameterised: gradients reach loc and scale
    >>> p.log_prob(x).sum().backward()
"""
from tapegrad.distributions import constraints, transforms  # noqa: F401
from tapegrad.distributions.distribution import Distribution
from tapegrad.distributions.continuous import (Normal, Uniform, Exponential, Laplace, Gamma,
                                               Chi2, Beta, Dirichlet, StudentT)
from tapegrad.distributions.discrete import (Bernoulli, Binomial, Categorical,
                                             OneHotCategorical, Poisson, Geometric)
from tapegrad.distributions.multivariate_normal import MultivariateNormal
from tapegrad.distributions.independent import Independent
from tapegrad.distributions.transformed_distribution import TransformedDistribution, LogNormal
from tapegrad.distributions.relaxed import (LogitRelaxedBernoulli, RelaxedBernoulli,
                                            ExpRelaxedCategorical, RelaxedOneHotCategorical)
from tapegrad.distributions.transforms import (Transform, ComposeTransform, ExpTransform,
                                               AffineTransform, SigmoidTransform,
                                               TanhTransform, identity_transform)
from tapegrad.distributions.kl import kl_divergence, register_kl

__all__ = ["Distribution", "Normal", "Uniform", "Exponential", "Laplace", "Gamma", "Chi2",
           "Beta", "Dirichlet", "StudentT", "Bernoulli", "Binomial", "Categorical",
           "OneHotCategorical", "Poisson", "Geometric", "MultivariateNormal", "Independent",
           "TransformedDistribution", "LogNormal", "LogitRelaxedBernoulli", "RelaxedBernoulli",
           "ExpRelaxedCategorical", "RelaxedOneHotCategorical", "Transform",
           "ComposeTransform", "ExpTransform", "AffineTransform", "SigmoidTransform",
           "TanhTransform", "identity_transform", "kl_divergence", "register_kl",
           "constraints", "transforms"]
