# make demo: install and run the 2-rank DeepSpeed demo.  make test: install and run the test suite.
.PHONY: setup demo test lint bench

setup: .venv/.installed

.venv/.installed: pyproject.toml scripts/setup.sh
	./scripts/setup.sh
	touch $@

# the tests also compare diag with Meta's HTA on the same traces (bench extra)
.venv/.bench: .venv/.installed
	.venv/bin/python -m pip install -q -e ".[bench]"
	touch $@

demo: setup
	.venv/bin/diag demo

test: setup .venv/.bench
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python -m bench.overhead
