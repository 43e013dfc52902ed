# Sourced: llama.cpp's own C++ server, `llama-server`, built from the llama.cpp source that the
# pinned `llama-cpp-python` sdist vendors (a registry package), into .venv-bench/llama-server/
# (~15 minutes the first time on 2 cores). Sets LLAMA_SERVER and LLAMA_SERVER_VERSION; run it
# with LD_LIBRARY_PATH="$(dirname "$LLAMA_SERVER")".
# LLAMA_AVX2=1: a build for AVX2 only (no AVX-512), to set beside our kernels held to AVX2
# (EDGEPROMPT_AVX2=1) on an AVX-512 machine; kept in .venv-bench/llama-server-avx2/.
LLAMA_SERVER=.venv-bench/llama-server/llama-server
LLAMA_SERVER_VERSION="llama.cpp 0c1e570, vendored by llama-cpp-python 0.3.36"
simd_args=()
if [ -n "${LLAMA_AVX2:-}" ]; then
  LLAMA_SERVER=.venv-bench/llama-server-avx2/llama-server
  LLAMA_SERVER_VERSION="$LLAMA_SERVER_VERSION, built for AVX2 only"
  simd_args=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
fi
if [ ! -x "$LLAMA_SERVER" ]; then
  if ! command -v cmake >/dev/null; then
    apt-get update -qq && apt-get install -y -qq cmake >/dev/null
  fi
  src=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==0.3.36" -d "$src"
  tar xzf "$src"/llama_cpp_python-0.3.36.tar.gz -C "$src"
  llama="$src/llama_cpp_python-0.3.36/vendor/llama.cpp"
  # A VM may advertise AMX and fault on its tile loads: never use it.
  flags=""
  grep -q amx /proc/cpuinfo && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  echo "building llama-server from $llama (several minutes)..."
  cmake -S "$llama" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" "${simd_args[@]}" >/dev/null
  cmake --build "$src/build" --target llama-server -j2 >/dev/null
  mkdir -p "$(dirname "$LLAMA_SERVER")"
  cp "$src/build/bin/llama-server" "$LLAMA_SERVER"
  cp "$src"/build/bin/*.so* "$(dirname "$LLAMA_SERVER")"/ 2>/dev/null || true
  rm -rf "$src"
fi
