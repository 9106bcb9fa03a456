#!/usr/bin/env bash
# Installs what the tests need into the active Python environment (a venv, or the system's), builds
# mambaradix in place, and runs the test suite: the README's test command, and the one CI runs.
# Only GPU tests skip on a machine without one; every skip says why (-rs).  Arguments go to pytest.
#
#   SGLang 0.5.15   installed with --no-deps: the oracle of the v0.5.15 drop-in's tests
#   SGLang 0.5.23   installed with --no-deps into .sgl0523/ (so it does not replace 0.5.15): the
#                   TreeCore tests run it in a subprocess (tests/dropin/test_sglang_unified.py)
# The long randomized runs (marked slow) run too (MAMBARADIX_SLOW=1; MAMBARADIX_SLOW= leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
py=python
command -v "$py" >/dev/null 2>&1 || py=python3

"$py" -m pip install -q -e . -r tests/requirements.txt
"$py" -m pip install -q --no-deps "sglang==0.5.15"
# SGLang 0.5.23 and only what its cache and scheduler modules import; triton, sgl_kernel and torchvision get
# stand-ins (mambaradix/sglang_replay/env.py, which tests/dropin/sglang_0523/sgl_env.py calls).  Reinstalled
# when this list changes.
sgl0523=("sglang==0.5.23" msgspec psutil pybase64 tqdm starlette anyio sniffio aiohttp multidict yarl propcache
    aiohappyeyeballs aiosignal frozenlist apache-tvm-ffi transformers huggingface-hub httpx2 httpcore2
    truststore h11 "safetensors>=0.8.0" tokenizers regex dill sentencepiece compressed-tensors loguru gguf
    openai partial-json-parser datasets multiprocess pandas pyarrow xxhash setproctitle einops uvicorn fastapi
    annotated-doc typing_extensions opentelemetry-api click)
if [ "$(cat .sgl0523/.installed 2>/dev/null)" != "${sgl0523[*]}" ]; then
    rm -rf .sgl0523
    "$py" -m pip install -q --no-deps --target .sgl0523 "${sgl0523[@]}"
    echo "${sgl0523[*]}" > .sgl0523/.installed
fi
export MAMBARADIX_SLOW="${MAMBARADIX_SLOW-1}"
exec "$py" -m pytest "$@"
