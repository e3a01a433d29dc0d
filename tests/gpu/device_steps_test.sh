#!/usr/bin/env bash
# The GPU run's step logic without a GPU (issue 15): `scripts/device-check.sh --fake` runs the
# device's real plan with fake steps. Checks: the order by value; a step starts only with enough
# time left and is killed at the deadline (its process group too); rows and results survive a kill
# of the whole run; a failed step does not stop the next; QLORA_STEPS reruns a subset; the report
# marks everything not measured "pending"; device-append-docs.py appends it with date/commit/command;
# and the CUDA host-compiler pick (a stub nvcc that refuses g++ > 15). Run by ctest (device_steps).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
W="$(mktemp -d /tmp/qlora-device-steps.XXXXXX)"
trap 'rm -rf "$W"' EXIT
FAILS=0
fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }
col() { awk -F'\t' -v n="$1" '{ print $n }' "$2" | tr '\n' ' ' | sed 's/ $//'; }
# in_tar ARCHIVE NAME: the archive lists ./NAME. Not `tar -tzf | grep -q` under pipefail: tar writes
# each name on its own, so once grep -q has matched and exited, tar's next write dies of SIGPIPE and
# the pipeline fails although the name is there (CI stop 18).
in_tar() { local list; list="$(tar -tzf "$1")" || return 1; grep -qxF "./$2" <<< "$list"; }

# 1. order, minimum time left, deadline kill, failure isolation, partial report
B="$W/b1"
t0=$(date +%s)
QLORA_DEVICE_BUILD="$B" OUT="$B/out" QLORA_DEADLINE_S=12 QLORA_MIN_LEFT_PCT=5 \
  QLORA_FAKE_BUILD="sleep 1" QLORA_FAKE_CUDA_PARITY=fail QLORA_FAKE_BENCH_7B="sleep 1" \
  QLORA_FAKE_BASELINE_PEFT="sleep 67" \
  bash "$ROOT/scripts/device-check.sh" --fake > "$W/run1.log" 2>&1
rc=$?
t1=$(date +%s)
[ $rc -ne 0 ] || fail "a run with a failed step exited 0"
S="$B/out/steps.tsv"
[ "$(col 1 "$S")" = "host-compiler configure build kernel-tests dequant-bandwidth cuda-parity nccl-smoke bench-7b baseline-peft bench-13b bench-8b report" ] \
  || fail "step order: $(col 1 "$S")"
[ "$(col 2 "$S")" = "ok ok ok ok ok FAIL(3) ok ok TIMEOUT NOTIME NOTIME ok" ] || fail "statuses: $(col 2 "$S")"
((t1 - t0 <= 19)) || fail "the run took $((t1 - t0)) s with a 12 s deadline (the 67 s step was not killed)"
pgrep -xf "sleep 67" > /dev/null && fail "the timed-out step's sleep lives on: $(pgrep -af 'sleep 67')"
R="$B/out/report.md"
grep -q "| llama2-7b | 512 | 1 | 4.[0-9][0-9] | " "$R" || fail "the fake 7B rows are not in the report: $(grep llama2-7b "$R" | head -2)"
grep -q "pending (step baseline-peft: TIMEOUT)" "$R" || fail "baseline not pending(TIMEOUT)"
grep -q "pending (step bench-13b: NOTIME)" "$R" || fail "13B not pending(NOTIME)"
grep -q "pending (step cuda-parity: FAIL(3))" "$R" || fail "parity not pending(FAIL)"
grep -q "pending (step dequant-bandwidth: ok)" "$R" || fail "an ok step without output must still read pending"
grep -q "NCCL smoke .*pending (step nccl-smoke: ok)" "$R" || fail "NCCL smoke not pending(ok)"
grep -q "RESULT: FAILED" "$B/out/summary.txt" || fail "summary has no RESULT: FAILED"
in_tar "$B/out/results.tar.gz" bench-7b.csv || fail "results.tar.gz lacks bench-7b.csv"
[ "$(ls "$B/out" | wc -l)" -le 8 ] || fail "more than 8 files in OUT: $(ls "$B/out")"

# 2. the docs get the report appended, with date, commit and command; pending stays pending
mkdir -p "$W/docs"; echo "# Memory" > "$W/docs/memory.md"
python3 "$ROOT/scripts/device-append-docs.py" "$B/out" --docs "$W/docs" > /dev/null 2>&1 \
  && fail "append-docs took a fake run without --allow-nondevice"
python3 "$ROOT/scripts/device-append-docs.py" "$B/out" --docs "$W/docs" --allow-nondevice \
  --command 'run(command="bash scripts/device-check.sh", ...)' > /dev/null || fail "append-docs failed"
grep -q "^### GPU check $(date -u +%F) (commit " "$W/docs/memory.md" || fail "memory.md: no dated header"
grep -q "scripts/device-check.sh --fake" "$W/docs/memory.md" || fail "memory.md: no command"
grep -q "| llama2-13b | pending (step bench-13b: NOTIME)" "$W/docs/memory.md" || fail "memory.md: 13B not pending"
grep -q "Dequantize bandwidth" "$W/docs/memory.md" && fail "memory.md got the bandwidth table"
head -1 "$W/docs/performance.md" | grep -q "^# Performance" || fail "performance.md not created"
grep -q "pending (step baseline-peft: TIMEOUT)" "$W/docs/performance.md" || fail "performance.md: baseline not pending"
grep -q "Dequantize bandwidth" "$W/docs/performance.md" || fail "performance.md: no bandwidth table"

# 3. a run killed from outside (the tool's timeout) keeps the rows and results of finished steps
B="$W/b2"
QLORA_DEVICE_BUILD="$B" OUT="$B/out" QLORA_DEADLINE_S=60 QLORA_MIN_LEFT_PCT=5 QLORA_FAKE_BENCH_7B="sleep 20" \
  setsid bash "$ROOT/scripts/device-check.sh" --fake > "$W/run2.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  [ "$(cat "$B/run/bench-7b.csv" 2>/dev/null | wc -l)" -ge 4 ] && break
  sleep 0.1
done
kill -KILL -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null
[ "$(col 1 "$B/out/steps.tsv")" = "host-compiler configure build kernel-tests dequant-bandwidth cuda-parity nccl-smoke" ] \
  || fail "rows kept after a kill: $(col 1 "$B/out/steps.tsv")"
[ "$(wc -l < "$B/run/bench-7b.csv")" -ge 4 ] || fail "bench rows written before the kill are gone"
in_tar "$B/out/results.tar.gz" steps.tsv || fail "no results.tar.gz after the kill"

# 4. QLORA_STEPS reruns a subset; the others are SKIP rows, not failures
B="$W/b3"
QLORA_DEVICE_BUILD="$B" OUT="$B/out" QLORA_DEADLINE_S=30 QLORA_MIN_LEFT_PCT=5 QLORA_STEPS="host-compiler,bench-*,report" \
  bash "$ROOT/scripts/device-check.sh" --fake > "$W/run3.log" 2>&1 || fail "a subset run with every step ok failed: $(tail -3 "$W/run3.log")"
[ "$(col 2 "$B/out/steps.tsv")" = "ok SKIP SKIP SKIP SKIP SKIP SKIP ok SKIP ok ok ok" ] || fail "subset statuses: $(col 2 "$B/out/steps.tsv")"

# 5. the CUDA host compiler: nvcc refusing g++ > 15 gets a g++-N it accepts, or the run stops with the reason
mkdir -p "$W/bin"
cat > "$W/bin/nvcc" <<'EOF'
#!/bin/sh
case " $* " in *" -ccbin "*g++-13" "*) exit 0 ;; esac
echo "host_config.h: #error -- unsupported GNU version! gcc versions later than 15 are not supported!" >&2
exit 1
EOF
printf '#!/bin/sh\nexit 0\n' > "$W/bin/g++-16"; cp "$W/bin/g++-16" "$W/bin/g++-13"
chmod +x "$W/bin/"*
got="$(PATH="$W/bin:$PATH" bash -c "source '$ROOT/scripts/device-lib.sh'; ds_pick_cuda_host '$W/bin/nvcc'")" || fail "no host compiler picked"
[ "$got" = "$W/bin/g++-13" ] || fail "picked '$got', want $W/bin/g++-13"
rm "$W/bin/g++-13"
err="$(PATH="$W/bin:$PATH" bash -c "source '$ROOT/scripts/device-lib.sh'; ds_pick_cuda_host '$W/bin/nvcc'" 2>&1 >/dev/null)" \
  && fail "a pick without an accepted compiler succeeded"
echo "$err" | grep -q "no host compiler that .*nvcc accepts (it takes gcc <= 15)" || fail "reason: $err"

# 6. a point's nvidia-smi peak is read from its own start to its end: the sample just before its
#    start still shows the previous, larger point (the first H200 run read 512x2 at 8192x1's 11085 MiB)
R6="$W/r6"; mkdir -p "$R6/out"
echo "seq_len,micro_batch_size,fits,step_s,tokens_per_s,mfu,hfu,measured_peak_bytes,measured_reserved_bytes,estimated_bytes,relative_error,cost_per_million_tokens,estimated_allocated_bytes,start_unix_s,end_unix_s" > "$R6/bench-7b.csv"
t=$(date -d "2026-12-04 12:00:00" +%s)
echo "8192,1,true,1,7630,0.25,0.37,9000000000,10000000000,9900000000,0,,9500000000,$t.000,$((t + 3)).000" >> "$R6/bench-7b.csv"
echo "512,2,true,0.2,5459,0.15,0.22,5000000000,5800000000,5600000000,0,,5200000000,$((t + 3)).010,$((t + 4)).000" >> "$R6/bench-7b.csv"
for ms in 0 500 1000 1500 2000 2500 2850; do
  printf '%s, 11085\n' "$(date -d "@$((t + ms / 1000)).$(printf %03d $((ms % 1000)))" '+%Y/%m/%d %H:%M:%S.%3N')"
done > "$R6/bench-7b.smi"
for ms in 3200 3600 3950; do
  printf '%s, 6309\n' "$(date -d "@$((t + ms / 1000)).$(printf %03d $((ms % 1000)))" '+%Y/%m/%d %H:%M:%S.%3N')"
done >> "$R6/bench-7b.smi"
python3 "$ROOT/scripts/device-report.py" --run "$R6" --out "$R6/out" --mode fake > /dev/null 2>&1 || fail "report on the smi case failed"
grep -q "| llama2-7b | 8192 | 1 | .* | 11085 | " "$R6/out/report.md" || fail "8192x1 smi peak: $(grep '| 8192 | 1 |' "$R6/out/report.md")"
grep -q "| llama2-7b | 512 | 2 | .* | 6309 | " "$R6/out/report.md" || fail "512x2 took another point's samples: $(grep '| 512 | 2 |' "$R6/out/report.md")"

if ((FAILS)); then echo "device_steps_test: $FAILS failure(s); run log:"; tail -40 "$W/run1.log"; exit 1; fi
echo "device_steps_test: all checks passed"
