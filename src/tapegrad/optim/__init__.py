"""``tapegrad.optim``: optimizers and learning-rate schedules (as ``torch.optim``)."""
from tapegrad.optim.optimizer import Optimizer
from tapegrad.optim.sgd import SGD
from tapegrad.optim.adam import Adam
from tapegrad.optim.adamw import AdamW
from tapegrad.optim.rmsprop import RMSprop
from tapegrad.optim.adagrad import Adagrad
from tapegrad.optim.adamax import Adamax
from tapegrad.optim.nadam import NAdam
from tapegrad.optim.radam import RAdam
from tapegrad.optim import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "NAdam",
           "RAdam", "lr_scheduler"]
