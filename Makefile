# make demo: install and run the 2-rank DeepSpeed demo.  make test: install and run the test suite.
.PHONY: setup demo test test-compat lint bench

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

# pytest on two xdist workers: the real jobs (tests/conftest.py's SERIAL_GROUP) one after another on one
# worker, the in-process tests on both; --durations: the slowest, in CI's log (kept well under 30 min)
test: setup .venv/.bench
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=20

# the second leg: the real-job tests on Python 3.12 with the newest torch, DeepSpeed and megatron-core
COMPAT_TESTS = tests/integration tests/unit/test_overflow.py tests/unit/test_steps.py \
	tests/unit/test_modules.py tests/unit/test_layers.py

.venv-compat/.installed: pyproject.toml scripts/setup_compat.sh
	./scripts/setup_compat.sh
	touch $@

# the short fault matrix (one job: healthy, straggler, hang) runs in `make test` only, to keep CI's total down;
# the whole matrix: `python -m bench.faults`
test-compat: .venv-compat/.installed
	.venv-compat/bin/python -m pytest -q $(COMPAT_TESTS) --ignore=tests/integration/test_fault_matrix.py

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python scripts/typecheck.py
	.venv/bin/python scripts/lint_imports.py

bench: setup
	.venv/bin/python -m bench.overhead
