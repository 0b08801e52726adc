# One command to fine-tune the tiny model (make run), one to pass the tests (make test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TINY := models/tiny-llama

.PHONY: setup run test lint bench clean

setup: $(STAMP)

# torch first, exactly 2.13.0 (the CPU build on this disk); everything else
# under constraints.txt, so no package can pull a CUDA build of torch.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

$(TINY)/config.json: | $(STAMP)
	$(BIN)/tunestudio make-tiny-model $(TINY)

run: $(STAMP) $(TINY)/config.json
	$(BIN)/tunestudio train examples/quickstart.yaml

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python bench/worker_overhead.py

clean:
	rm -rf $(VENV) $(TINY) outputs
