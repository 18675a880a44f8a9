"""``tpu-info --watch``: the live Textual dashboard.

The package draws only from :mod:`tpu_info.contract.model` records; ``tpu_info`` never
imports it (the CLI imports :func:`tui.app.run` inside the ``--watch`` branch).

Example:
    >>> from tui.app import run            # doctest: +SKIP
    >>> run(["localhost:8431"], rate=1.0)  # doctest: +SKIP
    0
"""
