#!/usr/bin/env bash
# The ONE GPU check (issue 15; docs/gpu.md), run ON THE DEVICE MACHINE (H200) in a single `run` call.
# Steps, in order of value; each starts only while enough time is left before the deadline
# (QLORA_DEADLINE_S, default 420 s), is killed at the deadline, and writes its results as it ends
# (scripts/device-lib.sh):
#   host-compiler      nvcc 13.0 compiles a kernel with the default g++, else a g++-N it accepts is
#                      passed as CMAKE_CUDA_HOST_COMPILER, else stop now with the reason
#   configure          device torch (python3), carried Debian prefix (.device/prefix), Release, sm_90
#   build              ONE build of the needed targets: test_kernels bench_quant4 test_gpu qlora, -j nproc,
#                      keep going past a failed target (ninja -k 0) so the others still run
#   kernel-tests       test_kernels under CUDA_LAUNCH_BLOCKING=1; every CUDA case must report OK
#   dequant-bandwidth  bench_quant4 cuda: NF4 dequantize vs D2D memcpy bandwidth per 7B weight shape
#   cuda-parity        test_gpu --gtest_filter='Cuda*:-CudaNccl*': CUDA fp32 / bf16 training vs the
#                      CPU path, resume exactness on CUDA; every case must report OK
#   nccl-smoke         test_gpu --gtest_filter='CudaNccl*': `qlora train` of the tiny run on cuda:0 with
#                      QLORA_DIST_FORCE_PG=1 (ProcessGroupNCCL at world size 1) byte-identical to the
#                      run without a process group; must report OK
#   bench-7b           ONE `qlora bench` process, llama2-7b, seq 512..8192 × micro-batch 1, 2, 4
#                      (micro-batch 1 first; rows written as they finish), --max-time-s leaving
#                      QLORA_RESERVE_S (100) for the next steps; nvidia-smi sampled every 200 ms
#   baseline-peft      bench/train/peft_baseline_cuda.py: transformers + PEFT LoRA bf16, 7B, seq 2048 × 1
#   bench-13b          `qlora bench` llama2-13b seq 2048 × 1
#   bench-8b           `qlora bench` llama3-8b seq 2048 / 8192 × micro-batch 1 / 2
#   report             scripts/device-report.py: the tables for docs/memory.md and docs/performance.md
# Results: $OUT/{summary.txt, steps.tsv, env.txt, report.md, report.json, results.tar.gz} (6 files;
# the tool returns 8 at most). results.tar.gz (every log, CSV, SVG, XML, nvidia-smi sample) is
# refreshed every 15 s while steps run and after each step, so a call killed by its timeout still
# returns what had finished. Here: scripts/device-append-docs.py appends the report to the docs.
#
#   bash scripts/device-check.sh            on the device (the `run` tool's command)
#   bash scripts/device-check.sh --dry-run  HERE, on the CPU: the same configure (against the carried
#       prefix only; /usr is ignored for packages and the compiler's dependency lists are checked),
#       the same build, test_kernels (CUDA cases must SKIP here), `bench_quant4 cpu`, a probe that
#       links every other package, and the report; with QLORA_DEVICE_TRAIN=1 also test_gpu's CPU
#       cases, nccl-smoke (must SKIP here), a tiny `qlora bench` sweep and the PEFT baseline on the CPU.
#   bash scripts/device-check.sh --fake     the device's step plan with fake steps (no tools): tests
#       the order, the deadline and the partial results (tests/gpu/device_steps_test.sh).
#
# Environment: QLORA_JOBS (default nproc), QLORA_DEVICE_BUILD (<repo>/build-device),
#   QLORA_TORCH_PYTHON (python with torch; default python3 if it imports torch, else the venv),
#   QLORA_DEADLINE_S (420 on the device, none in a dry run), QLORA_RESERVE_S (100), QLORA_BENCH_REPS (20),
#   QLORA_STEPS (comma-separated globs: run only these steps, e.g. for a rerun "bench-*,report"),
#   QLORA_ISOLATE (1: ignore /usr for packages; default 1 in a dry run), QLORA_DEVICE_TRAIN (dry run:
#   1 = also the training steps on the CPU), QLORA_DEVICE_TARGETS (override the build's targets), OUT.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE=device
case "${1:-}" in
  --dry-run) MODE=dry ;;
  --fake) MODE=fake ;;
  "") ;;
  *) echo "usage: $0 [--dry-run | --fake]" >&2; exit 2 ;;
esac
# shellcheck source=device-lib.sh
source "$ROOT/scripts/device-lib.sh"
DRY=0; [ "$MODE" = dry ] && DRY=1
BUILD="${QLORA_DEVICE_BUILD:-$ROOT/build-device}"
RESDIR="${OUT:-$BUILD/out}"        # what comes back: 6 files
RUN="$BUILD/run"                   # every log and result, packed into $RESDIR/results.tar.gz
case "$MODE" in
  device) DEADLINE="${QLORA_DEADLINE_S:-420}" ;;
  dry) DEADLINE="${QLORA_DEADLINE_S:-0}" ;;
  fake) DEADLINE="${QLORA_DEADLINE_S:-20}" ;;
esac
JOBS="${QLORA_JOBS:-$(nproc)}"
REPS="${QLORA_BENCH_REPS:-20}"
RESERVE="${QLORA_RESERVE_S:-100}"
TRAIN=1; ((DRY)) && TRAIN="${QLORA_DEVICE_TRAIN:-0}"
ISOLATE="${QLORA_ISOLATE:-$DRY}"
rm -rf "$RUN"; mkdir -p "$RUN" "$RESDIR"
rm -f "$RESDIR"/{summary.txt,steps.tsv,env.txt,report.md,report.json,results.tar.gz}
ds_init "$RUN" "$DEADLINE"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo '+dirty')"
echo "mode=$MODE commit=$COMMIT deadline=${DEADLINE}s started=$(date -u +%FT%TZ)" > "$RUN/meta.txt"
say() { echo "[device-check] $*"; }

# results.tar.gz: refreshed by a background loop while steps run, and after each step
# (a temp file per process: the loop and a step's end may pack at once; tar's exit 1, "file changed as
# we read it" while a step writes its log, still leaves a valid archive).
snapshot() {
  local tmp="$RESDIR/.results.$BASHPID.tmp" rc
  tar -C "$RUN" -czf "$tmp" --warning=no-file-changed . 2>/dev/null; rc=$?
  if ((rc <= 1)); then mv -f "$tmp" "$RESDIR/results.tar.gz"; else rm -f "$tmp"; fi
  cp -f "$RUN/steps.tsv" "$RESDIR/steps.tsv" 2>/dev/null
}
( trap 'kill $c 2>/dev/null; rm -f "$RESDIR/.results.$BASHPID.tmp"; exit 0' TERM; while :; do sleep 15 & c=$!; wait $c; snapshot; done ) &
SNAP_PID=$!
finish() {
  kill "$SNAP_PID" 2>/dev/null; wait "$SNAP_PID" 2>/dev/null
  snapshot
  {
    echo
    echo "== device-check ($MODE) summary: $(( $(date +%s) - DS_T0 ))s, $(date -u +%FT%TZ), commit $COMMIT =="
    awk -F'\t' '{ printf "%-24s %-9s %5ss  %s\n", $1, $2, $3, $4 }' "$RUN/steps.tsv"
    [ -f "$RESDIR/report.md" ] && { echo; cat "$RESDIR/report.md"; }
    echo
    if ds_failed; then echo "RESULT: ok (results: $RESDIR)"; else echo "RESULT: FAILED (results: $RESDIR)"; fi
  } | tee "$RESDIR/summary.txt"
  ds_failed; exit $?
}
after() { snapshot; }  # partial results after every step
# ml SECONDS: a step's minimum time left to start, scaled by QLORA_MIN_LEFT_PCT (tests use small deadlines)
ml() { echo $(( $1 * ${QLORA_MIN_LEFT_PCT:-100} / 100 )); }
# The device's plan, in order of value (issue 15): kernels → CUDA training parity → the NCCL smoke
# (issue 14) → 7B (micro-batch 1 first) → the PEFT baseline → the rest; the report always runs (at most 30 s, even past the deadline).
# Minimum seconds left to start each step: ml N. Used by the device run and by --fake.
device_plan() {
  step host-compiler 0 env.txt s_host_compiler || finish
  step configure 0 configure.log s_configure || finish
  step build 0 build.log s_build
  step kernel-tests "$(ml 20)" tests.log s_kernel_tests
  step dequant-bandwidth "$(ml 15)" bench.txt s_dequant_bandwidth
  step cuda-parity "$(ml 45)" parity.log s_cuda_parity
  step nccl-smoke "$(ml 30)" nccl.log s_nccl_smoke
  step bench-7b "$(ml 60)" bench-7b.log s_bench_7b
  step baseline-peft "$(ml 60)" baseline.log s_baseline_peft
  step bench-13b "$(ml 45)" bench-13b.log s_bench_13b
  step bench-8b "$(ml 45)" bench-8b.log s_bench_8b
  step report -30 report.log s_report
}
step() { ds_run "$@"; local rc=$?; after; return $rc; }

# require_cases LOG WANT PATTERN: every GoogleTest case in LOG whose name matches the extended regex
# PATTERN reported WANT (OK on the device, SKIPPED in a dry run); at least one such case ran.
require_cases() {
  local log="$1" want="$2" pat="$3" got bad
  got="$(grep -E "^\[ +(OK|FAILED|SKIPPED) +\] ($pat)" "$log" | sed -E 's/^\[ *([A-Z]+) *\] ([^ ]+).*/\1 \2/' | sort -u)"
  [ -n "$got" ] || { echo "no test case matching /$pat/ reported"; return 1; }
  echo "$got" | sed 's/^/  /'
  bad="$(echo "$got" | awk -v w="$want" '$1 != w')"
  [ -z "$bad" ] || { echo "expected every /$pat/ case to report $want, got:"; echo "$bad"; return 1; }
}

# with_smi TAG CMD...: samples nvidia-smi "timestamp, memory.used (MiB)" every 200 ms into $RUN/TAG.smi while CMD runs
with_smi() {
  local tag="$1"; shift
  local pid="" rc
  if [ "$MODE" = device ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 200 > "$RUN/$tag.smi" 2>/dev/null &
    pid=$!
  fi
  "$@"; rc=$?
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; }
  return $rc
}

# =============================== fake steps (tests/gpu/device_steps_test.sh) ===============================
if [ "$MODE" = fake ]; then
  # QLORA_FAKE_<STEP> (STEP upper case, '-' as '_'): "fail", "sleep N", or empty for a quick ok.
  # bench-7b writes one CSV row per 0.2 s of its sleep, as `qlora bench` writes rows as they finish.
  fake() {
    local var="QLORA_FAKE_$(echo "$1" | tr 'a-z-' 'A-Z_')"; local what="${!var:-}"
    echo "fake $1: ${what:-ok}"
    case "$what" in
      fail) return 3 ;;
      sleep\ *)
        if [ "$1" = bench-7b ]; then
          echo "seq_len,micro_batch_size,fits,step_s,tokens_per_s,mfu,hfu,measured_peak_bytes,measured_reserved_bytes,estimated_bytes,relative_error,cost_per_million_tokens,estimated_allocated_bytes,start_unix_s,end_unix_s" > "$RUN/bench-7b.csv"
          local n=$(( ${what#sleep } * 5 )) i seq=512
          for ((i = 0; i < n; i++)); do
            echo "$seq,1,true,0.5,$((seq * 2)),0.3,0.4,$((4000 + seq))000000,$((4200 + seq))000000,$((4100 + seq))000000,0.02,0,$((4050 + seq))000000,$(date +%s),$(date +%s)" >> "$RUN/bench-7b.csv"
            seq=$((seq * 2)); sleep 0.2
          done
        else
          sleep "${what#sleep }"
        fi ;;
    esac
    return 0
  }
  for s in host-compiler configure build kernel-tests dequant-bandwidth cuda-parity nccl-smoke bench-7b baseline-peft bench-13b bench-8b; do
    eval "s_${s//-/_}() { fake $s; }"
  done
  s_report() { python3 "$ROOT/scripts/device-report.py" --run "$RUN" --out "$RESDIR" --mode fake; }
  device_plan
  finish
fi

# =============================== tools ===============================
PREFIX="$ROOT/.device/prefix"
P="$PREFIX/usr"
LIBDIR="$P/lib/x86_64-linux-gnu"
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
CMAKE="$(command -v cmake || true)"
[ -n "$CMAKE" ] || CMAKE="$("$TPY" -c 'import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))' 2>/dev/null || true)"
[ -n "$CMAKE" ] && [ -x "$CMAKE" ] || { say "no cmake found (PATH or python -m cmake)"; exit 1; }
NINJA="$(command -v ninja || true)"
[ -n "$NINJA" ] || NINJA="$("$TPY" -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null || true)"
if [ -n "$NINJA" ] && [ -x "$NINJA" ]; then GEN=(-G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA"); KEEP_GOING=(-- -k 0)
elif command -v make >/dev/null; then GEN=(-G "Unix Makefiles"); KEEP_GOING=(-- -k)
else say "neither ninja nor make found"; exit 1; fi
NVCC="$(command -v nvcc || true)"
CUDA_OPT=(-DQLORA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
[ -n "$NVCC" ] && CUDA_OPT+=(-DCMAKE_CUDA_COMPILER="$NVCC")
if ((DRY)) && [ -z "$NVCC" ]; then CUDA_OPT=(-DQLORA_CUDA=OFF); say "no nvcc here: dry run builds without CUDA"; fi
((DRY)) || [ -n "$NVCC" ] || { say "no nvcc on the device"; exit 1; }
if [ -n "${QLORA_DEVICE_TARGETS:-}" ]; then read -r -a TARGETS <<< "$QLORA_DEVICE_TARGETS"
elif ((DRY)) && ((TRAIN == 0)); then TARGETS=(test_kernels bench_quant4)
else TARGETS=(test_kernels bench_quant4 test_gpu qlora); fi
TK="$BUILD/tests/kernels/test_kernels"
BQ="$BUILD/bench/quant4/bench_quant4"
TG="$BUILD/tests/gpu/test_gpu"
Q="$BUILD/cli/qlora"

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
  echo "mode: $MODE   host: $(hostname)   $(uname -m)   cores: $(nproc)   jobs: $JOBS   commit: $COMMIT"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1
  echo "torch: $("$TPY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1)  ($TPY)"
  echo "transformers/peft: $("$TPY" -c 'import transformers, peft; print(transformers.__version__, peft.__version__)' 2>&1 | tail -1)"
  echo "cmake: $("$CMAKE" --version | head -1) ($CMAKE); generator: ${GEN[1]}"
  echo "nvcc: ${NVCC:-none} $([ -n "$NVCC" ] && "$NVCC" --version | tail -1)"
  echo "c++: $(c++ --version 2>&1 | head -1); g++ candidates: $(compgen -c g++- | grep -E '^g\+\+-[0-9]+$' | sort -u | tr '\n' ' ')"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "pkgconf (carried): $("$BUILD/tools/pkg-config" --version 2>&1); sentencepiece cflags: $("$BUILD/tools/pkg-config" --cflags sentencepiece 2>&1)"
  echo "os: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}")"
} > "$RUN/env.txt" 2>&1
cp "$RUN/env.txt" "$RESDIR/env.txt"
cat "$RUN/env.txt"

# =============================== steps ===============================
CUDA_HOST=()
s_host_compiler() {
  [ -n "$NVCC" ] || { echo "no nvcc: nothing to check"; return 0; }
  local h
  h="$(ds_pick_cuda_host "$NVCC")" || return 1
  if [ -n "$h" ]; then echo "nvcc refuses the default g++; using $h"; echo "$h" > "$RUN/cuda-host"
  else echo "nvcc accepts the default host compiler ($(g++ --version 2>/dev/null | head -1))"; fi
}

ISO=()
if ((ISOLATE)); then
  # Find the Debian packages in the carried prefix only, as on the device: /usr (and its
  # lib/x86_64-linux-gnu/cmake, pkgconfig) is ignored as a package prefix. /usr/local/cuda and the
  # torch wheel are other prefixes and still found. Compilers are named so that ignoring /usr does not
  # hide them. Headers the compiler finds in /usr/include by itself are caught after the build.
  ISO=(-DCMAKE_IGNORE_PREFIX_PATH=/usr -DCMAKE_IGNORE_PATH="/usr/lib/x86_64-linux-gnu/cmake;/usr/share/cmake;/usr/lib/cmake"
       -DCMAKE_C_COMPILER="$(command -v cc)" -DCMAKE_CXX_COMPILER="$(command -v c++)")
fi
export CUDA_MODULE_LOADING=LAZY
# here (dry run) the shared machine's compiler cache, if any; the device has none and builds once
LAUNCHER=()
if ((DRY)) && command -v ccache >/dev/null; then
  # shellcheck source=env.sh
  source "$ROOT/scripts/env.sh"
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
s_configure() {
  [ -s "$RUN/cuda-host" ] && CUDA_HOST=(-DCMAKE_CUDA_HOST_COMPILER="$(cat "$RUN/cuda-host")")
  rm -f "$BUILD/CMakeCache.txt"   # fresh find results every run (objects are kept)
  # QLORA_PCH=OFF: on 16 cores the precompiled torch header (about a minute, built before any of
  # its users) would sit on the build's critical path; it pays off on 2 cores, not there.
  "$CMAKE" -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$P" -DOPENSSL_ROOT_DIR="$P" \
    -DPKG_CONFIG_EXECUTABLE="$BUILD/tools/pkg-config" \
    -DPython3_EXECUTABLE="$TPY" -DQLORA_PYTHON="$TPY" \
    -DQLORA_BUILD_TESTS=ON -DQLORA_BUILD_BENCH=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    -DQLORA_PCH=OFF \
    "${CUDA_OPT[@]}" "${CUDA_HOST[@]}" "${ISO[@]}" "${LAUNCHER[@]}" || return $?
  # what CMake picked, and that every carried package came from the prefix
  grep -E '^(yaml-cpp_DIR|spdlog_DIR|fmt_DIR|nlohmann_json_DIR|CLI11_DIR|GTest_DIR|benchmark_DIR|OPENSSL_CRYPTO_LIBRARY|OPENSSL_INCLUDE_DIR|pkgcfg_lib_SENTENCEPIECE_sentencepiece|QLORA_GLOO_INCLUDE_DIR|Torch_DIR|CMAKE_CUDA_COMPILER|CMAKE_CUDA_HOST_COMPILER):' \
    "$BUILD/CMakeCache.txt" | sed 's/^/  /'
  local nccl bad  # (captured first: this step's output is appended to configure.log itself)
  nccl="$(grep -E '^-- qlora-cpp: NCCL backend' "$RUN/configure.log")"; echo "  ${nccl#-- }"
  bad="$(grep -E '^(yaml-cpp_DIR|spdlog_DIR|fmt_DIR|nlohmann_json_DIR|CLI11_DIR|GTest_DIR|OPENSSL_CRYPTO_LIBRARY|OPENSSL_INCLUDE_DIR|pkgcfg_lib_SENTENCEPIECE_sentencepiece|QLORA_GLOO_INCLUDE_DIR):[A-Z]*=' "$BUILD/CMakeCache.txt" | grep -v "=$PREFIX" || true)"
  [ -z "$bad" ] || { echo "packages found outside the carried prefix:"; echo "$bad"; return 1; }
}

s_build() {
  "$CMAKE" --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" "${KEEP_GOING[@]}"
}

# (dry run) headers of the carried packages from /usr/include, or libraries outside the prefix, mean
# the prefix is incomplete; on the device /usr/include has none of them.
s_prefix_check() {
  local deps leaked libs
  if [ "${GEN[1]}" = Ninja ]; then deps="$("$NINJA" -C "$BUILD" -t deps)"
  else deps="$(find "$BUILD" \( -name '*.d' -o -name compiler_depend.make \) -exec cat {} +)"; fi
  leaked="$(echo "$deps" | grep -oE '(^|[[:space:]])/usr/include/(x86_64-linux-gnu/)?(nlohmann|yaml-cpp|spdlog|fmt|CLI|openssl|gtest|gmock|benchmark|sentencepiece|pcre2|utf8proc|yaml\.h)[^ :]*' | sort -u)"
  [ -z "$leaked" ] || { echo "headers taken from /usr/include, not the carried prefix:"; echo "$leaked" | head -20; return 1; }
  libs="$(ldd "$TK" 2>&1)"; echo "$libs"
  if echo "$libs" | grep -q 'not found' || echo "$libs" | grep -E 'libspdlog|libfmt|libcrypto' | grep -vq "$PREFIX"; then
    echo "test_kernels' libraries outside the prefix or missing"; return 1
  fi
}

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
# GGUF dequantization references (GgufDequant.BitIdenticalToGgufPyForEveryType); without them that case
# fails (a missing fixture is never a skip)
if [ -f "$ROOT/.device/fixtures/gguf.tar.gz" ]; then
  rm -rf "$FIX/gguf"; mkdir -p "$FIX"
  tar -C "$FIX" -xzf "$ROOT/.device/fixtures/gguf.tar.gz"
  want="$(sha256sum "$ROOT/tests/fixtures/make_gguf_refs.py" | cut -c1-12)"
  [ "$(cat "$ROOT/.device/fixtures/gguf.hash")" = "$want" ] || say "WARNING: GGUF fixtures made by an older make_gguf_refs.py (rerun device-prepare.sh here)"
else
  say "no .device/fixtures/gguf.tar.gz: GgufDequant.BitIdenticalToGgufPyForEveryType will fail (run scripts/device-prepare.sh here)"
fi
export QLORA_FIXTURES="$FIX"
CUDA_WANT=OK; ((DRY)) && CUDA_WANT=SKIPPED

s_kernel_tests() {
  # blocking launches: a kernel's fault is reported by the launch that caused it (issue 15)
  CUDA_LAUNCH_BLOCKING=1 "$TK" --gtest_filter="$GFILTER" --gtest_output=xml:"$RUN/kernels.xml" || return $?
  require_cases "$RUN/tests.log" "$CUDA_WANT" 'QuantTensor\.Cuda[A-Za-z]*|Cuda[A-Za-z]*\.[A-Za-z]+'
}

s_dequant_bandwidth() {
  if ((DRY)); then "$BQ" cpu 2; return $?; fi
  "$BQ" cuda "$REPS" || return $?
  ! grep -q 'no CUDA device visible\|built without CUDA' "$RUN/bench.txt" || { echo "bench_quant4 did not run on a GPU"; return 1; }
}

s_cuda_parity() {
  CUBLAS_WORKSPACE_CONFIG=:4096:8 "$TG" --gtest_filter='Cuda*:-CudaNccl*' --gtest_output=xml:"$RUN/parity.xml" || return $?
  require_cases "$RUN/parity.log" "$CUDA_WANT" 'Cuda[A-Za-z]*\.[A-Za-z]+'
}

# issue 14: ProcessGroupNCCL forced at world size 1 on cuda:0 (tests/gpu/cuda_nccl_test.cpp); a build
# without NCCL fails it (qlora refuses CUDA with a process group), it does not skip
s_nccl_smoke() {
  "$TG" --gtest_filter='CudaNccl*' --gtest_output=xml:"$RUN/nccl.xml" || return $?
  require_cases "$RUN/nccl.log" "$CUDA_WANT" 'CudaNccl\.[A-Za-z]+'
}

s_gpu_prep_cpu() {  # dry run: test_gpu's CPU cases
  "$TG" --gtest_filter='GpuPrep*' --gtest_output=xml:"$RUN/gpu-prep.xml"
}

if ((DRY)); then P7=tiny; P13=tiny; SEQS=(32 64 128 256); STEPS=2; P13_SEQ=128; BL_PRESET=tiny; BL_SEQ=64; P8=tiny; SEQS8=(64 128)
else P7=llama2-7b; P13=llama2-13b; SEQS=(512 1024 2048 4096 8192); STEPS=3; P13_SEQ=2048; BL_PRESET=llama2-7b; BL_SEQ=2048
  P8=llama3-8b; SEQS8=(2048 8192); fi
# bench_budget: the --max-time-s of a bench step: the time left before the deadline less RESERVE
# (at least 60 s; an hour without a deadline), since bench refuses a run it estimates over 10
# minutes without --max-time-s. Says it on stderr (the step's log) and prints it on stdout.
bench_budget() {
  local mt=$(( $(ds_left) - RESERVE ))
  ((DEADLINE > 0)) || mt=3600
  ((mt >= 60)) || mt=60
  echo "max-time-s $mt (deadline ${DEADLINE}s, ${RESERVE}s reserved for the next steps)" >&2
  echo "$mt"
}
s_bench_7b() {
  local mt; mt=$(bench_budget)
  with_smi bench-7b "$Q" bench --preset "$P7" --sweep --seq-lens "${SEQS[@]}" --batch-sizes 1 2 4 \
    --lora-r 16 --steps "$STEPS" --max-time-s "$mt" --out "$RUN/bench-7b"
}

s_baseline_peft() {
  if ! "$TPY" -c 'import transformers, peft' 2>/dev/null; then
    compgen -G "$ROOT/.device/wheels/*.whl" >/dev/null || { echo "no transformers/peft and no carried .device/wheels"; return 1; }
    echo "installing the carried wheels into /tmp/qlora-site: $(ls "$ROOT/.device/wheels" | tr '\n' ' ')"
    "$TPY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qlora-site \
      "$ROOT"/.device/wheels/*.whl || return $?
    export PYTHONPATH="/tmp/qlora-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  local dev=cuda; ((DRY)) && dev=cpu
  PYTHONUNBUFFERED=1 with_smi baseline "$TPY" "$ROOT/bench/train/peft_baseline_cuda.py" --preset "$BL_PRESET" \
    --seq-len "$BL_SEQ" --batch 1 --steps 4 --r 16 --alpha 32 --device "$dev" --out "$RUN/baseline.json"
}

s_bench_13b() {
  local mt; mt=$(bench_budget)
  with_smi bench-13b "$Q" bench --preset "$P13" --sweep --seq-lens "$P13_SEQ" --batch-sizes 1 --lora-r 16 \
    --steps "$STEPS" --max-time-s "$mt" --out "$RUN/bench-13b"
}

s_bench_8b() {
  # another family for the estimate (GQA, a 128k vocabulary, 14336-wide MLP): the 7B sweep calibrated
  # the allocator fragmentation term, so this is the check it was not fitted to
  local mt; mt=$(bench_budget)
  with_smi bench-8b "$Q" bench --preset "$P8" --sweep --seq-lens "${SEQS8[@]}" --batch-sizes 1 2 --lora-r 16 \
    --steps "$STEPS" --max-time-s "$mt" --out "$RUN/bench-8b"
}

s_report() { "$TPY" "$ROOT/scripts/device-report.py" --run "$RUN" --out "$RESDIR" --mode "$MODE"; }

s_probe() {
  local probe="$BUILD/probe"
  mkdir -p "$probe/src"
  cat > "$probe/src/CMakeLists.txt" <<'EOF'
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
  cat > "$probe/src/probe.cpp" <<'EOF'
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
  rm -f "$probe/build/CMakeCache.txt"
  "$CMAKE" -S "$probe/src" -B "$probe/build" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$P" -DOPENSSL_ROOT_DIR="$P" -DPKG_CONFIG_EXECUTABLE="$BUILD/tools/pkg-config" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${ISO[@]}" || return $?
  "$CMAKE" --build "$probe/build" -j"$JOBS" || return $?
  "$probe/build/probe" || return $?
  ldd "$probe/build/probe" | tee "$BUILD/probe-ldd.txt"
  ! grep -q "not found" "$BUILD/probe-ldd.txt" || { echo "unresolved libraries"; return 1; }
  if ((ISOLATE)); then
    local pd leaked
    if [ "${GEN[1]}" = Ninja ]; then pd="$("$NINJA" -C "$probe/build" -t deps 2>/dev/null)"
    else pd="$(find "$probe/build" \( -name '*.d' -o -name compiler_depend.make \) -exec cat {} +)"; fi
    leaked="$(echo "$pd" | grep -oE '(^|[[:space:]])/usr/include/(x86_64-linux-gnu/)?(nlohmann|yaml-cpp|spdlog|fmt|CLI|openssl|gtest|gmock|benchmark|sentencepiece|pcre2|utf8proc|yaml\.h)[^ :]*' | tr -d '[:blank:]' | sort -u)"
    [ -z "$leaked" ] || { echo "probe took headers from /usr/include:"; echo "$leaked" | head; return 1; }
  fi
}

# =============================== the plan ===============================
if [ "$MODE" = device ]; then
  device_plan
else
  # dry run here: the same configure and build, the CPU parts, no GPU
  step host-compiler 0 env.txt s_host_compiler || finish
  step configure 0 configure.log s_configure || finish
  step build 0 build.log s_build
  ((ISOLATE)) && step prefix-check 0 build.log s_prefix_check
  step kernel-tests 0 tests.log s_kernel_tests
  step dequant-bandwidth 0 bench.txt s_dequant_bandwidth
  step probe 0 probe.log s_probe
  if ((TRAIN)); then
    step gpu-prep-cpu 0 gpu-prep.log s_gpu_prep_cpu
    step nccl-smoke 0 nccl.log s_nccl_smoke
    step bench-7b 0 bench-7b.log s_bench_7b
    step baseline-peft 0 baseline.log s_baseline_peft
    step bench-13b 0 bench-13b.log s_bench_13b
    step bench-8b 0 bench-8b.log s_bench_8b
  fi
  step report -60 report.log s_report
fi
finish
