"""tapegrad.utils.tensorboard.SummaryWriter: event files read back by TensorBoard's own reader."""
import subprocess
import sys

import numpy as np
import pytest

import tapegrad
from tapegrad.utils.tensorboard import SummaryWriter

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa


def _read(path):
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "histograms": 0,
                                                     "tensors": 0})
    acc.Reload()
    return acc


def test_scalars_histogram_text(tmp_path):
    values = tapegrad.randn(1000, dtype=tapegrad.float64)
    with SummaryWriter(tmp_path) as w:
        assert w.get_logdir() == str(tmp_path)
        for step in range(5):
            w.add_scalar("loss", tapegrad.tensor(1.0 / (step + 1)), step)
        w.add_scalar("lr", 0.25, global_step=7)
        w.add_scalar("acc", np.array([0.5]), 3, new_style=True)
        w.add_histogram("weights", values, 2)
        w.add_text("note", "hello **tapegrad**", 1)
        w.add_scalars("pair", {"train": tapegrad.tensor(1.5), "valid": 2.5}, 4)
    acc = _read(tmp_path)
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [0, 1, 2, 3, 4]
    np.testing.assert_allclose([e.value for e in loss], [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5],
                               rtol=1e-7)
    assert acc.Scalars("lr")[0].step == 7 and acc.Scalars("lr")[0].value == 0.25
    acc_tensor = acc.Tensors("acc")[0]
    assert acc_tensor.step == 3 and acc_tensor.tensor_proto.float_val[0] == 0.5
    h = acc.Histograms("weights")[0]
    data = values.numpy()
    assert h.step == 2
    assert h.histogram_value.num == 1000
    assert h.histogram_value.min == data.min() and h.histogram_value.max == data.max()
    np.testing.assert_allclose(h.histogram_value.sum, data.sum(), rtol=1e-12)
    np.testing.assert_allclose(h.histogram_value.sum_squares, data @ data, rtol=1e-12)
    assert sum(h.histogram_value.bucket) == 1000
    text = acc.Tensors("note/text_summary")[0]
    assert text.step == 1 and text.tensor_proto.string_val == [b"hello **tapegrad**"]
    for run, value in (("pair_train", 1.5), ("pair_valid", 2.5)):
        event = _read(tmp_path / run).Scalars("pair")[0]
        assert event.step == 4 and event.value == value


def test_histogram_with_numpy_bins_and_torch_tensor(tmp_path):
    torch = pytest.importorskip("torch")
    w = SummaryWriter(str(tmp_path), flush_secs=1)
    w.add_histogram("h", torch.arange(10.0), 0, bins=5)
    w.add_scalar("t", torch.tensor(3.0), 1)
    w.flush()
    acc = _read(tmp_path)
    assert list(acc.Histograms("h")[0].histogram_value.bucket) == [0, 2, 2, 2, 2, 2]
    assert acc.Scalars("t")[0].value == 3.0
    w.close()


def test_errors(tmp_path):
    with SummaryWriter(tmp_path) as w:
        with pytest.raises(ValueError, match="exactly one element"):
            w.add_scalar("x", tapegrad.ones(2))
        with pytest.raises(ValueError, match="no element"):
            w.add_histogram("h", tapegrad.ones(0))
        with pytest.raises(NotImplementedError, match="add_graph"):
            w.add_graph(tapegrad.nn.Linear(2, 2), tapegrad.ones(1, 2))


def test_without_tensorboard_installed(tmp_path):
    """Importing works; constructing a writer says how to install the package."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tensorboard' or name.startswith('tensorboard.'):\n"
        "            raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from tapegrad.utils.tensorboard import SummaryWriter\n"
        "try:\n"
        f"    SummaryWriter({str(tmp_path)!r})\n"
        "except ImportError as e:\n"
        "    print('IMPORTERROR', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert "IMPORTERROR" in out.stdout and "pip install tensorboard" in out.stdout, out.stderr
