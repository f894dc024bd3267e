"""Convolutions at low resolution, then one PixelShuffle up to the full size."""
import torch.nn as nn
import torch.nn.init as init


class SubPixelNet(nn.Module):
    def __init__(self, factor, width=16):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, width, 5, padding=2), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, factor ** 2, 3, padding=1))
        self.shuffle = nn.PixelShuffle(factor)
        gain = init.calculate_gain("relu")
        for layer in self.body:
            if isinstance(layer, nn.Conv2d):
                init.orthogonal_(layer.weight, gain if layer.out_channels == width else 1.0)

    def forward(self, x):
        return self.shuffle(self.body(x))
