"""``python -m tpu_info ...``: the ``tpu-info`` command, for environments
without its console script (torch_xla's own venv, say)."""

from __future__ import annotations

import sys

from tpu_info.commands.cli import main

if __name__ == "__main__":
    sys.exit(main())
