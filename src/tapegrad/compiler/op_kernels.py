"""Hand-written numba kernels that replace one graph node's forward in generated code.

A node whose op (or opaque rule) has a kernel here is called through the kernel instead of the
op's numpy forward, with the same arguments (its inputs' arrays, then its params as keywords)
and the same results. Kernel modules (``kernels_conv.py`` for convolution and pooling, ...)
register a factory per node name with :func:`register`; the factory sees the node (shapes,
dtypes, params) and returns the callable, or None where the kernel does not apply (then the
op's forward runs). Used only with the numba backend; the numpy fallback never comes here.
"""

_FACTORIES = {}  # node name -> [factory(node) -> callable or None]
_LOADED = False


def register(name):
    """Decorator: ``factory(node)`` may serve nodes called ``name``."""
    def deco(factory):
        _FACTORIES.setdefault(name, []).append(factory)
        return factory
    return deco


def _load():
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import importlib
        for mod in _MODULES:
            importlib.import_module(mod)


_MODULES = ["tapegrad.compiler.kernels_conv"]  # kernel modules, imported on the first lookup
_MODULES.append("tapegrad.compiler.kernels_norm_softmax")  # LayerNorm, softmax, attention
_MODULES.append("tapegrad.compiler.kernels_gelu")  # GELU and its gradient sharing one erf
_MODULES.append("tapegrad.compiler.kernels_attention")  # attention's gradient products
_MODULES.append("tapegrad.compiler.kernels_optim")  # Adam/AdamW, clip_grad_norm_, the two fused
_MODULES.append("tapegrad.compiler.kernels_residual")  # LayerNorm with the residual stream
_MODULES.append("tapegrad.compiler.kernels_loss")  # linear over a stack of rows (LM head)


def lookup(node):
    """The kernel serving ``node``, or None."""
    _load()
    for factory in _FACTORIES.get(node.name, ()):
        fn = factory(node)
        if fn is not None:
            return fn
    return None
