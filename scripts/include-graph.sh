#!/usr/bin/env bash
# Prints which folder includes which (counts of #include "folder/..." lines per pair), the lines of
# code per folder, and checks that every include points down the layering (docs/architecture.md):
#   common < kernels < data < adapters < model < config < trainer < cli
# (tests/, bench/ and examples/ may include any folder). Exit 1, naming the file and line, when a
# folder includes one above it or itself is unknown. Run by ctest (include_graph).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LAYERS=(common kernels data adapters model config trainer cli)
rank() { local i; for i in "${!LAYERS[@]}"; do [ "${LAYERS[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }

echo "lines per folder (wc -l of *.h *.cpp *.cu *.cuh *.inc):"
for d in "${LAYERS[@]}" tests bench; do
  printf '  %-9s %6d\n' "$d" "$(find "$d" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) -print0 | xargs -0 cat | wc -l)"
done

bad=0
edges="$(mktemp)"; trap 'rm -f "$edges"' EXIT
for d in "${LAYERS[@]}"; do
  while IFS=: read -r file line inc; do
    to="${inc#*\"}"; to="${to%%/*}"
    [ "$to" = "$d" ] && continue
    echo "$d $to" >> "$edges"
    rt="$(rank "$to")"
    if ((rt < 0)) || ((rt > $(rank "$d"))); then
      echo "UPWARD: $file:$line includes $to (${inc#*#include })" >&2; bad=1
    fi
  done < <(grep -rnE '^#include "[a-z_]+/' "$d" --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
done
echo "includes between folders (from -> to: #include lines):"
sort "$edges" | uniq -c | awk '{ printf "  %-9s -> %-9s %4d\n", $2, $3, $1 }'
((bad == 0)) && echo "layering: every include points down" || { echo "layering: broken (see UPWARD lines)" >&2; exit 1; }
