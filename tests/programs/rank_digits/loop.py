"""A training loop that calls back into the program after every step."""
from collections import defaultdict

import torch
from torch.utils.data import DataLoader, RandomSampler


class Loop:
    def __init__(self, model, dataset, lr=5e-4, batch=32, steps=1000, clip=1.0,
                 weight_decay=0.1):
        self.model, self.dataset, self.steps, self.clip = model, dataset, steps, clip
        self.batch = batch
        self.optimizer = model.optimizer(lr, weight_decay)
        self.hooks = defaultdict(list)
        self.step = 0
        self.loss = None

    def on(self, event, hook):
        self.hooks[event].append(hook)

    def fire(self, event):
        for hook in self.hooks[event]:
            hook(self)

    def run(self):
        sampler = RandomSampler(self.dataset, replacement=True, num_samples=int(1e10))
        batches = iter(DataLoader(self.dataset, sampler=sampler, batch_size=self.batch))
        self.model.train()
        while self.step < self.steps:
            x, y = next(batches)
            _, self.loss = self.model(x, y)
            self.model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.optimizer.step()
            self.step += 1
            self.fire("step")
