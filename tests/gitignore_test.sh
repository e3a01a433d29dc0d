#!/usr/bin/env bash
# Every directory the shipped configs write into or tell the user to import a model into
# (output_dir, model.path relative to the repository: runs/..., models/...) is in .gitignore, so a
# downloaded model or a run's output never shows as untracked (a trial saw a 269 MB models/ dir).
# Checks the first path component against the top-level `/NAME/` lines of .gitignore.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fail=0
while IFS= read -r p; do
  top="${p%%/*}"
  if ! grep -qxF "/$top/" "$root/.gitignore"; then
    echo "gitignore_test: $p (from the shipped configs) is not ignored: add /$top/ to .gitignore"
    fail=1
  fi
done < <(grep -rhoE '^\s*(output_dir|path):\s*[A-Za-z0-9_.-]+/[^ #]*' "$root/configs" "$root/examples" --include='*.yaml' |
         sed -E 's/^\s*(output_dir|path):\s*//' | sort -u)
n="$(grep -rhoE '^\s*(output_dir|path):\s*[A-Za-z0-9_.-]+/' "$root/configs" "$root/examples" --include='*.yaml' | wc -l)"
[ "$n" -gt 0 ] || { echo "gitignore_test: no output_dir / model.path found in configs/ (the pattern is stale)"; exit 1; }
[ "$fail" = 0 ] && echo "gitignore_test: $n paths, all ignored"
exit "$fail"
