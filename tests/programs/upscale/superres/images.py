"""Pairs of (small, full-size) luma images cut from the pictures in a folder."""
import os

import numpy as np
import torch
from PIL import Image


def luma(path):
    y, _, _ = Image.open(path).convert("YCbCr").split()
    return y


def to_tensor(image):
    return torch.from_numpy(np.asarray(image, dtype=np.float64) / 255.0).unsqueeze(0)


class LumaPairs(torch.utils.data.Dataset):
    def __init__(self, folder, crop, factor):
        self.paths = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                            if name.endswith(".png"))
        self.crop = crop - crop % factor
        self.small = self.crop // factor

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        y = luma(self.paths[index])
        left, top = (y.width - self.crop) // 2, (y.height - self.crop) // 2
        target = y.crop((left, top, left + self.crop, top + self.crop))
        source = target.resize((self.small, self.small), Image.BICUBIC)
        return to_tensor(source), to_tensor(target)
