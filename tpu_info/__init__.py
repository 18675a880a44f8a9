"""tpu-info: what your accelerators and the XLA programs on them are doing.

This package is the CLI side and the wire contract. It imports neither torch
nor jax (nor the in-process ``metrics`` package), so ``tpu-info`` starts fast.
"""

__version__ = "0.1.0"  # the distribution's version too (pyproject.toml: dynamic)
