"""``SummaryWriter``: scalars, scalar groups, histograms and text as TensorBoard event files.

The event files are written by tensorboard's own ``EventFileWriter`` with the summaries
PyTorch writes (``simple_value`` scalars, ``HistogramProto`` with TensorFlow's default
buckets, the text plugin's string tensors), so TensorBoard and its ``EventAccumulator`` read
them as they read PyTorch's.
"""
import os
import socket
import time
from datetime import datetime

from tapegrad.backend import xp
from tapegrad.tensor import Tensor

_INSTALL = ("tapegrad.utils.tensorboard.SummaryWriter needs the optional tensorboard "
            "package: pip install tensorboard (or pip install 'tapegrad[tensorboard]')")


def _tb():
    """The tensorboard pieces the writer needs; ImportError naming the pip command."""
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as e:
        raise ImportError(_INSTALL) from e
    return event_pb2, summary_pb2, TensorProto, TensorShapeProto, TextPluginData, \
        EventFileWriter


def _to_numpy(x):
    """Tensors (tapegrad or anything with ``.numpy()``), numpy arrays, lists, numbers."""
    if isinstance(x, Tensor):
        return x.detach().numpy()
    if hasattr(x, "detach") and hasattr(x, "numpy"):  # a torch tensor, as PyTorch accepts
        return x.detach().cpu().numpy()
    return xp.asarray(x)


def _scalar(name, value):
    a = _to_numpy(value)
    if a.size != 1:
        raise ValueError(f"SummaryWriter.{name}: scalar should have exactly one element, got "
                         f"shape {tuple(a.shape)}")
    return a.reshape(()).item()


def _default_bins():
    v = 1e-12
    buckets, neg_buckets = [], []
    while v < 1e20:
        buckets.append(v)
        neg_buckets.append(-v)
        v *= 1.1
    return neg_buckets[::-1] + [0] + buckets


def _make_histogram(summary_pb2, values, bins, max_bins=None):
    """PyTorch's ``make_histogram``: numpy's histogram, trimmed to the non-empty range."""
    if values.size == 0:
        raise ValueError("The input has no element.")
    values = values.reshape(-1).astype(xp.float64)
    counts, limits = xp.histogram(values, bins=bins)
    num_bins = len(counts)
    if max_bins is not None and num_bins > max_bins:
        subsampling = num_bins // max_bins
        remainder = num_bins % subsampling
        if remainder:
            counts = xp.pad(counts, pad_width=[[0, subsampling - remainder]],
                            mode="constant", constant_values=0)
        counts = counts.reshape(-1, subsampling).sum(axis=-1)
        new_limits = xp.empty((counts.size + 1,), limits.dtype)
        new_limits[:-1] = limits[:-1:subsampling]
        new_limits[-1] = limits[-1]
        limits = new_limits
    cum_counts = xp.cumsum(xp.greater(counts, 0))
    start, end = xp.searchsorted(cum_counts, [0, cum_counts[-1] - 1], side="right")
    start, end = int(start), int(end) + 1
    counts = counts[start - 1:end] if start > 0 else xp.concatenate([[0], counts[:end]])
    limits = limits[start:end + 1]
    if counts.size == 0 or limits.size == 0:
        raise ValueError("The histogram is empty, please file a bug report.")
    return summary_pb2.HistogramProto(
        min=values.min(), max=values.max(), num=len(values), sum=values.sum(),
        sum_squares=values.dot(values), bucket_limit=limits.tolist(), bucket=counts.tolist())


class _FileWriter:
    def __init__(self, tb, log_dir, max_queue, flush_secs, filename_suffix):
        self.event_pb2 = tb[0]
        self.event_writer = tb[5](log_dir, max_queue, flush_secs, filename_suffix)

    def add_summary(self, summary, global_step=None, walltime=None):
        event = self.event_pb2.Event(summary=summary)
        event.wall_time = time.time() if walltime is None else walltime
        if global_step is not None:
            event.step = int(global_step)
        self.event_writer.add_event(event)

    def flush(self):
        self.event_writer.flush()

    def close(self):
        self.event_writer.close()


class SummaryWriter:
    """As ``torch.utils.tensorboard.SummaryWriter(log_dir=None, comment='', ...)``.

    >>> with SummaryWriter("runs/exp") as w:
    ...     w.add_scalar("loss", loss, global_step=step)
    """

    def __init__(self, log_dir=None, comment="", purge_step=None, max_queue=10,
                 flush_secs=120, filename_suffix=""):
        self._tb = _tb()
        if not log_dir:
            current_time = datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", current_time + "_" + socket.gethostname() + comment)
        self.log_dir = str(log_dir)
        self.purge_step = purge_step
        self.max_queue = max_queue
        self.flush_secs = flush_secs
        self.filename_suffix = filename_suffix
        self.file_writer = None
        self.all_writers = {}
        self._get_file_writer()

    def _get_file_writer(self):
        if self.all_writers is None or self.file_writer is None:
            self.file_writer = _FileWriter(self._tb, self.log_dir, self.max_queue,
                                           self.flush_secs, self.filename_suffix)
            self.all_writers = {self.file_writer.event_writer.get_logdir(): self.file_writer}
            if self.purge_step is not None:
                event_pb2 = self._tb[0]
                most_recent_step = self.purge_step
                self.file_writer.event_writer.add_event(
                    event_pb2.Event(step=most_recent_step, file_version="brain.Event:2"))
                self.file_writer.event_writer.add_event(
                    event_pb2.Event(step=most_recent_step, session_log=event_pb2.SessionLog(
                        status=event_pb2.SessionLog.START)))
                self.purge_step = None
        return self.file_writer

    def get_logdir(self):
        """The directory the event files go to."""
        return self.log_dir

    def add_scalar(self, tag, scalar_value, global_step=None, walltime=None, new_style=False,
                   double_precision=False):
        """One scalar (a number, or a one-element tensor or array) at ``global_step``."""
        summary_pb2 = self._tb[1]
        value = float(_scalar("add_scalar", scalar_value))
        if new_style:
            TensorProto, TensorShapeProto = self._tb[2], self._tb[3]
            if double_precision:
                tensor = TensorProto(double_val=[value], dtype="DT_DOUBLE",
                                     tensor_shape=TensorShapeProto())
            else:
                tensor = TensorProto(float_val=[value], dtype="DT_FLOAT",
                                     tensor_shape=TensorShapeProto())
            metadata = summary_pb2.SummaryMetadata(
                plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                tag=tag, tensor=tensor, metadata=metadata)])
        else:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                tag=tag, simple_value=value)])
        self._get_file_writer().add_summary(summary, global_step, walltime)

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, walltime=None):
        """Several scalars under ``main_tag``: one run directory per key (as PyTorch)."""
        summary_pb2 = self._tb[1]
        walltime = time.time() if walltime is None else walltime
        fw_logdir = self._get_file_writer().event_writer.get_logdir()
        for tag, scalar_value in tag_scalar_dict.items():
            fw_tag = fw_logdir + "/" + main_tag.replace("/", "_") + "_" + tag
            if fw_tag in self.all_writers:
                fw = self.all_writers[fw_tag]
            else:
                fw = _FileWriter(self._tb, fw_tag, self.max_queue, self.flush_secs,
                                 self.filename_suffix)
                self.all_writers[fw_tag] = fw
            value = float(_scalar("add_scalars", scalar_value))
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                tag=main_tag, simple_value=value)])
            fw.add_summary(summary, global_step, walltime)

    def add_histogram(self, tag, values, global_step=None, bins="tensorflow", walltime=None,
                      max_bins=None):
        """A histogram of ``values`` (tensor or array); ``bins`` as numpy's or 'tensorflow'."""
        summary_pb2 = self._tb[1]
        if isinstance(bins, str) and bins == "tensorflow":
            bins = _default_bins()
        hist = _make_histogram(summary_pb2, _to_numpy(values), bins, max_bins=max_bins)
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, histo=hist)])
        self._get_file_writer().add_summary(summary, global_step, walltime)

    def add_text(self, tag, text_string, global_step=None, walltime=None):
        """Text (markdown) for TensorBoard's text plugin, under ``tag + '/text_summary'``."""
        summary_pb2, TensorProto, TensorShapeProto, TextPluginData = \
            self._tb[1], self._tb[2], self._tb[3], self._tb[4]
        plugin_data = summary_pb2.SummaryMetadata.PluginData(
            plugin_name="text", content=TextPluginData(version=0).SerializeToString())
        metadata = summary_pb2.SummaryMetadata(plugin_data=plugin_data)
        tensor = TensorProto(dtype="DT_STRING", string_val=[text_string.encode("utf_8")],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
            tag=tag + "/text_summary", metadata=metadata, tensor=tensor)])
        self._get_file_writer().add_summary(summary, global_step, walltime)

    def add_graph(self, model, input_to_model=None, verbose=False, use_strict_trace=True):
        """Not available: PyTorch exports a TorchScript trace of the model; tapegrad has no
        TorchScript. Use ``tapegrad.compiler.trace`` for a printable graph instead."""
        raise NotImplementedError(
            "SummaryWriter.add_graph: not supported by tapegrad (PyTorch writes a TorchScript "
            "trace, which tapegrad does not have); print tapegrad's traced graph instead")

    def flush(self):
        """Write pending events to disk."""
        if self.all_writers is None:
            return
        for writer in self.all_writers.values():
            writer.flush()

    def close(self):
        """Flush and close every event file; the writer reopens one if used again."""
        if self.all_writers is None:
            return
        for writer in self.all_writers.values():
            writer.flush()
            writer.close()
        self.file_writer = self.all_writers = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.close()
