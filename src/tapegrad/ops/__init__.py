"""Op families. Importing this package registers every op."""
from tapegrad.ops import registry, elementwise, reduce, movement, linalg, nn  # noqa: F401
from tapegrad.ops import convolution, pooling  # noqa: F401
from tapegrad.ops import recurrent  # noqa: F401
