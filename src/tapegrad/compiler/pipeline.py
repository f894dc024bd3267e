"""The compiler's one path from a traced graph to code that runs.

    trace (``tracer.py``: a call recorded as an IR ``Graph``, ``ir.py``)
      -> passes (``passes.py``: rewrites, each keeping the graph's results)
      -> codegen (``codegen.py``: Python source calling numpy and numba kernels)
      -> run (``api.py``: guards pick a cached entry and call its function)

``lower`` is the middle of that path, used for every graph the compiler makes: a whole
call, the forward and backward halves of a joint graph, the pieces between graph breaks,
and a graph re-lowered when it gains outputs.
"""
from tapegrad.compiler import codegen, passes


def lower(graph, pass_list, name, log=None, check=None):
    """``(graph, source, run)``: ``graph`` after ``pass_list`` and the source and function
    ``codegen.generate`` made of it. ``log`` receives each pass's node counts; ``check``
    (input arrays) turns on the passes' value check."""
    graph = passes.optimize(graph, pass_list, check=check, log=log)
    source, run = codegen.generate(graph, name)
    return graph, source, run
