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
from tapegrad.optim.adadelta import Adadelta
from tapegrad.optim.rprop import Rprop
from tapegrad.optim.asgd import ASGD
from tapegrad.optim.lbfgs import LBFGS
from tapegrad.optim.sparse_adam import SparseAdam
from tapegrad.optim import lr_scheduler, swa_utils

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adamax", "NAdam",
           "RAdam", "Adadelta", "Rprop", "ASGD", "LBFGS", "SparseAdam", "lr_scheduler",
           "swa_utils"]
