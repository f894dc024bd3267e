"""tapegrad: a tensor framework with reverse-mode autodiff, PyTorch's API and numbers.

    import tapegrad as torch
"""
from tapegrad.dtypes import (dtype, float16, bfloat16, float32, float64, uint8, int8, int16,
                             int32, int64, bool_ as bool, get_default_dtype, set_default_dtype,
                             promote_types)
from tapegrad.dtypes import float16 as half, float32 as float, float64 as double  # noqa
from tapegrad.dtypes import int64 as long, int32 as int  # noqa
from tapegrad.tensor import Tensor
from tapegrad.autograd.grad_mode import (no_grad, enable_grad, set_grad_enabled,
                                         inference_mode, is_grad_enabled,
                                         is_inference_mode_enabled)
from tapegrad.ops.elementwise import *  # noqa: F401,F403
from tapegrad.ops.elementwise import add_alpha as add, sub_alpha as sub  # noqa: F401
from tapegrad.ops.reduce import *  # noqa: F401,F403
from tapegrad.ops.movement import *  # noqa: F401,F403
from tapegrad.ops.indexing import *  # noqa: F401,F403
from tapegrad.ops.linalg import *  # noqa: F401,F403
from tapegrad.creation import *  # noqa: F401,F403
from tapegrad.random import *  # noqa: F401,F403
# devices, legacy tensor types, PyTorch's namespaces for accelerators
from tapegrad.backend.device import device  # noqa: F401,E402
from tapegrad.ops.selection import *  # noqa: F401,F403,E402
from tapegrad.ops.pointwise_math import *  # noqa: F401,F403,E402
from tapegrad.ops.composites import *  # noqa: F401,F403,E402
# scans, order statistics, index writes
from tapegrad.ops.scan import *  # noqa: F401,F403,E402
from tapegrad.ops.statistics import *  # noqa: F401,F403,E402
from tapegrad.ops.index_writes import *  # noqa: F401,F403,E402
from tapegrad.tensor import TENSOR_TYPES as _TENSOR_TYPES, softmax, log_softmax  # noqa: E402
from tapegrad.autograd.anomaly import is_anomaly_enabled, is_anomaly_check_nan_enabled  # noqa
from tapegrad import cuda, accelerator, backends, distributed  # noqa: F401,E402
globals().update(_TENSOR_TYPES)  # FloatTensor, DoubleTensor, LongTensor, ...
from tapegrad import autograd, nn, optim, utils, profiler  # noqa: F401
from tapegrad.io import save, load  # noqa: F401,E402
from tapegrad import sparse  # noqa: F401,E402  (sparse COO tensors)
from tapegrad.sparse import (layout, strided, sparse_coo, sparse_coo_tensor,  # noqa: F401,E402
                             spmm)
from tapegrad import io, safetensors, serialization  # noqa: F401,E402
from tapegrad import linalg  # noqa: F401,E402  (torch.linalg; det, trace, kron, cdist...)
globals().update(linalg.TOPLEVEL)
from tapegrad import special  # noqa: F401,E402  (torch.special; erfc, lgamma, i0... below)
globals().update(special.TOPLEVEL)
from tapegrad.runtime import (set_num_threads, get_num_threads, set_num_interop_threads,  # noqa
                              get_num_interop_threads, empty_cache)
# mixed precision: torch.autocast, torch.amp, torch.cpu.amp, torch.cuda.amp
from tapegrad import amp, cpu  # noqa: F401,E402
import tapegrad.cuda.amp  # noqa: F401,E402
from tapegrad.amp.autocast_mode import (  # noqa: F401,E402
    autocast, is_autocast_enabled, set_autocast_enabled, get_autocast_dtype, set_autocast_dtype,
    is_autocast_cpu_enabled, set_autocast_cpu_enabled, get_autocast_cpu_dtype,
    set_autocast_cpu_dtype, is_autocast_cache_enabled, set_autocast_cache_enabled,
    clear_autocast_cache, autocast_increment_nesting, autocast_decrement_nesting)

__version__ = "0.1.0"
from tapegrad import compiler  # noqa: F401,E402  (trace, passes, codegen)
from tapegrad.compiler import compile  # noqa: F401,E402
from tapegrad import distributions  # noqa: F401,E402  (torch.distributions)
from tapegrad import func  # noqa: F401,E402  (torch.func transforms)
from tapegrad.autograd import forward_ad, functional as _autograd_functional  # noqa: F401,E402
