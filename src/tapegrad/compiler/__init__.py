"""tapegrad's compiler: trace -> graph IR -> passes -> generated code (``tapegrad.compile``).

- ``trace(fn, *args)``: the printable Graph of one call (tracer.py, ir.py)
- passes.py: dead-node elimination, CSE, constant folding, simplification, fusion, each a
  function graph -> graph, with a value-check mode naming the pass that changed a result
- codegen.py: readable Python source over numpy, fused pointwise chains as one function
- pipeline.py: ``lower``, the one path from a traced graph through the passes to code
- api.py: ``compile(fn_or_module, ...)``: the cache, graph breaks, fallbacks; ``explain``
- guards.py: when a cached graph may run again (arguments, modes, Python state)
- entries.py: the cache entries (a whole call, pieces between value reads, a step's tail)
- replay.py: re-running the Python around a compiled graph (pieces, a step's tail)
"""
from tapegrad.compiler.ir import Graph, Node, Value, evaluate  # noqa: F401
from tapegrad.compiler.tracer import GraphBreak, trace  # noqa: F401
from tapegrad.compiler.api import (compile, explain, CompiledFunction,  # noqa: F401,E402
                                   CompiledModule, CompileFallbackWarning)
from tapegrad.compiler import passes, codegen, kernels, memory  # noqa: F401,E402
