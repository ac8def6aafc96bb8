#!/usr/bin/env bash
# Compile trtq's C (trtq/calib/collect/*.c) with every warning an error, with each compiler and
# target found here: GCC and clang for this machine (Linux x86-64: the AVX2 loops and
# target_clones), and clang for Linux aarch64 (the generic loops) where an arm64 sysroot is
# installed (Debian: libc6-dev-arm64-cross). The library is built on Linux only (setup.py);
# elsewhere trtq runs numpy. CI (.ci/run) calls this; a missing compiler or sysroot is said and
# skipped, a warning fails.
set -euo pipefail
cd "$(dirname "$0")/../trtq/calib/collect"
PY=${PYTHON:-python}
INC=$($PY -c "import sysconfig; print(sysconfig.get_paths()['include'])")
FLAGS=(-Wall -Wextra -Werror -O3 -fPIC "-I$INC")
checked=0
for cc in gcc clang; do
  if ! command -v $cc >/dev/null 2>&1; then echo "check_c: no $cc here, skipped"; continue; fi
  for f in _kernels.c _ingraph.c _ingraph_fold.c; do
    $cc "${FLAGS[@]}" -c "$f" -o /dev/null
  done
  echo "check_c: $cc $($cc -dumpversion) (host): ok"
  checked=$((checked + 1))
done
ARM=/usr/aarch64-linux-gnu
if command -v clang >/dev/null 2>&1 && [ -f $ARM/include/stdint.h ]; then
  for f in _kernels.c _ingraph.c _ingraph_fold.c; do
    clang --target=aarch64-linux-gnu --sysroot=$ARM -isystem $ARM/include "${FLAGS[@]}" -fsyntax-only "$f"
  done
  echo "check_c: clang (aarch64-linux-gnu): ok"
else
  echo "check_c: no clang or no arm64 sysroot ($ARM), aarch64 skipped"
fi
[ $checked -gt 0 ] || { echo "check_c: no C compiler found"; exit 1; }
