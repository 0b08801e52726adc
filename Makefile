# One command to fine-tune the tiny model (make run), one to pass the tests (make test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TINY := models/tiny-llama
# The web page's charting library (uPlot), from the npm registry into api/web/node_modules.
WEB := tunestudio/api/web
WEB_STAMP := $(WEB)/node_modules/.installed-stamp
# The browser tests drive Debian's chromium; Playwright never downloads a browser of its own.
CHROMIUM := /usr/bin/chromium

.PHONY: setup run serve test lint bench clean

setup: $(STAMP) $(WEB_STAMP)

# torch first, exactly 2.13.0 (the CPU build on this disk); everything else
# under constraints.txt, so no package can pull a CUDA build of torch.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,ray]'
	touch $(STAMP)

$(WEB_STAMP): $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --no-audit --no-fund
	touch $(WEB_STAMP)

$(CHROMIUM):
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y chromium

# Rebuilt when its builder changes; the tests use this same model.
$(TINY)/config.json: tunestudio/worker/tiny.py | $(STAMP)
	rm -rf $(TINY)
	$(BIN)/tunestudio make-tiny-model $(TINY)

run: $(STAMP) $(WEB_STAMP) $(TINY)/config.json
	$(BIN)/tunestudio train examples/quickstart.yaml

serve: $(STAMP) $(WEB_STAMP) $(TINY)/config.json
	$(BIN)/tunestudio serve

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) $(WEB_STAMP) $(CHROMIUM) $(TINY)/config.json
	$(BIN)/ruff check .
	$(BIN)/pytest

# Every benchmark, sized to finish together in under 10 minutes on 2 cores (5.5 min measured);
# worker_overhead runs at its own size (3 rounds of 80 steps): at 2 x 40 its noise hides a 3 % margin;
# each prints its figures and ends with one JSON line (bench/RESULTS.md).
bench: $(STAMP) $(TINY)/config.json
	$(BIN)/python bench/worker_overhead.py
	$(BIN)/python bench/startup.py --rounds 2
	$(BIN)/python bench/orchestrator.py
	$(BIN)/python bench/api.py
	$(BIN)/python bench/throughput.py --steps 10

clean:
	rm -rf $(VENV) $(TINY) outputs $(WEB)/node_modules
