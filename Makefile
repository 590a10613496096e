# The two README commands are `make demo` and `make test`; both run the idempotent setup first.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint typecheck unit

setup:
	bash scripts/setup.sh

# The toolkit's main job on built-in data: every engine against the single-process reference,
# then a real model: the GPT example under DeepSpeed ZeRO-2 to its stated perplexity.
GPT_SPEC := hvd_examples/specs/gpt_zero2.yaml
demo: setup
	$(BIN)/toolkit doctor
	$(BIN)/toolkit parity --out reports/parity
	mkdir -p reports/gpt
	$(BIN)/toolkit launch --spec $(GPT_SPEC) -- hvd_examples/gpt_text.py --spec $(GPT_SPEC) \
		--max-perplexity 8 --plot reports/gpt/gpt.png

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
