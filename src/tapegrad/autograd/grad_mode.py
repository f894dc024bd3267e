"""Grad mode: whether ops record onto the tape (``no_grad``, ``enable_grad`` ...).

Grad mode is per thread, as in PyTorch: ``no_grad()`` in one thread leaves every other
thread recording, and a new thread starts with grad mode on and inference mode off.
"""
import functools
import threading


class _State(threading.local):
    """This thread's engine state; each thread sees its own attributes (``__init__`` runs
    once per thread, on its first access)."""

    def __init__(self):
        self.enabled = True
        self.inference = False
        self.watching = False  # inside a watched op: ops it dispatches are not watched
        self.modes = []  # this thread's DispatchModes, innermost last (autograd.engine)


state = _State()  # read on every op: one thread-local attribute lookup


def is_grad_enabled() -> bool:
    """As ``torch.is_grad_enabled()``."""
    return state.enabled


def is_inference_mode_enabled() -> bool:
    return state.inference


class _Mode:
    """Base of the grad-mode context managers; each is also a decorator, as in PyTorch."""

    enabled = True

    def __enter__(self):
        self._prev = (state.enabled, state.inference)
        state.enabled = self.enabled
        return self

    def __exit__(self, *exc):
        state.enabled, state.inference = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__(*self._args()):
                return fn(*args, **kwargs)

        return wrapper

    def _args(self):
        return ()


class no_grad(_Mode):
    """As ``torch.no_grad()``: ops inside record nothing; their results need no grad."""

    enabled = False


class enable_grad(_Mode):
    """As ``torch.enable_grad()``: recording on, even inside ``no_grad``."""

    enabled = True


class set_grad_enabled(_Mode):
    """As ``torch.set_grad_enabled(mode)``: sets grad mode now, and restores it as a context."""

    def __init__(self, mode: bool):
        self._prev = (state.enabled, state.inference)
        self.enabled = bool(mode)
        state.enabled = self.enabled

    def __enter__(self):
        return self

    def __call__(self, fn):
        state.enabled, state.inference = self._prev  # a decorator: leave the mode as it was
        return super().__call__(fn)

    def _args(self):
        return (self.enabled,)


class inference_mode(_Mode):
    """As ``torch.inference_mode()``: no recording; tensors made inside never join a graph."""

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)

    def __enter__(self):
        self._prev = (state.enabled, state.inference)
        if self.mode:
            state.enabled, state.inference = False, True
        return self

    def _args(self):
        return (self.mode,)
