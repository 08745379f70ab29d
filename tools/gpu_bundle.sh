#!/usr/bin/env bash
# Builds a self-contained folder for checking Trainyard's GPU path on a machine
# with an NVIDIA driver but no build toolchain (no Bazel, none of Debian's
# libraries, no network):
#
#   tools/gpu_bundle.sh [OUT_DIR]      # default /tmp/trainyard-gpu-bundle
#   # copy OUT_DIR to the GPU machine, then there:
#   OUT_DIR/run.sh [RESULTS_DIR]
#
# Needs Bazel and the CUDA toolkit here (a build without nvcc has only stub
# kernels, so it refuses). One `bazel build` makes every test tagged gpu, any
# *gpu*benchmark* binary, //kernels/cuda:mlp_benchmark, the CLI, both daemons
# and the three task plugins. The folder holds:
#   bin/            trainyard, trainyard-controller, trainyard-worker,
#                   mlp_benchmark, train_step_benchmark (the CPU step),
#                   optimizer_benchmark (the CPU optimizer)
#                   (+ GPU benchmarks), gemm_libs (tools/gemm_libs, where
#                   this machine has its libraries' -dev packages);
#                   bin/tests/<package>/<test> with its runfiles (data only)
#   plugins/        lib{mse,cross_entropy,logit_distillation}.so
#   lib/            every shared library ldd lists, except glibc, libstdc++,
#                   libgcc_s and CUDA's own (the GPU machine has those), plus
#                   the OpenBLAS that kernels/blas.cc dlopen()s (and the
#                   BLIS that gemm_libs dlopen()s)
#   examples/       digits.json and digits/*.npy
#   tools/          bench_gpu_mlp.py, bench_inference.py, bench_cpu_step.py,
#                   gpu_compare.py
#   run.sh          tools/gpu_bundle_run.sh
#   gpu_tests.txt, gpu_benchmarks.txt, MANIFEST.txt
set -euo pipefail

cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${1:-/tmp/trainyard-gpu-bundle}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
START=$SECONDS

die() {
  echo "gpu_bundle: $*" >&2
  exit 1
}

command -v bazel >/dev/null 2>&1 || die "bazel is not installed (run tools/setup.sh)"
[[ -x $CUDA_HOME/bin/nvcc ]] ||
  die "no CUDA toolkit: $CUDA_HOME/bin/nvcc is missing (set CUDA_HOME). Without nvcc every kernel is a stub and the bundle would test nothing."
if [[ -e $OUT && ! -f $OUT/MANIFEST.txt && -n "$(ls -A "$OUT")" ]]; then
  die "$OUT exists, is not empty and is not a bundle (no MANIFEST.txt): not overwriting it"
fi

# query EXPR: the labels, one a line (none is fine); dies on a query error.
query() {
  local out
  out=$(bazel query --noshow_progress "$1" 2>&1) || die "bazel query '$1' failed: $out"
  grep '^//' <<<"$out" || true
}
tests=$(query 'attr(tags, "\bgpu\b", tests(//...))')
benches=$(query 'kind("cc_binary", attr(name, "gpu.*benchmark", //...) + attr(tags, "\bgpu\b", //...)) except //kernels/cuda:mlp_benchmark')
mapfile -t TESTS < <(grep . <<<"$tests")
mapfile -t BENCHES < <(grep . <<<"$benches")
((${#TESTS[@]} > 0)) || die "bazel query found no test tagged gpu"
TOOLS=(//kernels/cuda:mlp_benchmark //cli:trainyard
  //controller:trainyard-controller //worker:trainyard-worker
  //engine:train_step_benchmark //engine:optimizer_benchmark
  //kernels:packed_gemm_benchmark "${BENCHES[@]}")
PLUGINS=(//task_plugins:libmse.so //task_plugins:libcross_entropy.so
  //task_plugins:liblogit_distillation.so)

echo "gpu_bundle: building ${#TESTS[@]} gpu tests, ${#TOOLS[@]} binaries, ${#PLUGINS[@]} plugins"
bazel build --jobs=2 "${TESTS[@]}" "${TOOLS[@]}" "${PLUGINS[@]}" || die "bazel build failed"
BIN=$(bazel info bazel-bin 2>/dev/null)
DEFS=$(bazel info output_base 2>/dev/null)/external/cuda/defs.bzl
grep -q '^CUDA_AVAILABLE = True' "$DEFS" ||
  die "the build did not use CUDA ($DEFS says $(grep CUDA_AVAILABLE "$DEFS" || echo nothing)): the kernels are stubs"

# //pkg/sub:name -> pkg/sub/name
path_of() {
  local l=${1#//}
  echo "${l%%:*}/${l#*:}"
}

rm -rf "$OUT"
mkdir -p "$OUT"/{bin/tests,plugins,lib,examples/digits,tools}
OUT=$(cd "$OUT" && pwd)
WS=$(sed -n 's/^workspace(name = "\([^"]*\)").*/\1/p' WORKSPACE)
ELFS=() # original (bazel-bin) paths, so ldd resolves Bazel's $ORIGIN rpaths

for t in "${TOOLS[@]}"; do
  cp "$BIN/$(path_of "$t")" "$OUT/bin/"
  ELFS+=("$BIN/$(path_of "$t")")
done
for t in "${PLUGINS[@]}"; do
  cp "$BIN/$(path_of "$t")" "$OUT/plugins/"
  ELFS+=("$BIN/$(path_of "$t")")
done
# A test's runfiles minus its shared libraries (_solib_*, they go to lib/)
# and the test itself; kept only when data is left (testdata files).
: >"$OUT/gpu_tests.txt"
for t in "${TESTS[@]}"; do
  p=$(path_of "$t")
  mkdir -p "$OUT/bin/tests/${p%/*}"
  cp "$BIN/$p" "$OUT/bin/tests/$p"
  ELFS+=("$BIN/$p")
  echo "bin/tests/$p $t" >>"$OUT/gpu_tests.txt"
  if [[ -d $BIN/$p.runfiles ]]; then
    mkdir -p "$OUT/bin/tests/$p.runfiles"
    tar -C "$BIN/$p.runfiles" -ch --exclude='_solib_*' \
      --exclude=./MANIFEST --exclude="./$WS/$p" . |
      tar -C "$OUT/bin/tests/$p.runfiles" -x
    find "$OUT/bin/tests/$p.runfiles" -depth -type d -empty -delete
  fi
done
: >"$OUT/gpu_benchmarks.txt"
for t in "${BENCHES[@]}"; do
  echo "bin/$(basename "$(path_of "$t")") $t" >>"$OUT/gpu_benchmarks.txt"
done

# OpenBLAS is not linked but dlopen()ed by the name in kernels/blas.cc; take
# Debian's pthread build.
BLAS_NAME=$(sed -n 's/.*kLibrary\[\] = "\([^"]*\)".*/\1/p' kernels/blas.cc)
[[ -n $BLAS_NAME ]] || die "cannot find kLibrary (the OpenBLAS file name) in kernels/blas.cc"
BLAS=/usr/lib/x86_64-linux-gnu/openblas-pthread/$BLAS_NAME
[[ -e $BLAS ]] || die "$BLAS missing (Debian package libopenblas0-pthread)"
cp -L "$BLAS" "$OUT/lib/$BLAS_NAME"
ELFS+=("$BLAS")

# The GEMM library survey, for the GPU machine's CPU kind, where BLIS,
# oneDNN and libxsmm are installed here (else left out: run.sh then skips
# its step). With them installed, a survey that does not build is an error.
BLIS=/usr/lib/x86_64-linux-gnu/libblis.so.4
if [[ -e $BLIS && -e /usr/include/x86_64-linux-gnu/blis-openmp/blis.h &&
  -e /usr/include/dnnl.hpp && -e /usr/include/libxsmm.h ]]; then
  tools/gemm_libs/build.sh "$OUT/bin/gemm_libs" >"$OUT/gemm_libs_build.log" 2>&1 ||
    die "tools/gemm_libs/build.sh failed: $(tail -n 3 "$OUT/gemm_libs_build.log")"
  rm "$OUT/gemm_libs_build.log"
  cp -L "$BLIS" "$OUT/lib/libblis.so.4"
  ELFS+=("$OUT/bin/gemm_libs" "$BLIS")
else
  echo "gpu_bundle: leaving out gemm_libs (needs: apt-get install -y libblis-dev libdnnl-dev libxsmm-dev)" >&2
fi

# Everything ldd lists, but what the GPU machine has: glibc, the compiler's
# runtime, and the CUDA driver/runtime libraries.
SKIP='^(linux-vdso|ld-linux|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcufft|libcurand|libcusolver|libcusparse|libcupti|libnccl|libnvrtc|libnvJitLink|libnvidia-.*)\.so'
missing=()
while read -r name arrow path _; do
  [[ $arrow == "=>" ]] || continue
  [[ $name =~ $SKIP ]] && continue
  if [[ $path == not ]]; then
    missing+=("$name")
    continue
  fi
  if [[ -e $OUT/lib/$name ]]; then
    cmp -s "$path" "$OUT/lib/$name" || die "two different $name: $path and another"
  else
    cp -L "$path" "$OUT/lib/$name"
  fi
done < <(for f in "${ELFS[@]}"; do ldd "$f"; done | sort -u)
((${#missing[@]} == 0)) || die "ldd cannot find: ${missing[*]}"
chmod -R u+w "$OUT"

cp examples/digits.json "$OUT/examples/"
cp examples/digits/*.npy "$OUT/examples/digits/"
cp tools/bench_gpu_mlp.py tools/bench_inference.py tools/bench_cpu_step.py \
  tools/gpu_compare.py "$OUT/tools/"
cp tools/gpu_bundle_run.sh "$OUT/run.sh"
chmod +x "$OUT/run.sh" "$OUT/tools/"*.py

commit=$(git rev-parse HEAD)
git diff --quiet HEAD -- . 2>/dev/null || commit="$commit (+ uncommitted changes)"
{
  echo "trainyard GPU bundle"
  echo "commit: $commit"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version | tail -1)"
  echo "targets: ${TESTS[*]} ${TOOLS[*]} ${PLUGINS[*]}"
  echo
  echo "files (sha256, path):"
  (cd "$OUT" && find . -type f ! -name MANIFEST.txt | sort | xargs sha256sum)
} >"$OUT/MANIFEST.txt"

echo "gpu_bundle: $(du -sh "$OUT" | cut -f1) in $((SECONDS - START)) s (repo $REPO)"
echo "$OUT"
