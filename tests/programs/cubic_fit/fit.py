"""Calibrate a simulated sensor: learn the cubic that maps raw readings to true values.

The fit is done by hand: first momentum steps written into ``.data``, then plain steps on
the parameters themselves under ``torch.no_grad()``.
"""
import torch
import torch.nn.functional as F

ORDER = 3
readings = torch.rand(48, 1) * 2 - 1
response = torch.randn(ORDER, 1)  # the sensor's true coefficients for r, r^2, r^3
offset = 0.3


def design(raw):
    """Columns r, r^2, ..., r^ORDER of a column of readings."""
    return torch.cat([raw.pow(k) for k in range(1, ORDER + 1)], dim=1)


truth = torch.mm(design(readings), response) + offset + 0.02 * torch.randn(48, 1)
fit_rows, check_rows = slice(0, 36), slice(36, 48)
calibration = torch.nn.Linear(ORDER, 1)

velocity = {name: torch.zeros_like(p) for name, p in calibration.named_parameters()}
for sweep in range(80):
    calibration.zero_grad()
    loss = F.smooth_l1_loss(calibration(design(readings[fit_rows])), truth[fit_rows])
    loss.backward()
    for name, p in calibration.named_parameters():
        velocity[name].mul_(0.8).add_(p.grad.data, alpha=-0.3)
        p.data.add_(velocity[name])
    if sweep % 20 == 0:
        print(f"sweep {sweep}: smooth-L1 {loss.item():.5f}")

for sweep in range(30):
    loss = F.mse_loss(calibration(design(readings[fit_rows])), truth[fit_rows])
    calibration.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in calibration.parameters():
            p -= 0.5 * p.grad

with torch.no_grad():
    held_out = F.mse_loss(calibration(design(readings[check_rows])), truth[check_rows])
print(f"held-out mean squared error {held_out.item():.2e}")
for k, (got, want) in enumerate(zip(calibration.weight[0].tolist(), response[:, 0].tolist()), 1):
    print(f"r^{k}: fitted {got:+.3f}, true {want:+.3f}")
print(f"offset: fitted {calibration.bias.item():+.3f}, true {offset:+.3f}")
