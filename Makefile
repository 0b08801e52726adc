# One command to fine-tune the tiny model (make run), one to pass the tests (make test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TINY := models/tiny-llama
# The tiny vision-language models (two families: their image handling differs) and the bundled pictures.
VLM := models/tiny-smolvlm/config.json models/tiny-qwen2-vl/config.json
SHAPES := examples/data/shapes.jsonl
# The tiny speech-to-text model (Whisper's architecture); its clips are kept in examples/data/speech/.
WHISPER := models/tiny-whisper/config.json
# The web page's charting library (uPlot), from the npm registry into api/web/node_modules.
WEB := tunestudio/api/web
WEB_STAMP := $(WEB)/node_modules/.installed-stamp
# llama.cpp's GGUF converters (convert_hf_to_gguf.py, convert_lora_to_gguf.py, their conversion/ package and
# the gguf-py they need) from the llama-cpp-python source distribution on PyPI, pinned by version and hash;
# only those files are kept. Nothing is built: f16/bf16/q8_0 need no llama.cpp binary.
LLAMA_CPP_PY := 0.3.36
LLAMA_CPP_SHA256 := 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_CPP := third_party/llama.cpp
LLAMA_CPP_STAMP := $(LLAMA_CPP)/.llama-cpp-python-$(LLAMA_CPP_PY)
# llama.cpp's multimodal tool (llama-mtmd-cli), for bench/vision_gguf.py only (not setup, not the tests): the whole
# llama.cpp tree of the same pinned sdist, built with cmake for this CPU (about 10 min on 2 cores).
MTMD_SRC := third_party/llama.cpp-src
MTMD_CLI := $(MTMD_SRC)/build/bin/llama-mtmd-cli
# llama.cpp's Python binding (llama-cpp-python, the same pinned sdist, hash-checked), compiled with cmake for this
# CPU: chat answers through it where it measures faster (tunestudio/worker/serve/llamacpp.py). About 5 min on 2
# cores, so `make run` does not wait for it; `make test` builds it (its tests use it), `make llamacpp` alone too.
# --no-deps: its dependencies (numpy, jinja2, typing-extensions) are installed already, diskcache from constraints.
LLAMA_CPP_BINDING := $(VENV)/.llama-cpp-python-$(LLAMA_CPP_PY)
LLAMA_CPP_CMAKE := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF
# The browser tests drive Debian's chromium; Playwright never downloads a browser of its own.
CHROMIUM := /usr/bin/chromium

.PHONY: setup run run-vision run-audio serve test lint bench clean mtmd llamacpp

setup: $(STAMP) $(WEB_STAMP) $(LLAMA_CPP_STAMP)

# torch first, exactly 2.13.0 (the CPU build on this disk); everything else
# under constraints.txt, so no package can pull a CUDA build of torch.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,ray,mlflow]'
	touch $(STAMP)

# pip checks the hash (--require-hashes); pip prepares the sdist's metadata, which takes about a minute.
$(LLAMA_CPP_STAMP): | $(STAMP)
	rm -rf $(LLAMA_CPP) $(LLAMA_CPP).download
	mkdir -p $(LLAMA_CPP).download
	echo "llama-cpp-python==$(LLAMA_CPP_PY) --hash=sha256:$(LLAMA_CPP_SHA256)" > $(LLAMA_CPP).download/requirements.txt
	$(BIN)/pip download --quiet --no-deps --no-binary :all: --require-hashes \
		-r $(LLAMA_CPP).download/requirements.txt -d $(LLAMA_CPP).download
	mkdir -p $(LLAMA_CPP)
	tar -xzf $(LLAMA_CPP).download/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz -C $(LLAMA_CPP) --strip-components=3 \
		$(addprefix llama_cpp_python-$(LLAMA_CPP_PY)/vendor/llama.cpp/,LICENSE convert_hf_to_gguf.py \
		convert_lora_to_gguf.py conversion gguf-py/gguf gguf-py/LICENSE)
	rm -rf $(LLAMA_CPP).download
	touch $(LLAMA_CPP_STAMP)

$(MTMD_CLI): | $(STAMP)
	rm -rf $(MTMD_SRC) $(MTMD_SRC).download
	mkdir -p $(MTMD_SRC).download $(MTMD_SRC)
	echo "llama-cpp-python==$(LLAMA_CPP_PY) --hash=sha256:$(LLAMA_CPP_SHA256)" > $(MTMD_SRC).download/requirements.txt
	$(BIN)/pip download --quiet --no-deps --no-binary :all: --require-hashes \
		-r $(MTMD_SRC).download/requirements.txt -d $(MTMD_SRC).download
	tar -xzf $(MTMD_SRC).download/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz -C $(MTMD_SRC) --strip-components=3 \
		llama_cpp_python-$(LLAMA_CPP_PY)/vendor/llama.cpp
	rm -rf $(MTMD_SRC).download
	cmake -S $(MTMD_SRC) -B $(MTMD_SRC)/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=ON
	cmake --build $(MTMD_SRC)/build --target llama-mtmd-cli -j 2

mtmd: $(MTMD_CLI)

$(LLAMA_CPP_BINDING): | $(STAMP)
	echo "llama-cpp-python==$(LLAMA_CPP_PY) --hash=sha256:$(LLAMA_CPP_SHA256)" > $(VENV)/llama-cpp-python.txt
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(BIN)/pip install --quiet --no-deps \
		--no-binary llama-cpp-python --require-hashes -r $(VENV)/llama-cpp-python.txt
	$(BIN)/pip install --quiet -c constraints.txt diskcache
	touch $(LLAMA_CPP_BINDING)

llamacpp: $(LLAMA_CPP_BINDING)

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

models/tiny-smolvlm/config.json: tunestudio/worker/tiny_vision.py | $(STAMP)
	rm -rf models/tiny-smolvlm
	$(BIN)/tunestudio make-tiny-model models/tiny-smolvlm --vision --family smolvlm

models/tiny-qwen2-vl/config.json: tunestudio/worker/tiny_vision.py | $(STAMP)
	rm -rf models/tiny-qwen2-vl
	$(BIN)/tunestudio make-tiny-model models/tiny-qwen2-vl --vision --family qwen2_vl

# The pictures are drawn from a seed, not kept in git (examples/data/shapes/ is ignored).
$(SHAPES): tunestudio/worker/tiny_images.py | $(STAMP)
	$(BIN)/python -c "from tunestudio.worker.tiny_images import write_image_datasets as w; w('examples/data')"

run: $(STAMP) $(WEB_STAMP) $(LLAMA_CPP_STAMP) $(TINY)/config.json
	$(BIN)/tunestudio train examples/quickstart.yaml

$(WHISPER): tunestudio/worker/tiny_audio.py | $(STAMP)
	rm -rf models/tiny-whisper
	$(BIN)/tunestudio make-tiny-model models/tiny-whisper --audio

# The speech demo: the tiny Whisper learns to transcribe voices it never heard (README, "Audio").
run-audio: $(STAMP) $(WEB_STAMP) $(WHISPER)
	$(BIN)/tunestudio train examples/audio.yaml

# The image demo: the tiny SmolVLM learns to name colours in new pictures (README, "Images").
run-vision: $(STAMP) $(WEB_STAMP) models/tiny-smolvlm/config.json $(SHAPES)
	$(BIN)/tunestudio train examples/vision.yaml

serve: $(STAMP) $(WEB_STAMP) $(LLAMA_CPP_STAMP) $(TINY)/config.json
	$(BIN)/tunestudio serve

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) $(WEB_STAMP) $(LLAMA_CPP_STAMP) $(LLAMA_CPP_BINDING) $(CHROMIUM) $(TINY)/config.json $(VLM) $(SHAPES) $(WHISPER)
	$(BIN)/ruff check .
	$(BIN)/pytest -n 2 --dist loadscope --no-loadscope-reorder --durations=15

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
	rm -rf $(VENV) $(TINY) models/tiny-smolvlm models/tiny-qwen2-vl models/tiny-whisper outputs $(WEB)/node_modules $(LLAMA_CPP) $(MTMD_SRC)
