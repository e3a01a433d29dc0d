# scripts/device-lib.sh — sourced by scripts/device-check.sh and tests/gpu/device_steps_test.sh.
# The step runner of the one GPU call (issue 15): steps run in the order given, each starts only
# while enough time is left before the deadline, each is killed (its whole process group) when the
# deadline comes, and each step's row is appended to $DS_RES/steps.tsv the moment it ends, so a run
# killed from outside keeps every finished row. Also: the pick of a CUDA host compiler nvcc accepts.
#
#   ds_init RES DEADLINE_S      start the clock; RES/steps.tsv emptied; DEADLINE_S 0 = no deadline
#   ds_left                     seconds left before the deadline (999999 without one)
#   ds_run NAME MIN_LEFT LOG FN [ARGS...]
#       runs the shell function/command FN with output appended to RES/LOG. Rows (tab-separated:
#       name, status, seconds, note): ok | FAIL(rc) | TIMEOUT (killed at the deadline) | NOTIME
#       (fewer than MIN_LEFT seconds left: not started) | SKIP (not in QLORA_STEPS, a comma-separated
#       list of glob patterns, for a rerun of some steps). MIN_LEFT < 0: runs even after the deadline,
#       limited to -MIN_LEFT seconds (the report). Returns FN's status (124: killed, 125: not started
#       for lack of time; 0 for SKIP, which is no failure).
#   ds_failed                   0 when no step failed, timed out or was left without time
#   ds_pick_cuda_host NVCC      prints "" (nvcc's default host compiler works) or the path of a g++
#                               nvcc accepts; returns 1 with the reason on stderr when none does.

ds_init() {
  DS_RES="$1"; DS_DEADLINE="$2"; DS_T0=$(date +%s); DS_FAILED=0
  mkdir -p "$DS_RES"; : > "$DS_RES/steps.tsv"
}

ds_left() {
  if ((DS_DEADLINE > 0)); then echo $(( DS_DEADLINE - ($(date +%s) - DS_T0) )); else echo 999999; fi
}

ds_selected() {
  [ -z "${QLORA_STEPS:-}" ] && return 0
  local pat IFS=,
  for pat in $QLORA_STEPS; do
    # shellcheck disable=SC2053
    [[ "$1" == $pat ]] && return 0
  done
  return 1
}

ds__row() {  # NAME STATUS SECONDS NOTE
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$DS_RES/steps.tsv"
  printf '[device-check] %-24s %-9s %5ss  %s\n' "$1" "$2" "$3" "$4"
}

ds_run() {
  local name="$1" min_left="$2" lname="$3" log="$DS_RES/$3"; shift 3
  if ! ds_selected "$name"; then ds__row "$name" SKIP 0 "not in QLORA_STEPS"; return 0; fi
  local left secs
  left=$(ds_left)
  if ((min_left >= 0)); then
    if ((left < min_left)); then ds__row "$name" NOTIME 0 "${left}s left < ${min_left}s needed"; DS_FAILED=1; return 125; fi
    secs=$left
  else
    secs=$(( -min_left ))
  fi
  local t=$(date +%s) marker pid wd rc
  marker="$(mktemp)"; rm -f "$marker"
  echo "=== $name ($(date -u +%T), $(( t - DS_T0 ))s in, limit ${secs}s): $*" >> "$log"
  set -m  # the step and the watchdog get process groups of their own, killed as a whole
  ( "$@" ) >> "$log" 2>&1 &
  pid=$!
  ( trap 'exit 0' TERM; sleep "$secs" & wait $!; touch "$marker"; kill -TERM -- -"$pid" 2>/dev/null
    sleep 10 & wait $!; kill -KILL -- -"$pid" 2>/dev/null ) &
  wd=$!
  set +m
  wait "$pid"; rc=$?
  kill -TERM -- -"$wd" 2>/dev/null; wait "$wd" 2>/dev/null
  local st=ok
  if [ -e "$marker" ]; then st=TIMEOUT; rc=124; rm -f "$marker"
  elif ((rc != 0)); then st="FAIL($rc)"; fi
  ((rc == 0)) || DS_FAILED=1
  ds__row "$name" "$st" $(( $(date +%s) - t )) ""
  ((rc == 0)) || { echo "[device-check] $name: $st; last lines of $lname:"; tail -n 25 "$log"; }
  return $rc
}

ds_failed() { return $DS_FAILED; }

ds_pick_cuda_host() {
  local nvcc="$1" dir src out cand tried=() maxgnu
  dir="$(mktemp -d)"; src="$dir/t.cu"
  printf '__global__ void k(int* p) { *p = 1; }\nint main() { return 0; }\n' > "$src"
  if out="$("$nvcc" -x cu -c "$src" -o "$dir/t.o" 2>&1)"; then rm -rf "$dir"; echo ""; return 0; fi
  maxgnu="$(echo "$out" | grep -oE 'gcc versions later than [0-9]+' | grep -oE '[0-9]+$' || true)"
  tried+=("default ($(command -v g++ || echo none): $(echo "$out" | grep -m1 -E 'error|unsupported' || echo "$out" | head -1))")
  for cand in $(compgen -c g++- | grep -E '^g\+\+-[0-9]+$' | sort -t- -k2 -nr -u); do
    cand="$(command -v "$cand")" || continue
    if "$nvcc" -ccbin "$cand" -x cu -c "$src" -o "$dir/t.o" >/dev/null 2>&1; then rm -rf "$dir"; echo "$cand"; return 0; fi
    tried+=("$cand")
  done
  rm -rf "$dir"
  echo "no host compiler that $nvcc accepts${maxgnu:+ (it takes gcc <= $maxgnu)}; tried: ${tried[*]}" >&2
  return 1
}
