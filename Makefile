# The README's two commands: `make demo` and `make test`. Both set up .venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?= -q

.PHONY: venv demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[jax,torch,dev]'
	touch $(STAMP)

venv: $(STAMP)

# A real JAX training program with the hook, then what the tool saw of it.
demo: venv
	$(PY) examples/jax_mlp.py --steps 200

# The whole suite; pytest's exit code 5 (no tests collected) is not a failure.
test: venv
	$(PY) -m pytest $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] && echo "no tests collected" || exit $$rc; }

lint: venv
	$(PY) -m ruff check .

bench: venv
	$(PY) bench/record_cost.py
	$(PY) bench/overhead_jax.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
