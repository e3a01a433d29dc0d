#!/usr/bin/env bash
# Runs HERE (x86-64 Debian bookworm with apt): prepares what the GPU machine lacks for
# scripts/device-check.sh, under the git-ignored folder .device/:
#   .device/debs/                the Debian packages, `apt-get download`ed (nothing is installed); NOT carried
#   .device/prefix/usr/...       those packages `dpkg -x`ed: headers, .so, CMake configs, .pc files and the
#                                pkgconf binary; docs, man pages and unused static libraries dropped. Carried.
#   .device/fixtures/quant.tar.gz  tests/fixtures/make_quant_refs.py's output (bitsandbytes is not on the
#                                device, so its reference files travel) + fixtures/hash. Carried.
#   .device/fixtures/gguf.tar.gz   make_gguf_refs.py's dequantization references (no gguf-py on the
#                                device) + fixtures/gguf.hash. Carried.
#   .device/wheels/*.whl         transformers, peft and friends for the PEFT baseline (fallback). Carried.
# The run tool's argument is then  carry: [".device/prefix", ".device/fixtures", ".device/wheels"]  (docs/gpu.md).
# Idempotent: packages already downloaded are not fetched again; the prefix is re-extracted only when
# the set of .deb files (or this script) changed; the fixtures only when make_quant_refs.py /
# make_gguf_refs.py changed.
# The device machine has no -dev packages, no registry and no network: everything the build needs
# beyond python3's torch, nvcc, g++ and CMake must be carried.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEV="$ROOT/.device"
DEBS="$DEV/debs"
PREFIX="$DEV/prefix"
FIXT="$DEV/fixtures"

# -dev packages, their runtime libraries (no apt dependency resolution: the device has libc, libstdc++,
# libgcc; everything else is named here), and pkgconf for pkg_check_modules(sentencepiece).
PKGS=(
  nlohmann-json3-dev
  libyaml-cpp-dev libyaml-cpp0.7
  libyaml-dev libyaml-0-2
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libcli11-dev
  libsentencepiece-dev libsentencepiece0
  libssl-dev libssl3
  libgtest-dev
  libgloo-dev                  # headers only (see below)
  libbenchmark-dev libbenchmark1debian
  pkgconf-bin libpkgconf3
)

if [ "$(uname -m)" != x86_64 ]; then
  echo "[device-prepare] this machine is $(uname -m); the device is x86-64: run this on an x86-64 host" >&2
  exit 1
fi
grep -qx '/.device/' "$ROOT/.gitignore" || grep -qx '/.device/' "$ROOT/.git/info/exclude" 2>/dev/null || {
  echo "[device-prepare] .device/ is not git-ignored; add '/.device/' to .gitignore first" >&2; exit 1; }

# ---- 1. download ----
mkdir -p "$DEBS"
need=()
for p in "${PKGS[@]}"; do
  compgen -G "$DEBS/${p}_*.deb" >/dev/null || need+=("$p")
done
if ((${#need[@]})); then
  echo "[device-prepare] apt-get download: ${need[*]}"
  # (apt warns that root downloads unsandboxed into a folder its _apt user cannot write: harmless)
  dl() { (cd "$DEBS" && apt-get download -q "$@" >/dev/null 2> >(grep -v 'unsandboxed as root' >&2)); }
  if ! dl "${need[@]}"; then
    echo "[device-prepare] download failed; refreshing apt's lists once and retrying"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    dl "${need[@]}"
  fi
fi
# keep one version per package (the newest by dpkg's ordering) when an old one lingers
for p in "${PKGS[@]}"; do
  mapfile -t vs < <(ls "$DEBS/${p}"_*.deb)
  if ((${#vs[@]} > 1)); then
    newest="${vs[0]}"
    for f in "${vs[@]:1}"; do
      if dpkg --compare-versions "$(dpkg-deb -f "$f" Version)" gt "$(dpkg-deb -f "$newest" Version)"; then
        newest="$f"; fi
    done
    for f in "${vs[@]}"; do [ "$f" = "$newest" ] || rm -f "$f"; done
  fi
done

# ---- 2. extract into the prefix ----
stamp="$( (for p in "${PKGS[@]}"; do basename "$DEBS/${p}"_*.deb; done; sha256sum "${BASH_SOURCE[0]}") | sha256sum | cut -c1-16)"
if [ "$(cat "$PREFIX/.stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "[device-prepare] extracting ${#PKGS[@]} packages into .device/prefix"
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  for p in "${PKGS[@]}"; do dpkg -x "$DEBS/${p}"_*.deb "$PREFIX"; done
  # drop what no build needs
  rm -rf "$PREFIX"/usr/share/{doc,man,info,lintian,bug,doc-base,aclocal} "$PREFIX"/usr/lib/ssl/misc \
         "$PREFIX"/usr/share/pkgconfig/personality.d "$PREFIX"/etc "$PREFIX"/usr/src
  # Debian's multiarch headers (openssl/configuration.h, opensslconf.h) live in include/<triplet>/, which
  # g++ searches only under /usr: merge them into include/ so -I<prefix>/usr/include finds them
  if [ -d "$PREFIX/usr/include/x86_64-linux-gnu" ]; then
    cp -a "$PREFIX/usr/include/x86_64-linux-gnu/." "$PREFIX/usr/include/"
    rm -rf "$PREFIX/usr/include/x86_64-linux-gnu"
  fi
  # Gloo: only its headers (c10d's ProcessGroupGloo.hpp; the Gloo code is inside the torch wheel):
  # drop the library link (its libgloo0 target is not carried) and the CMake config naming it
  rm -rf "$PREFIX"/usr/lib/libgloo.so "$PREFIX"/usr/lib/x86_64-linux-gnu/libgloo.so "$PREFIX"/usr/share/cmake/Gloo
  # static archives: keep those a CMake config imports (GoogleTest's, benchmark_main), drop the rest
  # (libcrypto.a, libssl.a, libyaml-cpp.a: ~11 MB; the build links the .so)
  while IFS= read -r -d '' a; do
    grep -rqF "$(basename "$a")" "$PREFIX/usr/lib/x86_64-linux-gnu/cmake" "$PREFIX/usr/share/cmake" 2>/dev/null || rm -f "$a"
  done < <(find "$PREFIX" -name '*.a' -print0)
  # absolute links (e.g. /usr/lib/... targets) would point outside the prefix on the device: make relative
  while IFS= read -r -d '' l; do
    t="$(readlink "$l")"
    case "$t" in
      /*) ln -sfn "$(realpath -m --relative-to="$(dirname "$l")" "$PREFIX$t")" "$l" ;;
    esac
  done < <(find "$PREFIX" -type l -print0)
  # every link must resolve inside the prefix
  bad=0
  while IFS= read -r -d '' l; do
    [ -e "$l" ] || { echo "[device-prepare] dangling link: ${l#"$ROOT"/} -> $(readlink "$l")" >&2; bad=1; }
  done < <(find "$PREFIX" -type l -print0)
  ((bad == 0)) || exit 1
  echo "$stamp" > "$PREFIX/.stamp"
fi

# ---- 3. quant fixtures (bitsandbytes references; the device has no bitsandbytes) ----
src="$ROOT/tests/fixtures/make_quant_refs.py"
hash="$(sha256sum "$src" | cut -c1-12)"
if [ "$(cat "$FIXT/hash" 2>/dev/null)" != "$hash" ] || [ ! -f "$FIXT/quant.tar.gz" ]; then
  # reuse fixtures scripts/test.sh made (its stamp names the generator's hash), else make them
  # shellcheck source=env.sh
  source "$ROOT/scripts/env.sh"
  from=""
  for d in "${QLORA_BUILD:-$ROOT/build}/fixtures" "$ROOT"/build*/fixtures; do
    if [ -f "$d/.make_quant_refs.py.$hash" ] && [ -f "$d/quant/manifest.json" ]; then from="$d"; break; fi
  done
  if [ -z "$from" ]; then
    if [ -x "$QLORA_VENV/bin/python" ]; then
      echo "[device-prepare] making quant fixtures with $QLORA_VENV/bin/python"
      from="$DEV/fixtures-tmp"
      rm -rf "$from"; mkdir -p "$from"
      "$QLORA_VENV/bin/python" "$src" --out "$from"
    else
      echo "[device-prepare] WARNING: no venv ($QLORA_VENV; run scripts/setup.sh) and no fixtures made" \
           "for make_quant_refs.py $hash: the device run will skip the bitsandbytes parity tests" >&2
    fi
  fi
  if [ -n "$from" ]; then
    echo "[device-prepare] packing quant fixtures from ${from#"$ROOT"/}"
    mkdir -p "$FIXT"
    tar -C "$from" -czf "$FIXT/quant.tar.gz.tmp" quant
    mv "$FIXT/quant.tar.gz.tmp" "$FIXT/quant.tar.gz"
    echo "$hash" > "$FIXT/hash"
    rm -rf "$DEV/fixtures-tmp"
  fi
fi

# ---- 3b. GGUF dequantization fixtures (test_kernels' GgufDequant.BitIdenticalToGgufPyForEveryType;
# the device has no gguf-py): make_gguf_refs.py --skip-model, only gguf/dequant.{gguf,json} (~1 MB) ----
gsrc="$ROOT/tests/fixtures/make_gguf_refs.py"
ghash="$(sha256sum "$gsrc" | cut -c1-12)"
if [ "$(cat "$FIXT/gguf.hash" 2>/dev/null)" != "$ghash" ] || [ ! -f "$FIXT/gguf.tar.gz" ]; then
  # shellcheck source=env.sh
  source "$ROOT/scripts/env.sh"
  if [ -x "$QLORA_VENV/bin/python" ]; then
    echo "[device-prepare] making the GGUF dequantization fixtures with $QLORA_VENV/bin/python"
    rm -rf "$DEV/fixtures-gguf"; mkdir -p "$DEV/fixtures-gguf" "$FIXT"
    "$QLORA_VENV/bin/python" "$gsrc" --out "$DEV/fixtures-gguf" --skip-model > /dev/null
    tar -C "$DEV/fixtures-gguf" -czf "$FIXT/gguf.tar.gz.tmp" gguf/dequant.gguf gguf/dequant.json
    mv "$FIXT/gguf.tar.gz.tmp" "$FIXT/gguf.tar.gz"
    echo "$ghash" > "$FIXT/gguf.hash"
    rm -rf "$DEV/fixtures-gguf"
  else
    echo "[device-prepare] WARNING: no venv ($QLORA_VENV; run scripts/setup.sh): no GGUF fixtures; the device's" \
         "kernel-tests step will fail GgufDequant.BitIdenticalToGgufPyForEveryType" >&2
  fi
fi

# ---- 4. Python wheels for the transformers + PEFT baseline (bench/train/peft_baseline_cuda.py) ----
# The device image lists transformers and peft (KINDS.md, 2026-11-17); these are the fallback that
# device-check.sh installs into /tmp/qlora-site only when `import transformers, peft` fails there.
# Pure-Python wheels plus three abi3 ones (tokenizers, safetensors, hf-xet); torch, numpy, pyyaml,
# regex, tqdm, httpx, click, psutil, ... are the device's own (--no-deps). Pinned to the test venv's
# versions (huggingface_hub 1.x: 2.x needs httpx2, not on the device). ~22 MiB.
WHEELS="$DEV/wheels"
WHEEL_PINS=(transformers==5.23.0 peft==0.21.2 accelerate==1.15.0 tokenizers==0.23.3 safetensors==0.8.0
            huggingface_hub==1.33.0 hf-xet==1.8.0)
have_all=1
for w in "${WHEEL_PINS[@]}"; do
  n="${w%%==*}"; v="${w##*==}"
  compgen -G "$WHEELS/$(echo "$n" | tr - _)-$v-*.whl" >/dev/null || have_all=0
done
if ((have_all == 0)); then
  echo "[device-prepare] pip download (no deps, cp312 manylinux x86-64): ${WHEEL_PINS[*]}"
  rm -rf "$WHEELS.tmp"; mkdir -p "$WHEELS.tmp"
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
       -d "$WHEELS.tmp" "${WHEEL_PINS[@]}"; then
    rm -rf "$WHEELS"; mv "$WHEELS.tmp" "$WHEELS"
  else
    rm -rf "$WHEELS.tmp"
    echo "[device-prepare] WARNING: pip download failed; the baseline step then needs the device's own transformers + peft" >&2
  fi
fi

# ---- 5. report ----
carried=("$PREFIX"); [ -d "$FIXT" ] && carried+=("$FIXT"); [ -d "$WHEELS" ] && carried+=("$WHEELS")
bytes="$(du -scb "${carried[@]}" | tail -1 | cut -f1)"
tree_bytes="$( (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1) || echo 0)"
mib() { awk -v b="$1" 'BEGIN{printf "%.1f MiB", b/1048576}'; }
echo "[device-prepare] carried: .device/prefix $(mib "$(du -sb "$PREFIX" | cut -f1)")," \
     ".device/fixtures $( [ -d "$FIXT" ] && mib "$(du -sb "$FIXT" | cut -f1)" || echo none)," \
     ".device/wheels $( [ -d "$WHEELS" ] && mib "$(du -sb "$WHEELS" | cut -f1)" || echo none)," \
     "together $(mib "$bytes"); rest of the working tree $(mib "$tree_bytes");" \
     "in all $(mib $((bytes + tree_bytes))) of the 64 MiB limit (nothing built here is carried: the device builds)"
if ((bytes + tree_bytes > 60 * 1048576)); then
  echo "[device-prepare] ERROR: over 60 MiB in all; the run tool refuses a working tree over 64 MiB" >&2
  exit 1
fi
echo "[device-prepare] run: carry [\".device/prefix\", \".device/fixtures\", \".device/wheels\"]," \
     "command \"bash scripts/device-check.sh\", timeout_s 480 (docs/gpu.md)"
