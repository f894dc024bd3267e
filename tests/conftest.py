import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_leaked_global_state():
    """A test leaves the process as it found it: the default dtype, grad mode and the
    dispatch-mode stack (one that leaked float64 once made unrelated tests on the same
    xdist worker fail). Restored, then reported as this test's error."""
    import tapegrad
    from tapegrad.autograd import grad_mode

    dtype = tapegrad.get_default_dtype()
    yield
    st = grad_mode.state
    leaked = []
    if tapegrad.get_default_dtype() != dtype:
        leaked.append(f"default dtype {tapegrad.get_default_dtype()} (was {dtype})")
        tapegrad.set_default_dtype(dtype)
    if not st.enabled or st.inference or st.modes:
        leaked.append(f"grad mode enabled={st.enabled} inference={st.inference} "
                      f"modes={st.modes}")
        st.enabled, st.inference, st.modes = True, False, []
    if leaked:
        pytest.fail("leaked global state: " + "; ".join(leaked))
