# A plain PyTorch script: an MLP regression trained with SGD + momentum and a StepLR.
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
X = torch.tensor(DATA["x"])
Y = torch.tensor(DATA["y"])
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
model.load_state_dict({k: torch.tensor(v) for k, v in INIT.items()})
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
for step in range(30):
    opt.zero_grad()
    loss = F.mse_loss(model(X), Y)
    loss.backward()
    opt.step()
    sched.step()
    LOSSES.append(loss.item())
