.PHONY: setup offline test bench demo gpu-wheels
setup:
	pip install -r requirements.txt -c constraints.txt
offline:
	pip install --no-deps -r requirements-offline.txt
test:
	python -m pytest -q
demo:
	python launch.py --config configs/default.yaml
bench:
	python benchmarks/engine_bench.py
# the wheels a GPU machine without network needs (docs/gpu.md)
gpu-wheels:
	benchmarks/gpu_wheels.sh .gpu-wheels
