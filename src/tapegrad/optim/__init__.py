"""``tapegrad.optim``: optimizers and learning-rate schedules (as ``torch.optim``)."""
