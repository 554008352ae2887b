.PHONY: setup offline test bench demo gpu-wheels gpu-plan gpu-dry-run
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
# the planned GPU session (docs/gpu.md): its steps and budgets, and its CPU dry run (tiny shapes, seconds)
gpu-plan:
	python benchmarks/gpu_session.py --plan
gpu-dry-run:
	python benchmarks/gpu_session.py results/gpu-session-dry --dry-run
