# The README's two commands: `make demo` and `make test`. Both set up .venv.
# `make test-fast` is the quick loop: unit tests only, in under two minutes.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?= -q

.PHONY: venv demo test test-fast test-tpu lint bench bench-smoke clean xla-env

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# A .venv made before the rename holds our editable `tpu-info`: remove it
	@# first (never Google's: that one is not editable), or it would take the
	@# console script with it when uninstalled later.
	$(PY) -m pip show tpu-info 2>/dev/null | grep '^Editable project location:' >/dev/null \
		&& $(PY) -m pip uninstall -q -y tpu-info || true
	@# torch by name: the [torch] extra never installs or changes torch.
	$(PY) -m pip install -q -c constraints.txt -e '.[jax,torch,dev,docs]' torch
	touch $(STAMP)

venv: $(STAMP)

# A real JAX training program with the hook, shown by `tpu-info` from outside.
demo: venv
	$(PY) examples/demo.py

# The whole suite (torch_xla's tests run in their own venv, built once);
# pytest's exit code 5 (no tests collected) is not a failure.
test: venv xla-env
	$(PY) -m pytest $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] && echo "no tests collected" || exit $$rc; }

# The quick loop: unit tests only (no tests/system, no test marked slow); a
# kept test that starts a process fails (tests/conftest.py, --fast).
test-fast: venv
	$(PY) -m pytest $(PYTEST_ARGS) --fast || { rc=$$?; [ $$rc -eq 5 ] && echo "no tests collected" || exit $$rc; }

# The TPU lane: only the tests marked `tpu` (tests/tpu: a hooked JAX program on
# the chip, read by tpu-info from another process), on a machine with a TPU chip.
# It builds no venv (the TPU machine reaches no package registry): it runs that
# machine's python3 with this checkout added in front of its PYTHONPATH (which
# names libtpu's folder: added to, never replaced). To take the project there,
# ../shared/tools/tpu-wheels puts the runtime wheels into .whl-tpu/ and prints
# the line that installs them on that machine. Elsewhere the tests are skipped.
test-tpu:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) -m pytest $(PYTEST_ARGS) -m tpu tests/tpu

lint: venv
	$(PY) -m ruff check .

# Every benchmark, one table of ratios against targets (bench-smoke: briefly).
bench: venv xla-env
	$(PY) bench/run_all.py

bench-smoke: venv
	$(PY) bench/run_all.py --smoke

# torch_xla needs torch 2.9.0: its own venv outside the clone, keyed by the pins
# (~/.cache/tpu-info/xla-venv-torch2.9.0-xla2.9.0; about 4 GB the first time).
# tests/metrics/engines/torch/test_torch_xla.py and bench/overhead_torch.py use it when it exists.
xla-env:
	bash tools/xla-env.sh

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
