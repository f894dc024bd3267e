"""Pairs of (small, full-size) luma images cut from the pictures in a folder."""
import os

import numpy as np
import torch
from PIL import Image


def brightness(path):
    """The Y (luma) channel of a picture, as a one-channel PIL image."""
    with Image.open(path) as picture:
        return picture.convert("YCbCr").getchannel("Y")


def as_tensor(image):
    pixels = np.asarray(image, dtype=np.float64)
    return torch.from_numpy(pixels / 255.0)[None]


class LumaPairs(torch.utils.data.Dataset):
    def __init__(self, folder, crop, factor):
        self.paths = sorted(os.path.join(folder, name) for name in os.listdir(folder)
                            if name.endswith(".png"))
        self.crop = crop - crop % factor
        self.small = self.crop // factor

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, index):
        y = brightness(self.paths[index])
        left, top = (y.width - self.crop) // 2, (y.height - self.crop) // 2
        sharp = y.crop((left, top, left + self.crop, top + self.crop))
        blurred = sharp.resize((self.small, self.small), Image.BICUBIC)
        return as_tensor(blurred), as_tensor(sharp)
