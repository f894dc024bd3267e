"""Stochastic weight averaging and EMA of a model's weights (``torch.optim.swa_utils``).

``AveragedModel`` keeps a running average (equal weights by default, or any ``avg_fn`` /
``multi_avg_fn`` such as ``get_ema_multi_avg_fn(decay)``) of another model's parameters (and
buffers with ``use_buffers=True``); ``update_bn`` recomputes BatchNorm statistics for the
averaged weights; ``SWALR`` anneals each group's lr to a constant SWA lr.
"""
import itertools
import math
import warnings
from copy import deepcopy

import tapegrad
from tapegrad.autograd.grad_mode import no_grad
from tapegrad.nn.module import Module
from tapegrad.optim.lr_scheduler import LRScheduler, _per_group
from tapegrad.tensor import Tensor

__all__ = ["AveragedModel", "update_bn", "SWALR", "get_ema_multi_avg_fn",
           "get_swa_multi_avg_fn", "get_ema_avg_fn", "get_swa_avg_fn"]


def _check_decay(decay):
    if decay < 0.0 or decay > 1.0:
        raise ValueError(f"Invalid decay value {decay} provided. Please provide a value in "
                         "[0,1] range.")


def _is_float(t):
    return t.dtype.is_floating_point


def get_ema_multi_avg_fn(decay=0.999):
    """As ``get_ema_multi_avg_fn``: ``ema = decay * ema + (1 - decay) * model`` over lists."""
    _check_decay(decay)

    def ema_update(ema_param_list, current_param_list, _):
        with no_grad():
            if _is_float(ema_param_list[0]):
                for p_ema, p_model in zip(ema_param_list, current_param_list):
                    p_ema.lerp_(p_model, 1 - decay)
            else:
                for p_ema, p_model in zip(ema_param_list, current_param_list):
                    p_ema.copy_(p_ema * decay + p_model * (1 - decay))

    return ema_update


def get_swa_multi_avg_fn():
    """As ``get_swa_multi_avg_fn``: the equal-weight running mean over lists of tensors."""

    def swa_update(averaged_param_list, current_param_list, num_averaged):
        with no_grad():
            if _is_float(averaged_param_list[0]):
                # PyTorch passes 1 / (n + 1) as a scalar: a 0-d tensor of the default dtype
                # when ``num_averaged`` is a tensor, so its rounding is kept here
                weight = 1 / (num_averaged + 1)
                weight = weight.item() if isinstance(weight, Tensor) else weight
                for p_avg, p_model in zip(averaged_param_list, current_param_list):
                    p_avg.lerp_(p_model, weight)
            else:
                for p_avg, p_model in zip(averaged_param_list, current_param_list):
                    diff = p_model - p_avg
                    if isinstance(num_averaged, Tensor):
                        p_avg.addcdiv_(diff, num_averaged + 1)
                    else:
                        p_avg.add_(diff, alpha=1.0 / (num_averaged + 1))

    return swa_update


def get_ema_avg_fn(decay=0.999):
    """As ``get_ema_avg_fn``: ``decay * ema + (1 - decay) * model`` for one tensor."""
    _check_decay(decay)

    def ema_update(ema_param, current_param, num_averaged):
        with no_grad():
            return decay * ema_param + (1 - decay) * current_param

    return ema_update


def get_swa_avg_fn():
    """As ``get_swa_avg_fn``: ``avg + (model - avg) / (n + 1)`` for one tensor."""

    def swa_update(averaged_param, current_param, num_averaged):
        with no_grad():
            return averaged_param + (current_param - averaged_param) / (num_averaged + 1)

    return swa_update


def _group_by_dtype(averaged, current):
    """PyTorch's grouping of tensor pairs by (device, dtype), in order of appearance."""
    groups = {}
    for a, c in zip(averaged, current):
        pair = groups.setdefault((str(a.device), a.dtype), ([], []))
        pair[0].append(a)
        pair[1].append(c)
    return groups


class AveragedModel(Module):
    """As ``torch.optim.swa_utils.AveragedModel(model, device=None, avg_fn=None,
    multi_avg_fn=None, use_buffers=False)``: a deep copy of ``model`` whose parameters
    ``update_parameters(model)`` averages with ``model``'s; ``n_averaged`` counts the updates.

    >>> swa_model = AveragedModel(model)                     # equal-weight SWA
    >>> ema_model = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    """

    def __init__(self, model, device=None, avg_fn=None, multi_avg_fn=None, use_buffers=False):
        super().__init__()
        if avg_fn is not None and multi_avg_fn is not None:
            raise AssertionError("Only one of avg_fn and multi_avg_fn should be provided")
        self.module = deepcopy(model)
        if device is not None:
            self.module = self.module.to(device)
        self.register_buffer("n_averaged",
                             tapegrad.tensor(0, dtype=tapegrad.long, device=device))
        self.avg_fn = avg_fn
        self.multi_avg_fn = multi_avg_fn
        self.use_buffers = use_buffers

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def update_parameters(self, model) -> None:
        """Average ``model``'s parameters (and buffers, with ``use_buffers``) into this copy;
        the first call copies them."""
        with no_grad():
            self._update_parameters(model)

    def _update_parameters(self, model):
        if self.use_buffers:
            self_param = itertools.chain(self.module.parameters(), self.module.buffers())
            model_param = itertools.chain(model.parameters(), model.buffers())
        else:
            self_param, model_param = self.parameters(), model.parameters()
        self_detached, model_detached = [], []
        copy_param = bool(self.n_averaged == 0)
        for p_averaged, p_model in zip(self_param, model_param):
            p_model_ = p_model.detach().to(p_averaged.device)
            self_detached.append(p_averaged.detach())
            model_detached.append(p_model_)
            if copy_param:
                p_averaged.detach().copy_(p_model_)

        if self.n_averaged > 0:
            if self.multi_avg_fn is not None or self.avg_fn is None:
                for (device, _), (self_params, model_params) in _group_by_dtype(
                        self_detached, model_detached).items():
                    if self.multi_avg_fn:
                        self.multi_avg_fn(self_params, model_params,
                                          self.n_averaged.to(device))
                    else:  # PyTorch's CPU path: the single-tensor SWA average
                        avg_fn = get_swa_avg_fn()
                        n_averaged = self.n_averaged.to(device)
                        for p_averaged, p_model in zip(self_params, model_params):
                            p_averaged.copy_(avg_fn(p_averaged, p_model, n_averaged))
            else:
                for p_averaged, p_model in zip(self_detached, model_detached):
                    n_averaged = self.n_averaged.to(p_averaged.device)
                    p_averaged.detach().copy_(self.avg_fn(p_averaged.detach(), p_model,
                                                          n_averaged))

        if not self.use_buffers:
            # the buffers are not averaged: keep them in sync with the source model
            for b_swa, b_model in zip(self.module.buffers(), model.buffers()):
                b_swa.detach().copy_(b_model.detach().to(b_swa.device))
        self.n_averaged.add_(1)


def _batch_norms(model):
    from tapegrad.nn.layers.norm import _BatchNorm, _InstanceNorm
    return [m for m in model.modules()
            if isinstance(m, _BatchNorm) and not isinstance(m, _InstanceNorm)]


def update_bn(loader, model, device=None) -> None:
    """As ``torch.optim.swa_utils.update_bn(loader, model, device=None)``: reset every
    BatchNorm's running statistics and recompute them (as cumulative averages) in one pass
    over ``loader`` (batches, or tuples/lists whose first item is the input)."""
    with no_grad():
        momenta = {}
        for module in _batch_norms(model):
            module.reset_running_stats()
            momenta[module] = module.momentum
        if not momenta:
            return
        was_training = model.training
        model.train()
        for module in momenta:
            module.momentum = None
        for input in loader:
            if isinstance(input, (list, tuple)):
                input = input[0]
            if device is not None:
                input = input.to(device)
            model(input)
        for bn_module in momenta:
            bn_module.momentum = momenta[bn_module]
        model.train(was_training)


class SWALR(LRScheduler):
    """As ``torch.optim.swa_utils.SWALR(optimizer, swa_lr, anneal_epochs=10,
    anneal_strategy='cos', last_epoch=-1)``: anneal each group's lr from its value to
    ``swa_lr`` over ``anneal_epochs`` steps ('cos' or 'linear'), then hold it.

    >>> swa_scheduler = SWALR(opt, swa_lr=0.05, anneal_epochs=5)
    """

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos",
                 last_epoch=-1):
        swa_lrs = _per_group("swa_lr", optimizer, swa_lr)
        for swa_lr, group in zip(swa_lrs, optimizer.param_groups):
            group["swa_lr"] = swa_lr
        if anneal_strategy not in ["cos", "linear"]:
            raise ValueError("anneal_strategy must be one of 'cos' or 'linear', instead got "
                             f"{anneal_strategy}")
        self._set_anneal_func(anneal_strategy)
        if not isinstance(anneal_epochs, int) or anneal_epochs < 0:
            raise ValueError(f"anneal_epochs must be equal or greater than 0, got "
                             f"{anneal_epochs}")
        self.anneal_epochs = anneal_epochs
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _linear_anneal(t):
        return t

    @staticmethod
    def _cosine_anneal(t):
        return (1 - math.cos(math.pi * t)) / 2

    @staticmethod
    def _get_initial_lr(lr, swa_lr, alpha):
        if alpha == 1:
            return swa_lr
        return (lr - alpha * swa_lr) / (1 - alpha)

    def get_lr(self):
        if not self._get_lr_called_within_step:
            warnings.warn("To get the last learning rate computed by the scheduler, please use "
                          "`get_last_lr()`.", UserWarning, stacklevel=2)
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        prev_t = max(0, min(1, (step - 1) / max(1, self.anneal_epochs)))
        prev_alpha = self.anneal_func(prev_t)
        prev_lrs = [self._get_initial_lr(group["lr"], group["swa_lr"], prev_alpha)
                    for group in self.optimizer.param_groups]
        t = max(0, min(1, step / max(1, self.anneal_epochs)))
        alpha = self.anneal_func(t)
        return [group["swa_lr"] * alpha + lr * (1 - alpha)
                for group, lr in zip(self.optimizer.param_groups, prev_lrs)]

    def _set_anneal_func(self, anneal_strategy):
        self._anneal_strategy = anneal_strategy
        self.anneal_func = (self._cosine_anneal if anneal_strategy == "cos"
                            else self._linear_anneal)

    def state_dict(self):
        """Every attribute but the optimizer and the anneal function (as PyTorch)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "anneal_func")}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)
        self._set_anneal_func(self._anneal_strategy)
