"""Library hook points: modes observe factories, optimizer and scheduler steps and zero_grad
through the thread's mode stack (``engine.observer``), not by replacing library functions."""
import threading

import numpy as np

import tapegrad
from tapegrad import creation, nn, optim
from tapegrad.autograd import engine
from tapegrad.autograd.engine import DispatchMode
from tapegrad.optim.optimizer import Optimizer


class Observing(DispatchMode):
    """A mode that logs the library calls it observes and runs them as they are."""

    def __init__(self):
        self.log = []

    def made_from_shapes(self, t):
        self.log.append(("made", tuple(t.shape)))

    def optimizer_step(self, opt, original):
        self.log.append(("step", type(opt).__name__))
        return original(opt)

    def zero_grads(self, owner, original, params=None):
        self.log.append(("zero", type(owner).__name__))
        return original(owner, False)

    def python_effect(self, name, call, args):
        self.log.append(("effect", name))
        return call(*args)

    def index_grid(self, key, d):
        self.log.append(("grid", d, tuple(a.shape for a in key)))


def _model():
    tapegrad.manual_seed(0)
    net = nn.Linear(3, 2)
    opt = optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return net, opt


def test_library_functions_are_the_library_s_own():
    """Importing tapegrad (which imports the compiler) rebinds no library function."""
    assert tapegrad.zeros is creation.zeros and tapegrad.arange is creation.arange
    for f in (creation.zeros, creation.full_like, Optimizer.step, Optimizer.zero_grad,
              nn.Module.zero_grad):
        assert not hasattr(f, "__wrapped__"), f
    assert Optimizer.step.__code__.co_filename.endswith("optim/optimizer.py")


def test_a_mode_observes_factories_steps_and_zero_grad():
    net, opt = _model()
    sched = optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = tapegrad.ones(4, 3)
    with Observing() as mode:
        z = tapegrad.zeros(2, 5)
        tapegrad.full((1, 2), 3.0)
        tapegrad.arange(4)
        tapegrad.zeros_like(x)
        tapegrad.zeros(2, requires_grad=True)  # a leaf to train: not a constant
        tapegrad.tensor([1.0, 2.0])  # from data, not from shapes
        net(x).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=False)
        net.zero_grad(set_to_none=False)
        opt.zero_grad()  # set_to_none: nothing to observe (no write)
    assert mode.log == [("made", (2, 5)), ("made", (1, 2)), ("made", (4,)), ("made", (4, 3)),
                        ("step", "SGD"), ("effect", "StepLR.step"), ("zero", "SGD"),
                        ("zero", "Linear")]
    assert float(z.sum()) == 0.0 and opt.param_groups[0]["lr"] == 0.05


def test_gather_and_scatter_keys_are_observed():
    x = tapegrad.arange(12.0).reshape(3, 4)
    idx = tapegrad.tensor([[0, 2], [1, 3], [3, 0]])
    with Observing() as mode:
        y = tapegrad.gather(x, 1, idx)
    assert mode.log == [("grid", 1, ((3, 1), (3, 2)))]
    assert y.tolist() == [[0.0, 2.0], [5.0, 7.0], [11.0, 8.0]]


def test_the_observed_calls_still_do_their_work():
    """Under an observing mode that runs the originals, training equals plain training."""
    def train(observe):
        net, opt = _model()
        x = tapegrad.linspace(-1, 1, 12).reshape(4, 3)
        for _ in range(3):
            opt.zero_grad(set_to_none=False)
            if observe:
                with Observing():
                    net(x).pow(2).sum().backward()
                    opt.step()
            else:
                net(x).pow(2).sum().backward()
                opt.step()
        return [p.detach().numpy().copy() for p in net.parameters()]

    for a, b in zip(train(False), train(True)):
        assert np.array_equal(a, b)


def test_observer_is_per_thread_and_innermost_first():
    class Outer(Observing):
        pass

    seen = []
    with Outer() as outer:
        with Observing() as inner:
            assert engine.observer("optimizer_step") is inner
            t = threading.Thread(target=lambda: seen.append(engine.observer("optimizer_step")))
            t.start()
            t.join()
        assert engine.observer("optimizer_step") is outer
    assert seen == [None] and engine.observer("optimizer_step") is None


def test_a_subclass_that_overrides_step_is_not_taken_over():
    class Custom(optim.SGD):
        def step(self, closure=None):
            return super().step(closure)

    net, _ = _model()
    opt = Custom(net.parameters(), lr=0.1)
    net(tapegrad.ones(2, 3)).sum().backward()
    with Observing() as mode:
        opt.step()
    assert mode.log == []


def test_module_changes_move_the_epoch():
    from tapegrad.nn.module import MODULE_EPOCH

    net, _ = _model()
    e0 = MODULE_EPOCH[0]
    net.extra = 3
    e1 = MODULE_EPOCH[0]
    h = net.register_forward_hook(lambda *a: None)
    e2 = MODULE_EPOCH[0]
    h.remove()
    e3 = MODULE_EPOCH[0]
    del net.extra
    assert e0 < e1 < e2 < e3 < MODULE_EPOCH[0]
