# A plain PyTorch script: a small CNN classifier with BatchNorm, Adam and cross-entropy.
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1, bias=False)  # BatchNorm follows
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2)
        self.fc = nn.Linear(8 * 2 * 2, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)  # 8x8 -> 4x4
        x = F.relu(self.conv2(F.pad(x, (1, 1, 1, 1))))
        return self.fc(torch.flatten(x, 1))


torch.set_default_dtype(torch.float64)
model = Net()
model.load_state_dict({k: torch.tensor(v) for k, v in INIT.items()})
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
X = torch.tensor(DATA["x"])
Y = torch.tensor(DATA["y"])
for step in range(20):
    opt.zero_grad()
    loss = F.cross_entropy(model(X), Y, label_smoothing=0.1)
    loss.backward()
    opt.step()
    LOSSES.append(loss.item())
model.eval()
with torch.no_grad():
    LOSSES.append(F.cross_entropy(model(X), Y).item())
