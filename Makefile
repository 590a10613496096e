# The two README commands are `make demo` and `make test`; both run the idempotent setup first.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint typecheck unit

setup:
	bash scripts/setup.sh

# The toolkit's main job on built-in data: every engine against the single-process reference.
demo: setup
	$(BIN)/toolkit doctor
	$(BIN)/toolkit parity --out reports/parity

lint:
	$(BIN)/ruff check toolkit tests hvd_examples
	$(BIN)/ruff format --check toolkit tests hvd_examples
	$(BIN)/lint-imports --no-cache

typecheck:
	$(BIN)/mypy

unit:
	$(BIN)/pytest -q -m "not multiproc"

test: setup lint typecheck
	$(BIN)/pytest -q --durations=15
