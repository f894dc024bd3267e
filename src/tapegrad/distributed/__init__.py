"""``tapegrad.distributed`` as ``torch.distributed``, before its backend exists.

Importing works and ``is_available()`` is False, so programs that guard their distributed code
(``if dist.is_available() and dist.is_initialized():``) run in one process. Setting up a
process group raises a RuntimeError saying the backend is not available yet.
"""


def is_available() -> bool:
    """As ``torch.distributed.is_available()``: False (no distributed backend yet)."""
    return False


def is_initialized() -> bool:
    """As ``torch.distributed.is_initialized()``: False (no process group can exist)."""
    return False


def _not_available(name):
    def f(*args, **kwargs):
        raise RuntimeError(f"distributed.{name}: tapegrad's distributed backend is not "
                           "available yet (tapegrad.distributed.is_available() is False)")

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"``torch.distributed.{name}``: raises until the distributed backend exists."
    return f


init_process_group = _not_available("init_process_group")
destroy_process_group = _not_available("destroy_process_group")
get_rank = _not_available("get_rank")
get_world_size = _not_available("get_world_size")
barrier = _not_available("barrier")
all_reduce = _not_available("all_reduce")
broadcast = _not_available("broadcast")
all_gather = _not_available("all_gather")
reduce = _not_available("reduce")
new_group = _not_available("new_group")
