"""Import paths that PyTorch programs use (``torch.nn.modules.loss``,
``torch.utils.data.dataloader`` ...) as aliases of the tapegrad modules that hold the code."""
import importlib
import importlib.util
import sys
import types


def alias_module(fullname, sources, doc=None):
    """Register module ``fullname`` holding every name of the ``sources`` modules (the same
    objects, private helpers such as ``_pair`` or ``_Loss`` included), so that both
    ``import fullname`` and ``from fullname import X`` work. Returns the module."""
    module = types.ModuleType(fullname, doc or f"Alias of {', '.join(sources)} (PyTorch's "
                                                f"import path).")
    for source in sources:
        if importlib.util.find_spec(source) is None:
            continue  # a layer file not in this tree (yet): its names are simply absent
        src = importlib.import_module(source)
        module.__dict__.update({k: v for k, v in vars(src).items()
                                if not (k.startswith("__") and k.endswith("__"))})
    sys.modules[fullname] = module
    parent, _, child = fullname.rpartition(".")
    setattr(sys.modules[parent], child, module)
    return module
