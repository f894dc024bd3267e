"""Endless sampling with replacement, a fixed number of steps, hooks after each step."""
import torch
from torch.utils.data import DataLoader, RandomSampler


def train(model, dataset, steps, batch=32, lr=5e-4, weight_decay=0.1, clip=1.0,
          after_step=()):
    optimizer = model.optimizer(lr, weight_decay)
    endless = RandomSampler(dataset, replacement=True, num_samples=int(1e10))
    batches = iter(DataLoader(dataset, batch_size=batch, sampler=endless))
    model.train()
    for step in range(1, steps + 1):
        inputs, targets = next(batches)
        _, loss = model(inputs, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        for hook in after_step:
            hook(step, loss)
    return model
