"""Bootstrap for ``tpu-info run``: this directory goes first on the child's
``PYTHONPATH`` so that its ``sitecustomize.py`` installs the hook.

It is a package only so that the file ships in wheels; nothing imports it.
"""
