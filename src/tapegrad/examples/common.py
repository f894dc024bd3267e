"""Plumbing shared by the examples: arguments, progress bar, reference run, plots, saving."""
import argparse
import os
import time

import numpy as np

import tapegrad


def parse_args(name, description, steps, extra=None, argv=None):
    p = argparse.ArgumentParser(prog=f"python -m tapegrad.examples.{name}",
                                description=description)
    p.add_argument("--steps", type=int, default=steps, help="training steps")
    p.add_argument("--reference", choices=["torch"], default=None,
                   help="also train the same model in PyTorch from the same initial weights")
    p.add_argument("--out", default=os.path.join("out", name),
                   help="folder for the loss-curve PNG and the final weights")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    if extra:
        extra(p)
    return p.parse_args(argv)


def progress(total, desc, disable=False):
    """A tqdm bar when tqdm is installed (the examples extra), else a silent counter."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the examples and test extras
        tqdm = None
    if tqdm is None or disable:
        return _Silent()
    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


class _Silent:
    def update(self, n=1):
        pass

    def set_postfix(self, **kw):
        pass

    def close(self):
        pass


def to_torch_state(state_dict):
    """A tapegrad state_dict as torch tensors (same names, same values)."""
    import torch

    return {k: torch.from_numpy(np.array(v.detach().numpy())) for k, v in state_dict.items()}


def train_loop(T, model, step_fn, steps, desc, disable_progress=False):
    """Run ``step_fn(T, model, i) -> loss float`` ``steps`` times; return losses and seconds."""
    bar = progress(steps, desc, disable_progress)
    losses = []
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step_fn(T, model, i)
        losses.append(loss)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")
    bar.close()
    return losses, time.perf_counter() - t0


def report_reference(losses, ref_losses, seconds, ref_seconds):
    diff = float(np.max(np.abs(np.array(losses) - np.array(ref_losses))))
    print(f"reference (PyTorch {_torch_version()}): final loss {ref_losses[-1]:.6f}, "
          f"{ref_seconds:.2f} s")
    print(f"largest loss difference along the run: {diff:.3e}")
    print(f"speed: tapegrad {seconds:.2f} s vs PyTorch {ref_seconds:.2f} s "
          f"({ref_seconds / seconds:.2f}x PyTorch's speed)")
    return diff


def _torch_version():
    import torch

    return torch.__version__


def save_outputs(out_dir, name, losses, model, ref_losses=None):
    """The loss-curve PNG and the final weights (safetensors if available, else tapegrad.save)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(losses, label="tapegrad")
        if ref_losses is not None:
            ax.plot(ref_losses, "--", label="PyTorch")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(name)
        ax.legend()
        fig.tight_layout()
        png = os.path.join(out_dir, "loss.png")
        fig.savefig(png, dpi=100)
        plt.close(fig)
        paths.append(png)
    except ImportError:
        print("(matplotlib not installed: no loss curve)")
    weights = os.path.join(out_dir, "weights.tg")
    tapegrad.save(model.state_dict(), weights)
    paths.append(weights)
    print("wrote " + ", ".join(paths))
    return paths
