"""``python -m tpu_info ...``: the ``tpu-info`` command, for environments
without its console script (torch_xla's own venv, say)."""

from __future__ import annotations

from tpu_info.commands.cli import run

if __name__ == "__main__":
    run()
