"""``tapegrad.utils``: checkpointing and data loading."""
from tapegrad.utils import checkpoint  # noqa: F401,E402
from tapegrad.utils import data  # noqa: F401,E402
from tapegrad._aliases import alias_module as _alias  # noqa: E402

for _name in ("dataloader", "dataset", "sampler", "distributed"):  # PyTorch's paths, e.g. data.dataloader
    _alias(f"tapegrad.utils.data.{_name}", ("tapegrad.utils.data",))
