"""The hook's metric names; the catalog itself is :mod:`tpu_info.catalog`."""

from tpu_info.catalog import *  # noqa: F403
from tpu_info.catalog import CATALOG, help_for, unit_for  # noqa: F401
