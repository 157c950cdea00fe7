# make demo: install and run the 2-rank DeepSpeed demo.  make test: install and run the test suite.
.PHONY: setup demo test lint bench

setup: .venv/.installed

.venv/.installed: pyproject.toml scripts/setup.sh
	./scripts/setup.sh
	touch $@

demo: setup
	.venv/bin/diag demo

test: setup
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python -m bench.overhead
