"""Recover a random cubic from noisy samples with hand-written gradient descent.

Phase one updates parameters through ``.data``; phase two refines with in-place updates
under ``torch.no_grad()``.
"""
import torch
import torch.nn.functional as F

DEGREE = 3
secret_weight = torch.randn(DEGREE, 1) * 1.5
secret_bias = torch.randn(1) * 0.5


def powers(x):
    """Columns x, x^2, ..., x^DEGREE of a batch of scalars."""
    x = x.unsqueeze(1)
    return torch.cat([x ** k for k in range(1, DEGREE + 1)], dim=1)


def secret(features):
    return features.mm(secret_weight) + secret_bias.item()


def draw(batch=24):
    features = powers(torch.rand(batch) * 2 - 1)
    noise = 0.01 * torch.randn(batch, 1)
    return features, secret(features) + noise


def formula(weight, bias):
    terms = " ".join(f"{w:+.3f} x^{k}" for k, w in enumerate(weight.view(-1).tolist(), 1))
    return f"y = {terms} {bias:+.3f}"


fit = torch.nn.Linear(DEGREE, 1)
for step in range(1, 61):
    features, targets = draw()
    fit.zero_grad()
    loss = F.smooth_l1_loss(fit(features), targets)
    loss.backward()
    for parameter in fit.parameters():
        parameter.data.add_(-0.5 * parameter.grad.data)
    if loss.item() < 1e-5:
        break

learning_rate = 0.2
for step in range(40):
    features, targets = draw()
    loss = ((fit(features) - targets) ** 2).mean()
    fit.weight.grad = None
    fit.bias.grad = None
    loss.backward()
    with torch.no_grad():
        for parameter in (fit.weight, fit.bias):
            parameter -= learning_rate * parameter.grad

print(f"loss {loss.item():.2e} after {step + 1} refining steps")
print("learned:", formula(fit.weight, fit.bias.item()))
print("actual: ", formula(secret_weight, secret_bias.item()))
