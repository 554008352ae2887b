.PHONY: setup offline test bench demo
setup:
	pip install -r requirements.txt
offline:
	pip install --no-deps -r requirements-offline.txt
test:
	python -m pytest -q
demo:
	python launch.py --config configs/default.yaml
bench:
	python benchmarks/engine_bench.py
