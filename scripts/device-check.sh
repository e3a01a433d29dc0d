#!/usr/bin/env bash
# The ONE GPU check, run ON THE DEVICE MACHINE (H200) in a single `run` call (docs/gpu.md):
#   configure with the device's own torch (python3) and the carried Debian prefix (.device/prefix,
#   made here by scripts/device-prepare.sh), build only test_kernels + bench_quant4 (Release, sm_90),
#   run test_kernels (CUDA cases compare the kernels with the CPU reference; bitsandbytes fixtures from
#   .device/fixtures), then `bench_quant4 cuda`, a small probe that links every other third-party
#   package of the full build, and print a short table. Logs go to $OUT (or $BUILD/out).
#
#   bash scripts/device-check.sh            on the device (the `run` tool's command)
#   bash scripts/device-check.sh --dry-run  HERE, on the CPU: same configure (against the carried
#       prefix only: /usr is ignored for packages, and the compiler's dependency lists are checked for
#       any header taken from /usr/include), same build, test_kernels (CUDA cases skip), a short
#       `bench_quant4 cpu` and the probe; no CUDA run. Use QLORA_JOBS=1 on a shared machine.
#
# Environment: QLORA_JOBS (default nproc), QLORA_DEVICE_BUILD (default <repo>/build-device),
#   QLORA_TORCH_PYTHON (python with torch; default python3 if it imports torch, else the venv of
#   scripts/env.sh), QLORA_BENCH_REPS (default 20), QLORA_DEADLINE_S (stop starting steps after this
#   many seconds; default 450 on the device, none in a dry run), QLORA_ISOLATE (1: ignore /usr for
#   packages; default 1 in a dry run, 0 on the device), OUT (results folder),
#   QLORA_DEVICE_TRAIN (1: also the training phase below; default 1 on the device, 0 in a dry run),
#   QLORA_BIN (training phase: use this built `qlora` instead of building the target),
#   QLORA_TRAIN_MIN_S (a bench point starts only with this many seconds left; default 60).
#
# Training phase (issue 7, docs/gpu.md and docs/memory.md "GPU check"): builds the `qlora` target and
#   runs `qlora bench` (NF4 bs64 + double quant, LoRA r=16 all-linear, checkpointing on, 3 steps) on
#   the llama2-7b shape over seq 512/1024/2048/4096, one `--sweep` per micro-batch 1, 2, 4, plus one
#   llama2-13b point (seq 2048 × 1); points start only while QLORA_TRAIN_MIN_S seconds are left. The
#   estimate-vs-measured table (and the "7B QLoRA in 16 GB" verdict) goes into bench.txt; the CSV,
#   SVG charts, logs (and tests.xml, to stay within 8 files in $OUT) into train.tar.gz. The dry run
#   (with QLORA_DEVICE_TRAIN=1) runs the same phase with --preset tiny, 2 steps, short sequences.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: $0 [--dry-run]" >&2; exit 2 ;;
esac
T0=$(date +%s)
BUILD="${QLORA_DEVICE_BUILD:-$ROOT/build-device}"
RES="${OUT:-$BUILD/out}"
mkdir -p "$BUILD" "$RES"
JOBS="${QLORA_JOBS:-$(nproc)}"
REPS="${QLORA_BENCH_REPS:-20}"
ISOLATE="${QLORA_ISOLATE:-$DRY}"
if ((DRY)); then DEADLINE="${QLORA_DEADLINE_S:-0}"; else DEADLINE="${QLORA_DEADLINE_S:-450}"; fi
TRAIN="${QLORA_DEVICE_TRAIN:-$((1 - DRY))}"
TRAIN_MIN_S="${QLORA_TRAIN_MIN_S:-60}"
PREFIX="$ROOT/.device/prefix"
P="$PREFIX/usr"
LIBDIR="$P/lib/x86_64-linux-gnu"
SUMMARY="$RES/summary.txt"
: > "$SUMMARY"
declare -a ROWS=()
FAILED=0

say() { echo "[device-check] $*"; }
elapsed() { echo $(( $(date +%s) - T0 )); }
# step NAME LOG CMD...: runs CMD with the time left before the deadline, logs to $RES/LOG (appended),
# records a row; returns CMD's status (124: out of time).
step() {
  local name="$1" log="$RES/$2"; shift 2
  local t=$(date +%s) left=0 rc
  if ((DEADLINE > 0)); then
    left=$(( DEADLINE - ($(date +%s) - T0) ))
    if ((left < 10)); then ROWS+=("$(printf '%-22s %-8s %6s' "$name" "NOTIME" "-")"); FAILED=1; return 124; fi
  fi
  say "$name ($(elapsed)s so far)"
  echo "=== $name: $*" >> "$log"
  if ((left > 0)); then timeout --kill-after=10 "$left" "$@" >> "$log" 2>&1; rc=$?
  else "$@" >> "$log" 2>&1; rc=$?; fi
  local st=ok; ((rc == 0)) || { st="FAIL($rc)"; ((rc == 124)) && st=TIMEOUT; FAILED=1; }
  ROWS+=("$(printf '%-22s %-8s %5ss' "$name" "$st" $(( $(date +%s) - t )))")
  ((rc == 0)) || { say "$name: $st; last lines of ${log#"$ROOT"/}:"; tail -n 25 "$log"; }
  return $rc
}
finish() {
  {
    echo
    echo "== device-check $( ((DRY)) && echo '--dry-run ' )summary ($(elapsed)s, $(date -u +%FT%TZ)) =="
    printf '%s\n' "${ROWS[@]}"
    [ -f "$RES/bench.txt" ] && { echo; cat "$RES/bench.txt"; }
    echo
    ((FAILED)) && echo "RESULT: FAILED (logs: ${RES})" || echo "RESULT: ok (logs: ${RES})"
  } | tee -a "$SUMMARY"
  exit $FAILED
}

# ---- tools ----
[ -d "$P/include" ] || { say "missing $P: run scripts/device-prepare.sh here and carry .device/prefix"; exit 1; }
export PATH="/usr/local/cuda/bin:$PATH"
TPY="${QLORA_TORCH_PYTHON:-}"
if [ -z "$TPY" ]; then
  if python3 -c 'import torch' 2>/dev/null; then TPY="$(command -v python3)"
  else
    # shellcheck source=env.sh
    source "$ROOT/scripts/env.sh"; TPY="$QLORA_VENV/bin/python"
  fi
fi
TORCH_PREFIX="$("$TPY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" || { say "no torch in $TPY"; exit 1; }
# CMake and ninja: on PATH, else the pip packages of that python (the device image has both)
CMAKE="$(command -v cmake || true)"
[ -n "$CMAKE" ] || CMAKE="$("$TPY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null || true)"
[ -n "$CMAKE" ] && [ -x "$CMAKE" ] || { say "no cmake found (PATH or python -m cmake)"; exit 1; }
NINJA="$(command -v ninja || true)"
[ -n "$NINJA" ] || NINJA="$("$TPY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || true)"
if [ -n "$NINJA" ] && [ -x "$NINJA" ]; then GEN=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA")
elif command -v make >/dev/null; then GEN=(-G "Unix Makefiles")
else say "neither ninja nor make found"; exit 1; fi
NVCC="$(command -v nvcc || true)"
CUDA_OPT=(-DQLORA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
[ -n "$NVCC" ] && CUDA_OPT+=(-DCMAKE_CUDA_COMPILER="$NVCC")
if ((DRY)) && [ -z "$NVCC" ]; then CUDA_OPT=(-DQLORA_CUDA=OFF); say "no nvcc here: dry run builds without CUDA"; fi
((DRY)) || [ -n "$NVCC" ] || { say "no nvcc on the device"; exit 1; }

# pkg-config: the carried pkgconf, seeing only the carried .pc files (sysroot = the prefix), through a
# wrapper so its library path does not leak into other programs.
mkdir -p "$BUILD/tools"
cat > "$BUILD/tools/pkg-config" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export PKG_CONFIG_LIBDIR="$LIBDIR/pkgconfig:$P/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$PREFIX"
unset PKG_CONFIG_PATH
exec "$P/bin/pkgconf" "\$@"
EOF
chmod +x "$BUILD/tools/pkg-config"

{
  echo "mode: $( ((DRY)) && echo dry-run || echo device )   host: $(hostname)   $(uname -m)   cores: $(nproc)   jobs: $JOBS"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1
  echo "torch: $("$TPY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1)  ($TPY)"
  echo "cmake: $("$CMAKE" --version | head -1) ($CMAKE); generator: ${GEN[1]}"
  echo "nvcc: ${NVCC:-none} $([ -n "$NVCC" ] && "$NVCC" --version | tail -1)"
  echo "c++: $(c++ --version 2>&1 | head -1)"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "pkgconf (carried): $("$BUILD/tools/pkg-config" --version 2>&1); sentencepiece cflags: $("$BUILD/tools/pkg-config" --cflags sentencepiece 2>&1)"
  echo "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
} > "$RES/env.txt" 2>&1
cat "$RES/env.txt"

# ---- configure ----
ISO=()
if ((ISOLATE)); then
  # Find the Debian packages in the carried prefix only, as on the device: /usr (and its
  # lib/x86_64-linux-gnu/cmake, pkgconfig) is ignored as a package prefix. /usr/local/cuda and the
  # torch wheel are other prefixes and still found. Compilers are named so that ignoring /usr does not
  # hide them. Headers the compiler finds in /usr/include by itself are caught after the build.
  ISO=(-DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_IGNORE_PATH="/usr/lib/x86_64-linux-gnu/cmake;/usr/share/cmake;/usr/lib/cmake"
       -DCMAKE_C_COMPILER="$(command -v cc)" -DCMAKE_CXX_COMPILER="$(command -v c++)")
fi
# Torch's CUDA libraries (nvidia-* wheels) for the loader at test time too
export CUDA_MODULE_LOADING=LAZY
CONFIGURE=("$CMAKE" -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$P" -DOPENSSL_ROOT_DIR="$P"
  -DPKG_CONFIG_EXECUTABLE="$BUILD/tools/pkg-config"
  -DPython3_EXECUTABLE="$TPY" -DQLORA_PYTHON="$TPY"
  -DQLORA_BUILD_TESTS=ON -DQLORA_BUILD_BENCH=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5
  "${CUDA_OPT[@]}" "${ISO[@]}")
rm -f "$RES/configure.log" "$BUILD/CMakeCache.txt"   # fresh find results every run (objects are kept)
step configure configure.log "${CONFIGURE[@]}" || finish
# what CMake picked, for the log
grep -E '^(yaml-cpp_DIR|spdlog_DIR|fmt_DIR|nlohmann_json_DIR|CLI11_DIR|GTest_DIR|benchmark_DIR|OPENSSL_CRYPTO_LIBRARY|OPENSSL_INCLUDE_DIR|pkgcfg_lib_SENTENCEPIECE_sentencepiece|Torch_DIR|CMAKE_CUDA_COMPILER):' \
  "$BUILD/CMakeCache.txt" | sed 's/^/  /' | tee -a "$RES/configure.log"
bad_cache="$(grep -E '^(yaml-cpp_DIR|spdlog_DIR|fmt_DIR|nlohmann_json_DIR|CLI11_DIR|GTest_DIR|OPENSSL_CRYPTO_LIBRARY|OPENSSL_INCLUDE_DIR|pkgcfg_lib_SENTENCEPIECE_sentencepiece):[A-Z]*=' "$BUILD/CMakeCache.txt" | grep -v "=$PREFIX" || true)"
if [ -n "$bad_cache" ]; then
  say "packages found outside the carried prefix:"; echo "$bad_cache"
  ROWS+=("$(printf '%-22s %-8s' 'prefix-only configure' FAIL)"); FAILED=1
else
  ROWS+=("$(printf '%-22s %-8s' 'prefix-only configure' ok)")
fi

# ---- build (only the two targets) ----
rm -f "$RES/build.log"
step "build (-j$JOBS)" build.log "$CMAKE" --build "$BUILD" -j"$JOBS" --target test_kernels bench_quant4
built=$?
TK="$BUILD/tests/kernels/test_kernels"
BQ="$BUILD/bench/quant4/bench_quant4"

# headers from /usr/include for the carried packages mean the prefix is incomplete (dry run: the only
# place where /usr/include has them)
if ((built == 0)); then
  deps_from_usr() {
    if [ "${GEN[1]}" = Ninja ]; then "$NINJA" -C "$BUILD" -t deps
    else find "$BUILD" \( -name '*.d' -o -name compiler_depend.make \) -exec cat {} +; fi \
      | grep -oE '(^|[[:space:]])/usr/include/(x86_64-linux-gnu/)?(nlohmann|yaml-cpp|spdlog|fmt|CLI|openssl|gtest|gmock|benchmark|sentencepiece)[^ :]*' \
      | sort -u
  }
  leaked="$(deps_from_usr)"
  if [ -n "$leaked" ]; then
    say "headers taken from /usr/include, not the carried prefix:"; echo "$leaked" | head -20
    ROWS+=("$(printf '%-22s %-8s' 'prefix-only headers' FAIL)"); FAILED=1
  else
    ROWS+=("$(printf '%-22s %-8s' 'prefix-only headers' ok)")
  fi
  # shared libraries: each carried one must resolve into the prefix (RUNPATH), none missing
  libs="$(ldd "$TK" 2>&1)"
  echo "=== ldd test_kernels" >> "$RES/build.log"; echo "$libs" >> "$RES/build.log"
  if echo "$libs" | grep -q 'not found' || echo "$libs" | grep -E 'libspdlog|libfmt|libcrypto' | grep -vq "$PREFIX"; then
    say "test_kernels' libraries:"; echo "$libs" | grep -E 'not found|spdlog|fmt|crypto'
    ROWS+=("$(printf '%-22s %-8s' 'prefix-only libraries' FAIL)"); FAILED=1
  else
    ROWS+=("$(printf '%-22s %-8s' 'prefix-only libraries' ok)")
  fi
fi

# ---- fixtures ----
FIX="$BUILD/fixtures"
GFILTER="*"
if [ -f "$ROOT/.device/fixtures/quant.tar.gz" ]; then
  rm -rf "$FIX/quant"; mkdir -p "$FIX"
  tar -C "$FIX" -xzf "$ROOT/.device/fixtures/quant.tar.gz"
  want="$(sha256sum "$ROOT/tests/fixtures/make_quant_refs.py" | cut -c1-12)"
  [ "$(cat "$ROOT/.device/fixtures/hash")" = "$want" ] || say "WARNING: fixtures made by an older make_quant_refs.py (rerun device-prepare.sh here)"
else
  say "no .device/fixtures/quant.tar.gz: bitsandbytes parity tests (Quant4Bnb.*) left out"
  GFILTER="-Quant4Bnb.*"
fi
export QLORA_FIXTURES="$FIX"

# ---- tests and bench ----
if ((built == 0)); then
  rm -f "$RES/tests.log"
  step test_kernels tests.log "$TK" --gtest_filter="$GFILTER" --gtest_output=xml:"$RES/tests.xml"
  grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\]|tests? from .* ran' "$RES/tests.log" | sed 's/^/  /'
  cuda_case="$(grep -E '^\[ +(OK|FAILED|SKIPPED) +\] QuantTensor.CudaMatchesCpuReference' "$RES/tests.log" | head -1 | awk '{print $2}')"
  [ -n "$cuda_case" ] || cuda_case="$(grep -A2 'RUN .*QuantTensor.CudaMatchesCpuReference' "$RES/tests.log" | grep -oE 'OK|FAILED|SKIPPED' | head -1)"
  if ((DRY)); then
    ROWS+=("$(printf '%-22s %-8s' 'CUDA vs CPU reference' "${cuda_case:-?}") (dry run: SKIPPED expected)")
  else
    [ "$cuda_case" = OK ] || FAILED=1
    ROWS+=("$(printf '%-22s %-8s' 'CUDA vs CPU reference' "${cuda_case:-missing}")")
  fi
  rm -f "$RES/bench.txt"
  if ((DRY)); then
    step "bench_quant4 cpu 2" bench.txt "$BQ" cpu 2
  else
    step "bench_quant4 cuda $REPS" bench.txt "$BQ" cuda "$REPS"
    grep -q 'no CUDA device visible\|built without CUDA' "$RES/bench.txt" && { FAILED=1; ROWS+=("bench_quant4 cuda       did not run on a GPU"); }
    step "bench_quant4 cpu 5" bench.txt "$BQ" cpu 5
  fi
fi

# ---- probe: every other package of the full build links and loads from the prefix ----
PROBE="$BUILD/probe"
mkdir -p "$PROBE/src"
cat > "$PROBE/src/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(qlora_device_probe LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
find_package(Threads REQUIRED)
add_executable(probe probe.cpp)
target_link_libraries(probe PRIVATE nlohmann_json::nlohmann_json yaml-cpp spdlog::spdlog CLI11::CLI11
  OpenSSL::Crypto PkgConfig::SENTENCEPIECE GTest::gtest benchmark::benchmark Threads::Threads)
EOF
cat > "$PROBE/src/probe.cpp" <<'EOF'
// Links one symbol of each third-party library of the full qlora-cpp build and calls it.
#include <benchmark/benchmark.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sentencepiece_processor.h>
#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
TEST(Probe, Runs) { EXPECT_EQ(1, 1); }
int main(int argc, char** argv) {
  CLI::App app{"probe"};
  CLI11_PARSE(app, argc, argv);
  const auto j = nlohmann::json::parse(R"({"a": 1})");
  const auto y = YAML::Load("b: 2");
  unsigned char md[EVP_MAX_MD_SIZE]; unsigned int len = 0;
  EVP_Digest("abc", 3, md, &len, EVP_sha256(), nullptr);
  sentencepiece::SentencePieceProcessor sp;
  const bool sp_fails_without_model = !sp.Load("/nonexistent.model").ok();
  benchmark::Initialize(&argc, argv);
  int gargc = 1; ::testing::InitGoogleTest(&gargc, argv);
  const int t = RUN_ALL_TESTS();
  spdlog::info("probe: json {} yaml {} sha256[0] {:02x} len {} sentencepiece {} gtest {}", j["a"].get<int>(),
               y["b"].as<int>(), md[0], len, sp_fails_without_model ? "ok" : "?", t);
  return (j["a"] == 1 && y["b"].as<int>() == 2 && len == 32 && md[0] == 0xba && sp_fails_without_model && t == 0) ? 0 : 1;
}
EOF
rm -f "$RES/probe.log" "$PROBE/build/CMakeCache.txt"
step "probe configure" probe.log "$CMAKE" -S "$PROBE/src" -B "$PROBE/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$P" -DOPENSSL_ROOT_DIR="$P" -DPKG_CONFIG_EXECUTABLE="$BUILD/tools/pkg-config" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${ISO[@]}" \
  && step "probe build" probe.log "$CMAKE" --build "$PROBE/build" -j"$JOBS" \
  && step "probe run" probe.log "$PROBE/build/probe" \
  && { ldd "$PROBE/build/probe" > "$BUILD/probe-ldd.txt" 2>&1; cat "$BUILD/probe-ldd.txt" >> "$RES/probe.log"
       ! grep -q "not found" "$BUILD/probe-ldd.txt" || { say "unresolved libraries:"; grep "not found" "$BUILD/probe-ldd.txt"; FAILED=1; }; }
if ((ISOLATE)) && [ -d "$PROBE/build" ]; then
  if [ "${GEN[1]}" = Ninja ]; then pd="$("$NINJA" -C "$PROBE/build" -t deps 2>/dev/null)"
  else pd="$(find "$PROBE/build" \( -name '*.d' -o -name compiler_depend.make \) -exec cat {} +)"; fi
  leaked="$(echo "$pd" | grep -oE '(^|[[:space:]])/usr/include/(x86_64-linux-gnu/)?(nlohmann|yaml-cpp|spdlog|fmt|CLI|openssl|gtest|gmock|benchmark|sentencepiece)[^ :]*' | tr -d '[:blank:]' | sort -u)"
  if [ -n "$leaked" ]; then
    say "probe took headers from /usr/include:"; echo "$leaked" | head; FAILED=1
    ROWS+=("$(printf '%-22s %-8s' 'probe prefix headers' FAIL)")
  else
    ROWS+=("$(printf '%-22s %-8s' 'probe prefix headers' ok)")
  fi
fi

# ---- training phase (issue 7): qlora bench, measured peak vs estimate ----
if ((TRAIN)); then
  TR="$RES/train"; rm -rf "$TR"; mkdir -p "$TR"
  Q="${QLORA_BIN:-$BUILD/trainer/qlora}"
  trc=0
  if [ -z "${QLORA_BIN:-}" ]; then
    step "build qlora" train/build.log "$CMAKE" --build "$BUILD" -j"$JOBS" --target qlora; trc=$?
  fi
  if ((trc == 0)) && [ -x "$Q" ]; then
    if ((DRY)); then P7=tiny; P13=tiny; SEQS=(32 64 128 256); STEPS=2; P13_SEQ=128
    else P7=llama2-7b; P13=llama2-13b; SEQS=(512 1024 2048 4096); STEPS=3; P13_SEQ=2048; fi
    CTX_MIB=768   # CUDA context + allocator slack beyond reserved: kCudaOverheadBytes unless measured below
    SMI=0; ((DRY)) || ! command -v nvidia-smi >/dev/null || SMI=1
    # bench_point NAME LOG ARGS...: starts only with TRAIN_MIN_S seconds left; samples nvidia-smi
    # memory.used (MiB) every 200 ms into $TR/LOG.smi while it runs.
    bench_point() {
      local name="$1" log="$2"; shift 2
      if ((DEADLINE > 0)) && (( DEADLINE - ($(date +%s) - T0) < TRAIN_MIN_S )); then
        ROWS+=("$(printf '%-22s %-8s %6s' "$name" "SKIPPED" "-") (under ${TRAIN_MIN_S}s left)"); return 124
      fi
      local smi_pid=""
      if ((SMI)); then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$TR/$log.smi" 2>/dev/null &
        smi_pid=$!
      fi
      step "$name" "train/$log" "$Q" "$@"; local rc=$?
      [ -n "$smi_pid" ] && { kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; }
      return $rc
    }
    COMMON=(--lora-r 16 --steps "$STEPS")
    # micro-batch 1 first (the 16 GB verdict), then the 13B point, then micro-batch 2 and 4
    bench_point "bench $P7 mb1" bench-7b-mb1.log bench --preset "$P7" --sweep --seq-lens "${SEQS[@]}" \
      --batch-sizes 1 "${COMMON[@]}" --out "$TR/bench-7b-mb1"
    bench_point "bench $P13 ${P13_SEQ}x1" bench-13b.log bench --preset "$P13" --seq-len "$P13_SEQ" \
      --micro-batch-size 1 "${COMMON[@]}"
    for mb in 2 4; do
      bench_point "bench $P7 mb$mb" "bench-7b-mb$mb.log" bench --preset "$P7" --sweep --seq-lens "${SEQS[@]}" \
        --batch-sizes "$mb" "${COMMON[@]}" --out "$TR/bench-7b-mb$mb"
    done
    # CUDA overhead: max nvidia-smi memory.used − peak reserved of the same run (mb1 sweep)
    if ((SMI)) && [ -s "$TR/bench-7b-mb1.log.smi" ] && [ -s "$TR/bench-7b-mb1.csv" ]; then
      used_mib="$(sort -n "$TR/bench-7b-mb1.log.smi" | tail -1)"
      res_mib="$(awk -F, 'NR>1 && $9>m {m=$9} END {printf "%d", m/1048576}' "$TR/bench-7b-mb1.csv")"
      if [ -n "$used_mib" ] && ((res_mib > 0)); then CTX_MIB=$((used_mib - res_mib)); CTX_SRC="measured: nvidia-smi max ${used_mib} MiB − peak reserved ${res_mib} MiB"; fi
    fi
    # one CSV for the 7B grid, then the table
    first=1
    for mb in 1 2 4; do
      f="$TR/bench-7b-mb$mb.csv"; [ -f "$f" ] || continue
      if ((first)); then cat "$f"; first=0; else tail -n +2 "$f"; fi
    done > "$TR/bench-7b.csv"
    {
      echo
      echo "== training phase: qlora bench $P7 (NF4 bs64 dq, r=16 all-linear, checkpointing on, $STEPS steps), $(date -u +%F), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?') =="
      echo "CUDA context + allocator slack beyond reserved: ${CTX_MIB} MiB (${CTX_SRC:-placeholder kCudaOverheadBytes; not measured})"
      awk -F, -v ctx="$CTX_MIB" '
        function gib(b) { return sprintf("%.2f", b / 1073741824) }
        NR == 1 { printf "%6s %5s %10s %10s %10s %9s %9s %8s %7s  %s\n", "seq", "batch", "alloc GiB", "reserv GiB",
                  "est GiB", "err/res", "err/alloc", "tok/s", "MFU", "fits 16 GB (reserved + ctx <= 16376 MiB)"; next }
        {
          if ($3 != "true") { printf "%6d %5d  does not fit (out of memory); estimated %s GiB\n", $1, $2, gib($10); next }
          res = $9 > 0 ? $9 : $8   # CPU: no reserved, use peak RSS growth
          er = res > 0 ? sprintf("%+.1f%%", 100 * ($10 - res) / res) : "-"
          ea = $8 > 0 ? sprintf("%+.1f%%", 100 * ($10 - $8) / $8) : "-"
          fit = (res / 1048576 + ctx <= 16376) ? "yes" : "no"
          if (fit == "yes" && $2 == 1 && $1 > maxfit) maxfit = $1
          printf "%6d %5d %10s %10s %10s %9s %9s %8.0f %6.1f%%  %s\n", $1, $2, gib($8), gib($9), gib($10), er, ea, $5,
                 100 * $6, fit
        }
        END { printf "largest seq that fits 16 GB at micro-batch 1 (measured): %s\n", maxfit ? maxfit : "none of the grid" }
      ' "$TR/bench-7b.csv"
      echo "$P13 point:"; grep -E '^ +[0-9]+ +[0-9]+ ' "$TR/bench-13b.log" 2>/dev/null || echo "  (not run or failed)"
    } >> "$RES/bench.txt"
    [ -f "$RES/tests.xml" ] && mv "$RES/tests.xml" "$TR/"
  else
    ((trc == 0)) && { say "no qlora binary at $Q"; ROWS+=("$(printf '%-22s %-8s' 'qlora binary' MISSING)"); FAILED=1; }
  fi
  tar -C "$RES" -czf "$RES/train.tar.gz" train && rm -rf "$TR"
fi

finish
