"""``python -m tapegrad coverage``: tapegrad's namespaces against PyTorch's, name by name.

For each PyTorch namespace (``torch``, ``torch.Tensor``, ``torch.nn``, ``nn.functional``...)
the report lists the public names tapegrad has, the ones it lacks and the percentage. Names
that cannot apply to a CPU framework on numpy are left out of the count, but never silently:
each belongs to one named group of ``EXCLUSIONS``, whose reason is printed with its names.
A name tapegrad does provide counts as present, whatever group it would fall in (private
names aside: they never count).

    python -m tapegrad coverage               # markdown on stdout
    python -m tapegrad coverage --write       # regenerate docs/coverage.md
    python -m tapegrad coverage --check       # exit 1 when docs/coverage.md is out of date
"""
import argparse
import datetime
import importlib
import pathlib
import re
import sys
import textwrap
import types

# (title, PyTorch object path, tapegrad object path, what is counted)
NAMESPACES = [
    ("torch", "torch", "tapegrad", "top-level functions, classes, dtypes and constants"),
    ("Tensor", "torch.Tensor", "tapegrad.Tensor", "methods, attributes and operators"),
    ("nn", "torch.nn", "tapegrad.nn", "modules and classes"),
    ("nn.functional", "torch.nn.functional", "tapegrad.nn.functional", "functions"),
    ("nn.init", "torch.nn.init", "tapegrad.nn.init", "initialisers"),
    ("nn.utils", "torch.nn.utils", "tapegrad.nn.utils", "utilities"),
    ("optim", "torch.optim", "tapegrad.optim", "optimizers"),
    ("optim.lr_scheduler", "torch.optim.lr_scheduler", "tapegrad.optim.lr_scheduler",
     "schedulers"),
    ("utils.data", "torch.utils.data", "tapegrad.utils.data", "datasets, samplers, loaders"),
    ("autograd", "torch.autograd", "tapegrad.autograd", "functions and classes"),
    ("linalg", "torch.linalg", "tapegrad.linalg", "functions"),
    ("special", "torch.special", "tapegrad.special", "functions"),
    ("distributions", "torch.distributions", "tapegrad.distributions",
     "distributions, transforms, KL"),
    ("fft", "torch.fft", "tapegrad.fft", "functions"),
]

_DEVICE = re.compile(r"(^|_)(cuda|cudnn|cufft|cublas|cusparse|cusolver|nccl|mps|xpu|hip|hpu|"
                     r"mtia|ipu|xla|vulkan|lazy|maia|miopen|mkldnn|mkl|onednn|nnpack|fbgemm|"
                     r"qnnpack|xnnpack|openmp|nvtx|privateuse1|metal|fpga|cudagraph|gpu)($|_|\d)|"
                     r"__cuda_array_interface__")
_QUANT = re.compile(r"quantiz|fake_quant|^q_|^int_repr$|^qscheme$|^per_(tensor|channel)_|"
                    r"^q?u?int(8|32|2x4|4x2)storage$|^q(u?)int(8|32|2x4|4x2)$|dequantize|"
                    r"qparams|^(is_)?quantized")
_SPARSE = re.compile(r"sparse|_csr|_csc|_bsr|_bsc|^(crow|ccol|col|row)_indices$|^coalesce$|"
                     r"^is_coalesced$|^indices$|^values$|^(s|h)spmm$|^smm$|^dsmm$|^hsmm$|"
                     r"^spmm$|^sspaddmm$|^saddmm$|^dense_dim$|^to_dense$")
_COMPLEX = {"complex", "polar", "view_as_real", "view_as_complex", "conj", "conj_physical",
            "conj_physical_", "resolve_conj", "resolve_neg", "is_conj", "is_neg", "real",
            "imag", "complex64", "complex128", "complex32", "cfloat", "cdouble", "chalf",
            "ComplexDoubleStorage", "ComplexFloatStorage", "is_complex", "__complex__",
            "view_as_real_copy", "view_as_complex_copy"}
# dtypes with no numpy representation: bit-packed, sub-byte, float8/float4
_DTYPES = re.compile(r"^(bits\d.*|float8_.*|float4_.*|u?int[1-7])$")
# TorchScript, torch.fx, export and the dynamo/inductor compiler's C++ plumbing
_SCRIPT = re.compile(r"^(Any|Await|Bool|Class|Complex|DeviceObj|Dict|Enum|Float|Future|Int|"
                     r"Interface|List|None|Number|Optional|PyObject|RRef|StreamObj|String|"
                     r"SymBool|SymInt|Tensor|Tuple|Union)Type$|^Script[A-Za-z]*$|^(AliasDb|"
                     r"Argument|ArgumentSpec|Block|CallStack|Capsule|Code|CompilationUnit|"
                     r"CompleteArgumentSpec|ConcreteModuleType|ConcreteModuleTypeBuilder|"
                     r"DeepCopyMemoTable|DeserializationStorageContext|ErrorReport|"
                     r"ExecutionPlan|FileCheck|FunctionSchema|Gradient|Graph|"
                     r"GraphExecutorState|IODescriptor|InferredType|JITException|"
                     r"LiteScriptModule|Node|OperatorInfo|SerializationStorageContext|"
                     r"StaticModule|TracingState|Type|Use|Value|PyTorchFileReader|"
                     r"PyTorchFileWriter|BufferDict|ModuleDict|ParameterDict|LoggerBase|"
                     r"LockingLogger|NoopLogger|AggregationType|AVG|SUM|BenchmarkConfig|"
                     r"BenchmarkExecutionStats|ThroughputBenchmark|compiled_with_cxx11_abi|"
                     r"while_loop|cond|fork|wait|Future|import_ir_module|"
                     r"import_ir_module_from_buffer|"
                     r"merge_type_from_type_comment|parse_ir|parse_schema|parse_type_comment|"
                     r"unify_type_list|Tag|get_file_path|prepare_multiprocessing_environment|"
                     r"classproperty)$")
# the C++ dispatcher, __torch_function__ overrides, symbolic shapes and build flags
_DISPATCH = re.compile(r"^(DispatchKey|DispatchKeySet|ExcludeDispatchKeyGuard|"
                       r"DisableTorchFunction|DisableTorchFunctionSubclass|"
                       r"handle_torch_function|has_torch_function.*|boolean_dispatch|"
                       r"BroadcastingList\d|is_tensor_like|SymBool|SymFloat|SymInt|sym_.*|"
                       r"is_warn_always_enabled|set_warn_always|has_lapack|has_spectral|"
                       r"USE_GLOBAL_DEPS|USE_RTLD_GLOBAL_WITH_LIBTORCH|TYPE_CHECKING|"
                       r"PRIVATE_OPS|as_subclass|__torch_function__|__torch_dispatch__|"
                       r"__dlpack_c_exchange_api__|set_deterministic_debug_mode|"
                       r"get_deterministic_debug_mode|autocast_(in|de)crement_nesting|"
                       r"DeviceType|ProfilerActivity|ProfilerConfig|ProfilerEvent|"
                       r"ProfilerState|kineto_available|is_multithreading_enabled|"
                       r"set_multithreading_enabled|is_view_replay_enabled|SavedTensor|"
                       r"batch_norm_(backward_elemt|backward_reduce|elemt|gather_stats|"
                       r"gather_stats_with_counts|stats|update_stats)|native_.*|convolution|"
                       r"conv_tbc|affine_grid_generator|embedding_renorm_)$")
# ATen kernels that nn layers call; scripts use the layer or nn.functional
_NN_KERNELS = re.compile(r"^(lstm|gru|rnn_relu|rnn_tanh)(_cell)?$|^(grid_sampler(_[23]d)?|"
                         r"constant_pad_nd|feature_dropout|norm_except_dim|frobenius_norm|"
                         r"nuclear_norm)$")
_STORAGE = re.compile(r"^(BFloat16|Bool|Byte|Char|Double|Float|Half|Int|Long|Short)Storage$|"
                      r"^(Storage|StorageBase|TypedStorage|storage|storage_type|storage_offset|"
                      r"is_shared|share_memory_|set_|resize_|resize_as_|record_stream|"
                      r"is_pinned|pin_memory)$")
_NAMED = re.compile(r"^(names|refine_names|rename|rename_|align_to|align_as|align_tensors|"
                    r"has_names)$")
_NESTED = re.compile(r"^(nested_tensor|is_nested|jagged|to_padded_tensor)$")
# removed (kept only to raise) or deprecated in PyTorch 2, per namespace
_DEPRECATED = {
    "torch": {"eig", "lstsq", "symeig", "solve", "matrix_rank", "lu", "chain_matmul",
              "segment_reduce", "set_default_tensor_type"},
    "Tensor": {"eig", "lstsq", "symeig", "solve", "lu", "volatile", "reinforce", "__div__",
               "__idiv__", "__rdiv__", "__nonzero__", "__long__"},
    "nn": {"Container", "NLLLoss2d"},
    "nn.functional": {"upsample", "upsample_bilinear", "upsample_nearest"},
    "nn.init": {"constant", "dirac", "eye", "kaiming_normal", "kaiming_uniform", "normal",
                "uniform", "xavier_normal", "xavier_uniform", "orthogonal", "sparse"},
    "nn.utils": {"clip_grad_norm"},
    "utils.data": {"DFIterDataPipe", "DataChunk", "IterDataPipe", "MapDataPipe",
                   "functional_datapipe", "guaranteed_datapipes_determinism",
                   "non_deterministic", "runtime_validation", "runtime_validation_disabled",
                   "argument_validation"},
    "autograd": {"NestedIOFunction", "variable"},
}
_DISTRIBUTED = re.compile(r"^(DataParallel|data_parallel|DistributedSampler|SyncBatchNorm|"
                          r"Event|Stream|get_device_module|AcceleratorError|OutOfMemoryError|"
                          r"FatalError|get_device)$")


def _is_inplace_function(ns, name, names):
    return ns == "torch" and name.endswith("_") and not name.endswith("__") \
        and name[:-1] in names


def _is_foreign(ns, obj):
    """Imported helpers (typing, functools, math constants) and docstring fragments."""
    if isinstance(obj, str) or (isinstance(obj, dict) and obj
                                and all(isinstance(v, str) for v in obj.values())):
        return True
    if ns != "torch" and isinstance(obj, (bool, int, float)):
        return True
    mod = getattr(obj, "__module__", None)
    if isinstance(obj, (type, types.FunctionType)):
        return mod is not None and not mod.startswith("torch")
    return type(obj).__module__ in ("typing", "__future__")


def _in_functional(name):
    import torch.nn.functional as F

    return hasattr(F, name)


def _is_torch_tensor(obj):
    import torch

    return obj is torch.Tensor


# (group, reason, test(namespace, name, object, all names of the namespace) -> bool), in order
EXCLUSIONS = [
    ("private", "names starting with '_' are not PyTorch's API (Tensor's operators such as "
     "__add__ are, and are counted; Python's class machinery such as __dict__ is not)",
     lambda ns, n, o, names: _is_private(ns, n)),
    ("imported helpers", "typing/functools/math objects, docstring fragments and torch.Tensor "
     "re-exported by the module: not API of this namespace", lambda ns, n, o, names:
     _is_foreign(ns, o) or (ns != "torch" and _is_torch_tensor(o))),
    ("submodules", "a submodule is no API by itself; the ones that apply are reported as "
     "their own namespaces below", lambda ns, n, o, names: isinstance(o, types.ModuleType)),
    ("accelerator devices", "CUDA/MPS/XPU/HIP/MTIA/Vulkan/MKLDNN device APIs and vendor kernel "
     "libraries: tapegrad computes on the CPU through numpy", lambda ns, n, o, names:
     bool(_DEVICE.search(n.lower()))),
    ("quantization", "quantized dtypes, qschemes and quantized kernels: numpy has no "
     "quantized tensor type", lambda ns, n, o, names: bool(_QUANT.search(n.lower()))),
    ("sparse layouts", "COO/CSR/CSC/BSR/BSC sparse tensors and their kernels: tapegrad "
     "tensors are dense (strided) numpy arrays", lambda ns, n, o, names:
     ns in ("torch", "Tensor") and bool(_SPARSE.search(n))),
    ("complex numbers", "complex dtypes and complex-only functions: tapegrad's dtypes are "
     "real (see docs/differences.md)", lambda ns, n, o, names: n in _COMPLEX),
    ("dtypes numpy lacks", "bit-packed, sub-byte integer and float8/float4 dtypes: numpy "
     "has no such arrays", lambda ns, n, o, names: ns == "torch" and bool(_DTYPES.match(n))),
    ("TorchScript, fx, export", "TorchScript IR types, its futures, the JIT's type parsing and "
     "the C++ benchmark and file classes: tapegrad has its own tracer and compiler",
     lambda ns, n, o, names: ns == "torch" and bool(_SCRIPT.match(n))),
    ("dispatcher internals", "the C++ dispatcher, __torch_function__ overrides, symbolic "
     "shapes, profiler (Kineto) plumbing, "
     "build flags and ATen's internal kernels exposed as functions", lambda ns, n, o, names:
     bool(_DISPATCH.match(n))),
    ("nn kernels at top level", "torch.conv2d, torch.lstm... are the kernels nn layers call: "
     "the same functions are counted under nn.functional, the RNN kernels under nn's layers",
     lambda ns, n, o, names: ns == "torch" and (_in_functional(n) or bool(_NN_KERNELS.match(n)))),
    ("view copies", "torch.foo_copy: functionalisation's copying twin of the view foo, for "
     "compiler backends; foo(...).clone() is the same", lambda ns, n, o, names:
     ns == "torch" and n.endswith("_copy") and n[:-5] in names | {"alias", "indices",
                                                                  "values", "row_indices",
                                                                  "col_indices", "crow_indices",
                                                                  "ccol_indices"}),
    ("storages", "legacy typed storages and storage management (pinning, sharing, resizing "
     "in place): tapegrad's storage is the numpy array", lambda ns, n, o, names:
     bool(_STORAGE.match(n))),
    ("named tensors", "named tensors are a PyTorch prototype feature", lambda ns, n, o, names:
     bool(_NAMED.match(n))),
    ("nested tensors", "nested (jagged) tensors are a PyTorch prototype layout",
     lambda ns, n, o, names: bool(_NESTED.match(n))),
    ("removed or deprecated", "removed in PyTorch 2 (kept only to raise an error) or "
     "deprecated aliases: linalg's replacements, the underscore nn.init functions, DataPipes "
     "(moved to torchdata), Python 2 operators", lambda ns, n, o, names:
     n in _DEPRECATED.get(ns, ())),
    ("multi-device and streams", "streams, events and multi-GPU data parallelism (one CPU "
     "device, synchronous execution; distributed training is tapegrad.distributed's)",
     lambda ns, n, o, names: bool(_DISTRIBUTED.match(n))),
    ("in-place function variants", "torch.foo_ functions duplicate Tensor.foo_ (counted under "
     "Tensor); scripts call the method", lambda ns, n, o, names:
     _is_inplace_function(ns, n, names)),
]


def _resolve(path):
    """The object at a dotted path (module or module attribute), or None."""
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        try:
            for p in parts[k:]:
                obj = getattr(obj, p)
        except AttributeError:
            return None
        return obj
    return None


def _public_names(obj, is_class):
    """The names a namespace offers: ``__all__`` and every attribute (private ones too: the
    'private' group counts them), less what a class inherits from ``object``."""
    if obj is None:
        return set()
    names = set(getattr(obj, "__all__", ()) if not is_class else ()) | set(dir(obj))
    if is_class:
        return names - set(dir(object))
    # submodules appear in dir() once anything imported them (torch._dynamo, torch.onnx...):
    # count a fixed list only, so the report does not depend on what ran before it
    return {n for n in names if n in _STABLE_SUBMODULES
            or not isinstance(getattr(obj, n, None), types.ModuleType)}


# the submodules counted (in the 'submodules' group) whatever has been imported
_STABLE_SUBMODULES = {
    "nn", "optim", "jit", "cuda", "autograd", "linalg", "special", "fft", "distributions",
    "utils", "backends", "sparse", "func", "amp", "cpu", "mps", "distributed", "profiler",
    "testing", "hub", "quantization", "export", "fx", "compiler", "accelerator", "library",
    "overrides", "random", "serialization", "multiprocessing", "masked", "nested", "signal",
    "types", "xpu", "mtia", "functional", "init", "parameter", "modules", "parallel", "data",
    "lr_scheduler", "swa_utils", "constraints", "transforms", "kl", "forward_ad", "_C"}


_MACHINERY = {"__dict__", "__weakref__", "__module__", "__slots__", "__annotations__",
              "__firstlineno__", "__static_attributes__", "__abstractmethods__",
              "__orig_bases__", "__parameters__", "__type_params__", "__annotate__"}


def _is_private(ns, name):
    """Leading '_', except a class's operators (``Tensor.__add__``...), which are API."""
    if not name.startswith("_"):
        return False
    return not (ns == "Tensor" and name.startswith("__") and name.endswith("__")
                and name not in _MACHINERY)


def _tapegrad_names(obj, is_class):
    if obj is None:
        return set()
    names = set(dir(obj))
    if is_class:  # instance attributes set in __init__ (data, grad...)
        import tapegrad

        try:
            names |= set(dir(tapegrad.zeros(1, requires_grad=True)))
        except Exception:  # noqa: BLE001 - a broken factory must not hide the report
            pass
    return names


def namespace_report(title, torch_path, tapegrad_path):
    """``dict(present=[...], missing=[...], excluded={group: [...]}, available=bool)``."""
    torch_obj = _resolve(torch_path)
    is_class = isinstance(torch_obj, type)
    names = _public_names(torch_obj, is_class)
    tg_obj = _resolve(tapegrad_path)
    have = _tapegrad_names(tg_obj, is_class)
    present, missing, excluded = [], [], {g: [] for g, _, _ in EXCLUSIONS}
    for n in sorted(names):
        if _is_private(title, n):  # private even where tapegrad has the same name
            excluded["private"].append(n)
            continue
        if n in have:
            present.append(n)
            continue
        try:
            o = getattr(torch_obj, n)
        except Exception:  # noqa: BLE001 - lazy attributes that fail to import
            o = None
        for group, _, test in EXCLUSIONS:
            if test(title, n, o, names):
                excluded[group].append(n)
                break
        else:
            missing.append(n)
    return {"present": present, "missing": missing, "excluded": excluded,
            "available": tg_obj is not None}


def _names(names, width=100):
    if not names:
        return "(none)"
    return "\n".join(textwrap.wrap(", ".join(f"`{n}`" for n in names), width,
                                   break_on_hyphens=False))


def _percent(p, m):
    return f"{100.0 * p / (p + m):.1f}%" if p + m else "n/a"


DATE_PREFIX = "Generated on "


def generate(date=None):
    """The markdown report (needs torch)."""
    import torch

    import tapegrad

    date = date or datetime.date.today().isoformat()
    reports = [(t, tp, gp, what, namespace_report(t, tp, gp)) for t, tp, gp, what in NAMESPACES]
    out = ["# API coverage against PyTorch", "",
           f"{DATE_PREFIX}{date} by `python -m tapegrad coverage --write`, comparing tapegrad "
           f"{tapegrad.__version__} with torch {torch.__version__}.", "",
           "This file is generated: do not edit it. Regenerate it with "
           "`python -m tapegrad coverage --write` whenever names are added to (or removed "
           "from) tapegrad; `tests/test_coverage_report.py` fails while it is out of date.", "",
           "Per namespace: the public names PyTorch has, those tapegrad has (*present*), those "
           "it lacks (*missing*) and present / (present + missing). Names that cannot apply to "
           "a CPU framework on numpy are left out of the percentage, each in a named group "
           "whose reason is given below; a name tapegrad provides counts as present whatever "
           "its group (private names aside).", "",
           "| namespace | counted | present | missing | excluded | coverage |",
           "|---|---:|---:|---:|---:|---:|"]
    tp_all = tm_all = 0
    for t, tp, gp, what, r in reports:
        p, m = len(r["present"]), len(r["missing"])
        x = sum(len(v) for v in r["excluded"].values())
        tp_all, tm_all = tp_all + p, tm_all + m
        out.append(f"| [`{tp}`](#{_anchor(t)}) | {p + m} | {p} | {m} | {x} | {_percent(p, m)} |")
    out.append(f"| **all** | {tp_all + tm_all} | {tp_all} | {tm_all} | | "
               f"{_percent(tp_all, tm_all)} |")
    out += ["", "## Excluded groups", "",
            "| group | reason | names |", "|---|---|---:|"]
    for group, reason, _ in EXCLUSIONS:
        k = sum(len(r["excluded"][group]) for *_, r in reports)
        out.append(f"| {group} | {reason} | {k} |")
    for t, tp, gp, what, r in reports:
        p, m = len(r["present"]), len(r["missing"])
        out += ["", f"## {t}", "",
                f"`{tp}` ({what}) against `{gp}`: {p} of {p + m} present, "
                f"{_percent(p, m)}."]
        if not r["available"]:
            out.append(f"`{gp}` does not exist yet.")
        out += ["", f"**Missing ({m}):**", "", _names(r["missing"]), "",
                f"**Present ({p}):**", "", _names(r["present"])]
        groups = [(g, names) for g, names in r["excluded"].items() if names]
        if groups:
            out += ["", "**Excluded:**", ""]
            for g, names in groups:
                listed = "not listed" if g == "private" else ", ".join(f"`{n}`" for n in names)
                out.append(f"- *{g}* ({len(names)}): {listed}")
    return "\n".join(out) + "\n"


def _anchor(title):
    return re.sub(r"[^a-z0-9_ -]", "", title.lower()).replace(" ", "-")


def default_path():
    """docs/coverage.md of the source checkout this tapegrad was imported from."""
    return pathlib.Path(__file__).resolve().parents[2] / "docs" / "coverage.md"


def strip_date(text):
    return "\n".join(line for line in text.splitlines() if not line.startswith(DATE_PREFIX))


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="tapegrad coverage",
        description="tapegrad's namespaces against PyTorch's: present, missing, excluded "
                    "(with reasons) and the percentage, as markdown.")
    p.add_argument("--write", action="store_true",
                   help=f"write the report to docs/coverage.md ({default_path()})")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when docs/coverage.md differs from a fresh report "
                        "(the date line aside)")
    p.add_argument("-o", "--output", help="write the report to this file")
    args = p.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("tapegrad coverage: PyTorch is not installed, and the report compares tapegrad "
              "with torch's namespaces; install it (pip install torch, the CPU build "
              "suffices) and run again.", file=sys.stderr)
        return 2
    text = generate()
    path = pathlib.Path(args.output) if args.output else default_path()
    if args.check:
        old = path.read_text() if path.exists() else ""
        if strip_date(old) != strip_date(text):
            print(f"tapegrad coverage: {path} is out of date; regenerate it with "
                  "`python -m tapegrad coverage --write`", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    if args.write or args.output:
        path.write_text(text)
        print(f"wrote {path}")
        return 0
    sys.stdout.write(text)
    return 0
