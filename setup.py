"""The one thing pyproject.toml cannot say without an experimental table: the
optional C extension of the JAX hooks' usual calls (metrics.recording.native).
Where it cannot be compiled the install goes on, and the Python hooks run."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("metrics.recording._native", ["metrics/recording/_native.c"],
                             optional=True)])
