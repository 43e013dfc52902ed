# Sourced by the bench scripts: llama.cpp through the `llama-cpp-python` registry package (built
# from source with cmake, ~8 minutes the first time) in .venv-bench/. Never part of CI.
if ! command -v cmake >/dev/null; then
  apt-get update -qq && apt-get install -y -qq cmake >/dev/null
fi
if [ ! -x .venv-bench/bin/python ] || ! .venv-bench/bin/python -c "import llama_cpp" 2>/dev/null; then
  python3 -m venv .venv-bench
  echo "building llama-cpp-python (llama.cpp from source; several minutes)..."
  # A VM may advertise AMX and fault on its tile loads: never use it (as scripts/llama_server.sh).
  amx=""
  grep -q amx /proc/cpuinfo && amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CMAKE_ARGS="${CMAKE_ARGS:-} -DCMAKE_C_FLAGS='$amx' -DCMAKE_CXX_FLAGS='$amx'" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    .venv-bench/bin/pip install -q --no-cache-dir "llama-cpp-python==0.3.36"
fi
