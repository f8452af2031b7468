#!/usr/bin/env bash
# launch/device_kit.sh -- run prebuilt kiln binaries on a GPU machine that can install nothing.
#
# The GPU machines lent to this project (docs/benchmarks.md, "GPU") have python3 with torch
# 2.11.0+cu130 and the CUDA / NCCL libraries of its pip packages, but no package registry, no Open
# MPI and none of kiln's build dependencies. Instead of building there, `pack` collects here, into
# the ignored folder .devkit/ (carried to the machine, ~13 MiB), what the torch wheel does not
# provide: the kiln binaries and an Open MPI 4.1 runtime extracted from Debian's .debs. The
# subcommands after it run there, from any path: they point LD_LIBRARY_PATH, PATH and Open MPI's
# relocation variables at the kit and at python3's torch/lib and site-packages/nvidia/*/lib.
#
#   bash launch/device_kit.sh pack [BUILD_DIR]        here: assemble .devkit/ from BUILD_DIR (default
#                                                      build/, a CUDA-enabled LibTorch build); needs
#                                                      apt-get (downloads the .debs once, then cached)
#   bash launch/device_kit.sh check                   there: does every carried binary and Open MPI
#                                                      plugin load, where from, is a GPU visible
#   bash launch/device_kit.sh run CMD...              there: CMD with the kit's environment; `kiln`,
#                                                      `mpirun` and `kiln_adamw_bench` are on PATH
#   bash launch/device_kit.sh run-gpu-tests [LOGDIR]  there: the five `gpu` ctest tests, run directly;
#                                                      PASS / FAIL / SKIP each; exit 1 if any failed
#   bash launch/device_kit.sh session OUTDIR [FIRST [LAST]]
#                                                      there: check, the gpu tests, then the benchmark
#                                                      runs of docs/benchmarks.md, in order, each under
#                                                      a time limit; writes OUTDIR/{session.log,
#                                                      env.txt,results.tar} (3 files). Steps are
#                                                      numbered from 0 (the tests); FIRST..LAST picks.
#   bash launch/device_kit.sh quick OUTDIR            there: the 15-minute visit (issue 33), one call
#                                                      of timeout_s 590: check, gpu.kernels and
#                                                      gpu.kernels_train (issue 49), gpt2-124m and
#                                                      llama3-1b with --kernels fused and reference
#                                                      against their PyTorch peers (core limits:
#                                                      560 s), then extras while they fit in
#                                                      KILN_DEVKIT_BUDGET (540 s): the fused 124m
#                                                      profile, gpt2-1.5b A/B, issue 48's GPU checks,
#                                                      the other gpu tests;
#                                                      OUTDIR/{session.log,env.txt,results.tar,
#                                                      trace.json.gz}, the tar rewritten per step.
#
# Environment: KILN_DEVKIT (kit folder, default <repo>/.devkit), KILN_PYTHON (the python3 whose
# torch to use, default python3), KILN_DEVKIT_CACHE (where pack keeps the .debs, default
# ~/.cache/kiln-devkit), KILN_DEVKIT_TEST_TIMEOUT (s per gpu test, default 240),
# KILN_DEVKIT_STEP_TIMEOUT (s per benchmark run; default: each run's own, 120-570 s),
# KILN_DEVKIT_ALLOW_NO_GPU=1 (let `session` and `quick` run without a GPU: for checking the script
# itself), KILN_DEVKIT_BUDGET (s: quick's extra steps start only while they end within it, default
# 540), KILN_DEVKIT_QUICK_MODEL (rehearsal: quick's models replaced by this one, e.g. tiny; the
# Llama ones by KILN_DEVKIT_QUICK_LLAMA, default tiny-llama).
# Any failure ends with one line "device_kit: error: ..." on stderr and a non-zero exit.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kit="${KILN_DEVKIT:-$root/.devkit}"
say() { echo "[device_kit] $*" >&2; }
die() { echo "device_kit: error: $*" >&2; exit 1; }

# Debian 12 (bookworm) packages holding Open MPI's runtime and what it links that a non-Debian
# image may lack. zlib1g and libudev1 go to fallback/SONAME/, used only where the machine has none.
debs=(libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libevent-core-2.1-7
      libevent-pthreads-2.1-7 libmunge2 libnl-3-200 zlib1g libudev1)
fallback_re='^(libz\.so\.1|libudev\.so\.1)$'
# Libraries every image that runs torch has (glibc, the GCC runtime) ...
base_re='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libutil\.so\.1|ld-linux-x86-64\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
# ... and those python3's torch wheel brings (torch/lib and site-packages/nvidia/*/lib).
torch_re='^(libtorch.*|libc10.*|libcudart\.so\..*|libnccl\.so\..*|libgomp\.so\..*|libcuda\.so\..*)$'
# Debian's Open MPI layout, rebuilt under $kit/ompi.
multiarch=x86_64-linux-gnu
ompi_lib=usr/lib/$multiarch                       # libmpi.so.40 & co., and every other library
ompi_plugins=usr/lib/$multiarch/openmpi/lib/openmpi3
pmix_dir=usr/lib/$multiarch/pmix2

needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

# ==== pack (here) ==============================================================================
# stage_resolve PATH: follow symlinks inside the staging root (absolute targets are re-rooted).
stage_resolve() {
  local f=$1 t n=0
  while [ -L "$f" ] && [ $n -lt 20 ]; do
    t=$(readlink "$f")
    case "$t" in /*) f="$stage$t" ;; *) f="$(dirname "$f")/$t" ;; esac
    n=$((n + 1))
  done
  [ -f "$f" ] && echo "$f"
}

# find_in_stage SONAME: the staged file that provides SONAME (empty if none).
find_in_stage() {
  local c
  while IFS= read -r c; do
    stage_resolve "$c" && return 0
  done < <(awk -F'\t' -v n="$1" '$1 == n {print $2}' "$stage.index")
  return 0
}

# closure FILE...: every library the files need that neither the base system nor torch provides;
# prints "soname<TAB>staged path" or "soname<TAB>-" when no staged package has it.
closure() {
  local -A seen=()
  local queue=("$@") f so p
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    while IFS= read -r so; do
      if [ -z "$so" ] || [ -n "${seen[$so]:-}" ]; then continue; fi
      seen[$so]=1
      if [[ $so =~ $base_re || $so =~ $torch_re ]]; then continue; fi
      p=$(find_in_stage "$so")
      if [ -n "$p" ]; then printf '%s\t%s\n' "$so" "$p"; queue+=("$p"); else printf '%s\t-\n' "$so"; fi
    done < <(needed "$f")
  done
}

pack() {
  local build="${1:-$root/build}"
  [ -d "$build" ] || die "no build directory $build (build kiln first: bash launch/setup.sh build)"
  build=$(cd "$build" && pwd)
  for t in readelf strip dpkg dpkg-deb apt-get sha256sum; do
    command -v "$t" >/dev/null || die "pack needs '$t' (a Debian machine with binutils and apt)"
  done
  local bins=("$build/kiln" "$build/kiln_adamw_bench" "$build/tests/test_comm_nccl" "$build/tests/test_kernels_gpu")
  for b in "${bins[@]}"; do [ -x "$b" ] || die "missing $b (need a CUDA-enabled build: ${bins[*]})"; done
  # libc10_cuda.so: a CUDA build (libtorch_cuda.so itself is loaded at run time, distributed/cuda_backend.h)
  needed "$build/kiln" | grep -qx 'libc10_cuda.so' || die "$build/kiln is not linked against libc10_cuda.so (a CPU-only LibTorch build)"
  local t0=$SECONDS

  # The kit must stay out of git: an anchored pattern in the shared info/exclude covers every
  # worktree of this repository.
  if git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
    local common; common=$(git -C "$root" rev-parse --git-common-dir)
    case "$common" in /*) ;; *) common="$root/$common" ;; esac
    mkdir -p "$common/info"
    grep -qxF '/.devkit/' "$common/info/exclude" 2>/dev/null || echo '/.devkit/' >>"$common/info/exclude"
  fi

  # 1. the .debs: the version installed here (what kiln was linked against), else apt's candidate
  local cache="${KILN_DEVKIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln-devkit}"
  local apt_opts=(-q -o APT::Sandbox::User=root) updated=0 p v d debfiles=()
  [ "$(id -u)" -eq 0 ] || apt_opts=(-q)
  mkdir -p "$cache"
  for p in "${debs[@]}"; do
    v=$(dpkg-query -W -f='${Version}' "$p:amd64" 2>/dev/null || dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
    [ -n "$v" ] || v=$(apt-cache policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
    if [ -z "$v" ] || [ "$v" = "(none)" ]; then die "apt knows no version of $p (run apt-get update?)"; fi
    d="$cache/$p-${v//:/_}"
    if ! ls "$d"/*.deb >/dev/null 2>&1; then
      mkdir -p "$d"
      if ! (cd "$d" && apt-get "${apt_opts[@]}" download "$p=$v" >/dev/null 2>&1); then
        if [ $updated -eq 0 ]; then say "apt-get download $p=$v failed: apt-get update, then again"
          apt-get -qq update >/dev/null 2>&1 || true; updated=1; fi
        (cd "$d" && apt-get "${apt_opts[@]}" download "$p=$v" >/dev/null) || die "apt-get download $p=$v failed"
      fi
    fi
    local got=("$d"/*.deb); debfiles+=("${got[0]}")
  done

  # 2. unpack into a staging root (never into /)
  stage=$(mktemp -d "${TMPDIR:-/tmp}/kiln-devkit-stage.XXXXXX")
  tmpkit="$kit.tmp.$$"
  trap 'rm -rf "$stage" "$stage.index" "$tmpkit"' EXIT
  for d in "${debfiles[@]}"; do dpkg -x "$d" "$stage"; done
  find "$stage" \( -type f -o -type l \) -printf '%f\t%p\n' >"$stage.index"

  # 3. the kit: binaries (stripped copies), Open MPI's programs, plugins and data files
  rm -rf "$tmpkit"; mkdir -p "$tmpkit/bin" "$tmpkit/fallback" "$tmpkit/ompi/usr/bin" \
    "$tmpkit/ompi/$ompi_lib" "$tmpkit/ompi/$ompi_plugins" "$tmpkit/ompi/$pmix_dir/lib/pmix" \
    "$tmpkit/ompi/usr/share" "$tmpkit/ompi/etc"
  for b in "${bins[@]}"; do
    cp "$b" "$tmpkit/bin/"; strip --strip-unneeded "$tmpkit/bin/$(basename "$b")"
  done
  for b in orterun orted ompi_info; do
    [ -f "$stage/usr/bin/$b" ] || die "$b is not in the Open MPI packages"
    cp "$stage/usr/bin/$b" "$tmpkit/ompi/usr/bin/"
  done
  cp "$stage/usr/bin/orterun" "$tmpkit/ompi/usr/bin/mpirun"   # Debian: mpirun -> mpirun.openmpi -> orterun
  cp "$stage/usr/bin/orterun" "$tmpkit/ompi/usr/bin/mpiexec"
  cp -rL "$stage/usr/share/openmpi" "$tmpkit/ompi/usr/share/"
  rm -f "$tmpkit"/ompi/usr/share/openmpi/*-wrapper-data.txt        # for the compiler wrappers only
  cp -rL "$stage/etc/openmpi" "$tmpkit/ompi/etc/"
  [ -d "$stage/$pmix_dir/share/pmix" ] && { mkdir -p "$tmpkit/ompi/$pmix_dir/share"; cp -rL "$stage/$pmix_dir/share/pmix" "$tmpkit/ompi/$pmix_dir/share/"; }

  # Plugins (dlopened): keep those whose libraries all resolve; drop the rest (InfiniBand, UCX,
  # libfabric, PSM: their libraries are not carried and a one-GPU machine has no such fabric).
  local plugin so path dropped=() kept=0 missing
  for plugin in "$stage/$ompi_plugins"/*.so "$stage/$pmix_dir/lib/pmix"/*.so; do
    case "$(basename "$plugin")" in   # OpenSHMEM's frameworks: kiln is an MPI program
      mca_atomic_*|mca_memheap_*|mca_scoll_*|mca_spml_*|mca_sshmem_*) dropped+=("$(basename "$plugin") (OpenSHMEM)"); continue ;;
    esac
    missing=$(closure "$plugin" | awk -F'\t' '$2 == "-" {print $1}' | tr '\n' ' ')
    if [ -n "$missing" ]; then dropped+=("$(basename "$plugin") (${missing% })"); continue; fi
    case "$plugin" in
      */pmix/*) cp "$plugin" "$tmpkit/ompi/$pmix_dir/lib/pmix/" ;;
      *) cp "$plugin" "$tmpkit/ompi/$ompi_plugins/" ;;
    esac
    kept=$((kept + 1))
  done
  # Libraries: the closure of everything carried, each under its soname (no symlinks in the kit).
  local roots=("$tmpkit"/bin/* "$tmpkit"/ompi/usr/bin/orterun "$tmpkit"/ompi/usr/bin/orted
               "$tmpkit"/ompi/usr/bin/ompi_info "$tmpkit/ompi/$ompi_plugins"/*.so
               "$tmpkit/ompi/$pmix_dir/lib/pmix"/*.so)
  local libs; libs=$(closure "${roots[@]}" | sort -u)
  missing=$(awk -F'\t' '$2 == "-" {print $1}' <<<"$libs" | tr '\n' ' ')
  [ -z "$missing" ] || die "no package in (${debs[*]}) provides: $missing"
  while IFS=$'\t' read -r so path; do
    if [[ $so =~ $fallback_re ]]; then mkdir -p "$tmpkit/fallback/$so"; cp "$path" "$tmpkit/fallback/$so/$so"; else cp "$path" "$tmpkit/ompi/$ompi_lib/$so"; fi
  done <<<"$libs"

  # 4. the manifest: what was built from what, and what it needs from the machine
  local src torch_version elfs glibc glibcxx
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
  torch_version=$(sed -n 's/^Torch_DIR:PATH=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
  torch_version=$(sed -n "s/^__version__ = '\(.*\)'/\1/p" "$torch_version/../../../version.py" 2>/dev/null || true)
  elfs=$(find "$tmpkit" -type f \( -name '*.so*' -o -path '*/bin/*' \))
  glibc=$(for f in $elfs; do readelf -V --wide "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*[0-9]' | sed "s|\$| $(basename "$f")|"; done | sort -V | tail -n 1)
  # shellcheck disable=SC2086
  glibcxx=$(readelf -V --wide $elfs 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*[0-9]' | sort -u -V | tail -n 1)
  {
    echo "kiln device kit -- made by launch/device_kit.sh pack"
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname) ($(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(uname -m))"
    echo "build dir: $build"
    if [ -n "$src" ] && git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
      echo "source: $src at commit $(git -C "$src" rev-parse HEAD)$( [ -z "$(git -C "$src" status --porcelain --untracked-files=no)" ] || echo ' (uncommitted changes)')"
    fi
    echo "torch built against: ${torch_version:-unknown}"
    echo "needs from the machine: glibc >= ${glibc#GLIBC_} (for the file named), libstdc++ with ${glibcxx:-?}, python3 with torch ${torch_version:-?} and its nvidia/*/lib"
    echo
    echo "binaries (stripped copies; sha256 of the build's originals):"
    for b in "${bins[@]}"; do echo "  $(basename "$b")  $(sha256sum "$b" | cut -c1-16)  built $(date -u -r "$b" +%Y-%m-%dT%H:%M:%SZ)"; done
    echo
    echo "Debian packages unpacked:"
    for d in "${debfiles[@]}"; do echo "  $(dpkg-deb -f "$d" Package)=$(dpkg-deb -f "$d" Version)"; done
    echo
    echo "libraries carried (ompi/$ompi_lib, fallback/SONAME/):"
    while IFS=$'\t' read -r so path; do echo "  $so  <- ${path#"$stage"}"; done <<<"$libs"
    echo
    echo "Open MPI / PMIx plugins carried: $kept; dropped (OpenSHMEM, or needing libraries not carried):"
    for d in "${dropped[@]}"; do echo "  $d"; done
    echo
    echo "ldd kiln, here:"
    ldd "$build/kiln" | sed 's/^/ /'
  } >"$tmpkit/MANIFEST.txt"

  rm -rf "$kit"; mv "$tmpkit" "$kit"
  local newer=""
  if [ -n "$src" ]; then
    newer=$(find "$src"/{distributed,runtime,models,parallel,optim,data,launch,plan,tests} -name '*.[ch]pp' -newer "$build/kiln" 2>/dev/null | head -n 3 | tr '\n' ' ' || true)
  fi
  [ -z "$newer" ] || say "warning: sources newer than $build/kiln: $newer(rebuild before packing?)"
  local bytes; bytes=$(du -sb "$kit" | cut -f1)
  say "packed $kit: $(awk -v b="$bytes" 'BEGIN {printf "%.1f MiB", b / 1048576}'), $(find "$kit" -type f | wc -l) files, in $((SECONDS - t0)) s"
  [ "$bytes" -le $((40 * 1048576)) ] || say "warning: the kit is over 40 MiB (64 MiB travel with the whole working tree)"
}

# ==== there: the environment ===================================================================
gpu_line=""
kit_env() {
  [ -f "$kit/MANIFEST.txt" ] || die "no kit at $kit: run 'bash launch/device_kit.sh pack' where kiln was built and carry .devkit"
  [ -n "${KILN_DEVKIT_ENV:-}" ] && return 0
  chmod +x "$kit"/bin/* "$kit"/ompi/usr/bin/* 2>/dev/null || true   # in case a copy dropped the mode
  local py="${KILN_PYTHON:-python3}" out
  command -v "$py" >/dev/null || die "no $py on PATH (set KILN_PYTHON to the python3 that has torch)"
  # torch/lib, then every site-packages/nvidia/*/lib beside it (CUDA runtime, NCCL, cuBLAS, ...)
  out=$("$py" - <<'PY' 2>&1
import glob, os, torch
d = os.path.dirname(torch.__file__)
print(torch.__version__)
print(":".join([os.path.join(d, "lib")] + sorted(glob.glob(os.path.join(os.path.dirname(d), "nvidia", "*", "lib")))))
PY
) || die "$py cannot import torch: $(tail -n 1 <<<"$out")"
  local torch_version torch_libs want
  torch_version=$(sed -n 1p <<<"$out"); torch_libs=$(sed -n 2p <<<"$out")
  want=$(sed -n 's/^torch built against: //p' "$kit/MANIFEST.txt")
  [ "$want" = "$torch_version" ] || say "warning: the kit was built against torch $want, $py has $torch_version: kiln may fail to load (undefined symbols)"

  local libpath="$kit/ompi/$ompi_lib:$torch_libs" so have ldc
  # fallback/SONAME/: only for a library this machine lacks (a folder on LD_LIBRARY_PATH would
  # shadow the machine's own copy)
  ldc=""
  for so in ldconfig /sbin/ldconfig /usr/sbin/ldconfig; do ldc=$(command -v "$so" || true); [ -z "$ldc" ] || break; done
  for so in "$kit"/fallback/*; do
    [ -d "$so" ] || continue
    have=$( [ -z "$ldc" ] || "$ldc" -p 2>/dev/null | awk -v n="$(basename "$so")" '$1 == n && $NF ~ /^\// {print $NF}' | head -n 1 || true)
    if [ -z "$have" ] || [ ! -s "$have" ]; then libpath="$libpath:$so"; say "using the kit's $(basename "$so") (none on this machine)"; fi
  done
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$kit/bin:$kit/ompi/usr/bin:$PATH"
  # Open MPI 4.1 relocates through OPAL_PREFIX (bindir, libdir, its plugins, share/openmpi), but
  # Debian's sysconfdir (/etc/openmpi) is not under the prefix and needs its own variable. PMIx,
  # mpirun's launch server, takes only its plugin path (PMIX_PREFIX does not move it).
  local o="$kit/ompi"
  export OPAL_PREFIX="$o/usr" OPAL_SYSCONFDIR="$o/etc/openmpi" \
    PMIX_MCA_mca_base_component_path="$o/$pmix_dir/lib/pmix"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # The GPU image has a PMIx of its own whose zlib plugin fails to load beside the kit's PMIx:
  # harmless (no compression of launch messages on one node), but a 10-line banner per mpirun.
  export PMIX_MCA_pcompress_base_silence_warning=1
  # One node and no ssh/rsh agent on the GPU machine: mpirun's default launcher (rsh) aborts at
  # start-up looking for one; the isolated launcher starts the ranks itself, on this node only.
  export OMPI_MCA_plm="${OMPI_MCA_plm:-isolated}"
  # Binding off: mpirun binds each rank to one core by default (2 ranks or fewer), which leaves
  # the host AdamW of --offload one thread; kiln divides the cores among a node's ranks itself
  # (distributed/host_threads.h; the config record's host_threads says what each rank got).
  export OMPI_MCA_hwloc_base_binding_policy="${OMPI_MCA_hwloc_base_binding_policy:-none}"
  # Shared-memory transport without cross-process memory attach (refused in some sandboxes).
  export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
  export HWLOC_PLUGINS_PATH="$o/hwloc-plugins"        # none: not the machine's, of another version
  export KILN_BIN="$kit/bin/kiln" MPIEXEC="$o/usr/bin/mpirun" KILN_DEVKIT_ENV=1
}

# preflight FILE...: each must load here; names the missing libraries (or versions) if not.
preflight() {
  local f bad=""
  if ! command -v ldd >/dev/null; then say "no ldd here: cannot check the libraries before running"; return 0; fi
  for f in "$@"; do
    local nf; nf=$(ldd "$f" 2>&1 | grep -E 'not found|too short|wrong ELF' | sed 's/^[[:space:]]*//' | sort -u | tr '\n' ';' || true)
    [ -z "$nf" ] || bad+=" $(basename "$f"): ${nf%;};"
  done
  [ -z "$bad" ] || die "carried binaries cannot load here:$bad (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
}

gpu_probe() {   # sets gpu_line; returns 1 without a usable CUDA GPU
  local smi="" cuda
  if command -v nvidia-smi >/dev/null; then smi=$(nvidia-smi -L 2>&1 | head -n 2 | tr '\n' ' ') || true; else smi="no nvidia-smi"; fi
  cuda=$("${KILN_PYTHON:-python3}" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0, torch.version.cuda)' 2>&1 | tail -n 1) || true
  if [ "${cuda%% *}" != "0" ] && [ "${cuda%% *}" -gt 0 ] 2>/dev/null; then
    gpu_line="GPU: ${smi% } (torch sees ${cuda%% *}, CUDA ${cuda#* })"; return 0
  fi
  gpu_line="no CUDA GPU visible: nvidia-smi: ${smi% }; torch.cuda.is_available() is False (driver missing or no device)"
  return 1
}

check() {
  kit_env
  preflight "$kit"/bin/* "$kit"/ompi/usr/bin/{orterun,orted,ompi_info} "$kit/ompi/$ompi_plugins"/*.so "$kit/ompi/$pmix_dir/lib/pmix"/*.so
  echo "kit: $kit ($(sed -n 's/^source: //p' "$kit/MANIFEST.txt"))"
  echo "machine: $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-?}"), $(ldd --version 2>/dev/null | head -n 1)"
  echo "python3: $(command -v "${KILN_PYTHON:-python3}")"
  echo "mpirun: $(command -v mpirun)"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "kiln's libraries (ldd):"
  ldd "$KILN_BIN" | grep -E 'libmpi|libopen-|libhwloc|libevent|libpmix|libtorch_cuda|libc10\.|libcudart|libnccl|libcublas\.|libz\.|libudev|libstdc' | sed 's/ (0x.*//; s/^/ /'
  echo "Open MPI install dirs (ompi_info):"
  ompi_info --path all 2>&1 | grep -E 'Prefix|Bindir|Libdir|Pkglibdir|Sysconfdir|Pkgdatadir' | sed 's/^ */  /' | sort -u
  if gpu_probe; then echo "$gpu_line"; else echo "device_kit: $gpu_line"; fi
}

# ==== there: the gpu tests =====================================================================
# one_test NAME LOGDIR CMD...: runs CMD under the test time limit; prints PASS/FAIL/SKIP NAME.
n_pass=0; n_fail=0; n_skip=0
one_test() {
  local name=$1 logdir=$2; shift 2
  local t=$SECONDS rc=0 limit="${KILN_DEVKIT_TEST_TIMEOUT:-240}"
  timeout "$limit" "$@" >"$logdir/$name.log" 2>&1 || rc=$?
  local dt=$((SECONDS - t))
  case $rc in
    0) n_pass=$((n_pass + 1)); echo "PASS $name (${dt} s)" ;;
    77) n_skip=$((n_skip + 1)); echo "SKIP $name (${dt} s): $(grep -m1 -E 'SKIP|skip' "$logdir/$name.log" | cut -c1-200)" ;;
    124) n_fail=$((n_fail + 1)); echo "FAIL $name: timed out after ${limit} s (log: $logdir/$name.log)"; tail -n 20 "$logdir/$name.log" | sed 's/^/    /' ;;
    *) n_fail=$((n_fail + 1)); echo "FAIL $name (exit $rc, ${dt} s; log: $logdir/$name.log)"; tail -n 20 "$logdir/$name.log" | sed 's/^/    /' ;;
  esac
}

# the `gpu` tests of tests/CMakeLists.txt, as ctest runs them: name, then the command
gpu_test_cmd() {
  case $1 in
    gpu.comm_nccl.np1) echo "$MPIEXEC --allow-run-as-root --oversubscribe -n 1 $kit/bin/test_comm_nccl" ;;
    gpu.train_smoke) echo "bash $root/tests/cli/gpu_smoke.sh" ;;
    gpu.paths) echo "bash $root/tests/cli/gpu_paths.sh" ;;
    gpu.mpi_share) echo "bash $root/tests/cli/gpu_mpi_share.sh" ;;
    gpu.sync_moe) echo "bash $root/tests/cli/gpu_sync_moe.sh" ;;
    gpu.llama) echo "bash $root/tests/cli/gpu_llama.sh" ;;
    gpu.guards) echo "bash $root/tests/cli/gpu_guards.sh" ;;
    gpu.kernels) echo "$kit/bin/test_kernels_gpu" ;;
    gpu.kernels_train) echo "bash $root/tests/cli/gpu_kernels.sh" ;;
    gpu.graph) echo "bash $root/tests/cli/gpu_graph.sh" ;;
    *) die "no gpu test $1" ;;
  esac
}
gpu_test_names=(gpu.kernels gpu.kernels_train gpu.graph gpu.comm_nccl.np1 gpu.train_smoke gpu.paths gpu.mpi_share gpu.sync_moe
                gpu.llama gpu.guards)

gpu_tests() {   # LOGDIR
  local logdir=$1 name; mkdir -p "$logdir"
  preflight "$KILN_BIN" "$kit/bin/test_comm_nccl" "$MPIEXEC"
  if gpu_probe; then echo "$gpu_line"; else echo "device_kit: $gpu_line: the gpu tests will report SKIP"; fi
  n_pass=0; n_fail=0; n_skip=0
  for name in "${gpu_test_names[@]}"; do
    # shellcheck disable=SC2046
    one_test "$name" "$logdir" $(gpu_test_cmd "$name")
  done
  echo "gpu tests: $n_pass passed, $n_skip skipped, $n_fail failed (logs in $logdir)"
  [ "$n_fail" -eq 0 ]
}

# ==== there: the session (docs/benchmarks.md, "GPU") ===========================================
# Step 0 is the gpu tests; these follow, in order of device time, each with its time limit in
# seconds (KILN_DEVKIT_STEP_TIMEOUT overrides them all). Keep in step with docs/benchmarks.md.
bench_steps=(
  "240 kiln bench --model gpt2-124m --precision bf16 --sweep --max-micro-batch 64 --json b124.json"
  "120 kiln bench --model gpt2-124m --precision bf16 --micro-batch 16 --loss-chunk-rows -1 --json b124_loss_plain.json"
  "120 kiln bench --model gpt2-124m --precision bf16 --micro-batch 16 --json b124_loss_chunked.json"
  "240 kiln bench --model gpt2-350m --precision bf16 --sweep --max-micro-batch 32 --json b350.json"
  "180 kiln bench --model gpt2-1.5b --precision bf16 --activation-checkpointing full --micro-batch 8 --json b1558.json"
  "300 mpirun -np 1 kiln bench --model gpt2-1.5b --precision bf16 --micro-batch 4 --zero 3 --offload all --activation-checkpointing full --device-memory-cap-gb 24 --json b1558_z3_offload_all_cap24.json"
  "120 mpirun -np 1 kiln bench --model gpt2-124m --precision bf16 --micro-batch 16 --backend nccl --json b124_ddp_nccl.json"
  "120 mpirun -np 1 kiln bench --model gpt2-124m --precision bf16 --micro-batch 16 --zero 1 --json b124_zero1.json"
  "300 mpirun -np 1 kiln bench --model gpt2-1.5b --precision bf16 --micro-batch 8 --zero 3 --offload optimizer --activation-checkpointing full --json b1558_z3_offload_opt.json"
  "570 mpirun -np 1 kiln bench --model gpt3-6.7b --precision bf16 --micro-batch 2 --zero 3 --offload all --activation-checkpointing full --device-memory-cap-gb 32 --json b6700_z3_offload_all_cap32.json"
)

session() {
  local out=${1:?usage: session OUTDIR [FIRST [LAST]]} first=${2:-0} last=${3:-${#bench_steps[@]}}
  [[ $first =~ ^[0-9]+$ && $last =~ ^[0-9]+$ ]] || die "session: FIRST and LAST are step numbers (0-${#bench_steps[@]})"
  mkdir -p "$out"; out=$(cd "$out" && pwd)
  # Logs and JSON go to a folder outside OUTDIR, tarred into it after every step: a device call
  # returns at most 8 files from $OUT, and whatever is there if the call is stopped at its limit.
  local work; work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-session.XXXXXX")
  exec > >(tee -a "$out/session.log") 2>&1
  kit_env
  { check; echo; cat "$kit/MANIFEST.txt"; nvidia-smi 2>&1 || true; } >"$out/env.txt" 2>&1 || die "the kit's check failed: $(tail -n 1 "$out/env.txt")"
  if ! gpu_probe; then
    [ -n "${KILN_DEVKIT_ALLOW_NO_GPU:-}" ] || die "$gpu_line; nothing measured"
    echo "device_kit: $gpu_line (KILN_DEVKIT_ALLOW_NO_GPU: going on)"
  else echo "$gpu_line"; fi
  local i rc failed=0 t limit cmd
  for ((i = first; i <= last; i++)); do
    echo "== step $i of ${#bench_steps[@]} ($(date -u +%H:%M:%S)); if the call stops here, resume with: session OUTDIR $i"
    rc=0; t=$SECONDS
    if [ "$i" -eq 0 ]; then
      gpu_tests "$work/tests" || rc=$?
    else
      cmd=${bench_steps[$((i - 1))]#* }; limit=${KILN_DEVKIT_STEP_TIMEOUT:-${bench_steps[$((i - 1))]%% *}}
      echo "\$ $cmd    (limit $limit s)"
      # shellcheck disable=SC2086
      (cd "$work" && timeout "$limit" $cmd) 2>&1 | tee "$work/step$i.log" || rc=$?
      case $rc in 0) ;; 124) echo "FAIL step $i: timed out after $limit s" ;; *) echo "FAIL step $i: exit $rc" ;; esac
    fi
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    echo "== step $i: exit $rc, $((SECONDS - t)) s"
    tar -C "$work" -cf "$out/results.tar" . 2>/dev/null || true
  done
  echo "session: steps $first..$last done, $failed failed; results in $out/results.tar (logs, JSON), $out/env.txt"
  [ "$failed" -eq 0 ] || die "$failed step(s) failed (see above)"
}

# ==== there: the 15-minute visit (issue 33) ====================================================
# One device call of timeout_s 560 (docs/benchmarks.md, "GPU"). Each step is "LIMIT|NAME|COMMAND",
# ordered by value; COMMAND runs under bash in the work folder with the kit's environment, and
# every step's log and JSON are tarred into OUTDIR/results.tar as it ends, so a call cut at its
# limit still returns what ran. The core steps' limits add up to 500 s (the issue's 8.5 minutes at
# most); after them, each extra step starts only while its limit still ends within the budget.
quick_core=()
quick_extra=()
quick_plan() {
  local a=gpt2-124m b=gpt2-1.5b l=llama3-1b peer="${KILN_PYTHON:-python3} $root/bench/pytorch_gpt2.py"
  local lpeer="${KILN_PYTHON:-python3} $root/bench/pytorch_llama.py"
  if [ -n "${KILN_DEVKIT_QUICK_MODEL:-}" ]; then a=$KILN_DEVKIT_QUICK_MODEL; b=$KILN_DEVKIT_QUICK_MODEL; l=${KILN_DEVKIT_QUICK_LLAMA:-tiny-llama}; fi
  local k124="kiln bench --model $a --precision bf16 --micro-batch 16"
  local k1558="kiln bench --model $b --precision bf16 --warmup 2 --measure 5"
  # llama3-1b at the peer's shape: context 2048, micro-batch 8 (16K tokens a step, as 124m's)
  local kl="kiln bench --model $l --precision bf16 --seq-len 2048 --micro-batch 8 --warmup 2 --measure 5"
  local lp="$lpeer --model $l --seq-len 2048 --micro-batch 8"
  # fp8 (issue 52): the blocks' products in float8, the default size filter; llama3-8b's shape cut
  # to 4 layers (its per-layer speed is the 8B model's)
  local k8="kiln bench --precision fp8 --kernels fused --warmup 2 --measure 5"
  local k8l="kiln bench --model llama3-8b --n-layer 4 --seq-len 2048 --micro-batch 2 --kernels fused --warmup 2 --measure 5"
  if [ -n "${KILN_DEVKIT_QUICK_MODEL:-}" ]; then k8l="kiln bench --model $l --kernels fused --warmup 2 --measure 5"; fi
  # Issue 49 first: the kernels against their references, then the A/B (fused vs reference) with
  # both peers, eager and compiled, in the same call; then issue 52's fp8 (the one open issue, its
  # GPU checks its last item: gpu.fp8, then fp8 against bf16 at gpt2-1.5b and llama3-8b's layer),
  # issue 48's checks and the rest after.
  quick_core=(
    "75|test gpu.kernels|"
    "140|test gpu.kernels_train|"
    "35|kiln 124m fused|$k124 --kernels fused --json b124.json"
    "35|kiln 124m reference|$k124 --kernels reference --json b124_reference.json"
    "85|peer compile|$peer --model $a --micro-batch 16 --warmup-steps 3 --steps 20 --compile > peer_compile.json"
    "45|kiln llama3-1b fused|$kl --kernels fused --json bl1b.json"
    "45|kiln llama3-1b reference|$kl --kernels reference --json bl1b_reference.json"
    "100|peer llama compile|$lp --warmup-steps 3 --steps 10 --compile > peer_llama_compile.json"
  )
  quick_extra=(
    "140|test gpu.fp8 (issue 52: float8 on CUDA, both recipes, against bf16, the CPU, CUDA graphs and ZeRO-3's 8-bit gather)|"
    "45|kiln 1.5b fused, no AC|$k1558 --micro-batch 8 --kernels fused --json b1558_ac_none.json"
    "45|kiln 1.5b fp8, no AC (issue 52: >= 1.25x 'kiln 1.5b fused, no AC')|$k8 --model $b --micro-batch 8 --json b1558_fp8.json"
    "45|kiln 1.5b fp8 reference, no AC (issue 52: kernels/float8.cu's share, against 'kiln 1.5b reference, no AC')|${k8/--kernels fused/--kernels reference} --model $b --micro-batch 8 --json b1558_fp8_reference.json"
    "50|kiln llama3-8b's layer x4, bf16 (issue 52's shape)|$k8l --precision bf16 --json bl8b4_bf16.json"
    "50|kiln llama3-8b's layer x4, fp8 (issue 52: >= 1.25x bf16)|$k8l --precision fp8 --json bl8b4_fp8.json"
    "50|kiln llama3-8b's layer x4, fp8 rowwise (issue 52)|$k8l --precision fp8 --fp8-recipe rowwise --json bl8b4_fp8_rowwise.json"
    "100|gpt2-124m 500 steps, fp8 (every block layer) against bf16 (issue 52: the last-10 mean loss within 1%)|for p in bf16 fp8; do kiln train --device cuda --model gpt2-124m --micro-batch 8 --steps 500 --log-every 50 --kernels fused --precision \$p --fp8-filter all --log-json t124_\$p.jsonl > /dev/null || exit 1; done"
    "45|kiln 1.5b fp8 rowwise, no AC (issue 52)|$k8 --fp8-recipe rowwise --model $b --micro-batch 8 --json b1558_fp8_rowwise.json"
    "35|kiln 124m fused + GELU epilogue|$k124 --kernels fused --gelu-epilogue --json b124_gelu_epilogue.json"
    "30|peer eager|$peer --model $a --micro-batch 16 --warmup-steps 5 --steps 20 > peer_eager.json"
    "60|test gpu.graph|"
    "35|kiln 124m fused, CUDA graphs (issue 49)|$k124 --kernels fused --cuda-graph --json b124_graph.json"
    "30|kiln 124m fused, bf16 logits (the A/B of --logits-dtype)|$k124 --kernels fused --logits-dtype bf16 --json b124_logits_bf16.json"
    "30|kiln 124m fused, fp32 main grads (the A/B of --main-grads auto)|$k124 --kernels fused --main-grads always --json b124_main_grads_always.json"
    "35|profile of 124m fused|$k124 --kernels fused --warmup 3 --measure 3 --profile trace.json --json b124_profiled.json"
    "45|peer llama eager|$lp --warmup-steps 3 --steps 10 > peer_llama_eager.json"
    "45|kiln 1.5b reference, no AC|$k1558 --micro-batch 8 --kernels reference --json b1558_ac_none_reference.json"
    "45|kiln llama3-1b fp8 (issue 52)|$kl --kernels fused --precision fp8 --json bl1b_fp8.json"
    "60|test gpu.sync_moe|"
    "45|test gpu.guards|"
    "100|pp 4 bubble on the host's cores (issues 36, 48)|for s in '--pp-schedule 1f1b' '--pp-schedule zb-h1' '--pp-virtual 2'; do OMP_NUM_THREADS=1 timeout 40 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 -x OMP_NUM_THREADS kiln train --device cpu --model tiny --n-layer 8 --d-model 256 --n-head 4 --steps 25 --log-every 100 --micro-batch 2 --grad-accum 8 --pp 4 \$s --log-json \"pp4_\${s##* }.jsonl\" || exit 1; done"
    "100|test gpu.paths|"
    "30|kiln 124m fp32 weights under autocast (the peer's recipe)|$k124 --param-dtype fp32 --json b124_param_fp32.json"
    "45|test gpu.train_smoke|"
    "80|test gpu.mpi_share|"
    "30|test gpu.comm_nccl.np1|"
    "45|kiln 1.5b full AC|$k1558 --activation-checkpointing full --micro-batch 8 --json b1558.json"
    "60|kiln 1.5b ZeRO-3 offload all, 24 GB cap|mpirun -np 1 $k1558 --activation-checkpointing full --micro-batch 8 --zero 3 --offload all --device-memory-cap-gb 24 --warmup 1 --measure 3 --json b1558_z3_offload_all_cap24.json"
    "60|kiln 1.5b ZeRO-3 offload optimizer (issue 50: >= 70% of full AC)|mpirun -np 1 $k1558 --activation-checkpointing full --micro-batch 8 --zero 3 --offload optimizer --warmup 1 --measure 3 --json b1558_z3_offload_optimizer.json"
    "60|kiln 1.5b ZeRO-3 offload optimizer, delayed update (issue 50)|mpirun -np 1 $k1558 --activation-checkpointing full --micro-batch 8 --zero 3 --offload optimizer --offload-delayed-update --warmup 1 --measure 3 --json b1558_z3_offload_optimizer_delayed.json"
    "30|kiln 124m plain loss|$k124 --loss-chunk-rows -1 --json b124_loss_plain.json"
  )
}

quick_summary() {   # WORK: one table of what ran, kiln against the peer
  "${KILN_PYTHON:-python3}" - "$1" <<'PY' || true
import glob, json, os, sys
w = sys.argv[1]
def load(n):
    try:
        r = json.load(open(os.path.join(w, n)))
    except Exception:
        return None
    return r.get("best") or (r["runs"][0] if r.get("runs") else None) if r.get("type") == "bench" else r
rows = []
for n in sorted(glob.glob(os.path.join(w, "*.json"))):
    r = load(os.path.basename(n))
    if not r or r.get("tokens_per_s") is None:
        continue
    name = os.path.basename(n)[:-5]
    mfu = r.get("mfu")
    rows.append((name, r["tokens_per_s"], r.get("tflops"), mfu, r.get("peak_mem_gb"), r.get("joules_per_token")))
    print(f"{name:34s} {r['tokens_per_s']:10.0f} tok/s  {r.get('tflops') or 0:7.1f} TFLOP/s  MFU {100 * (mfu or 0):5.1f}%  "
          f"peak {r.get('peak_mem_gb') or 0:6.2f} GB  J/token {r.get('joules_per_token') if r.get('joules_per_token') is not None else '-'}")
t = {r[0]: r[1] for r in rows}
for a, b in [("b124", "b124_reference"), ("b124_gelu_epilogue", "b124"), ("b124", "b124_main_grads_always"), ("b124_logits_bf16", "b124"), ("b124_graph", "b124"), ("b124_graph", "peer_compile"), ("b124", "peer_eager"), ("b124", "peer_compile"),
             ("b124_reference", "peer_compile"), ("bl1b", "bl1b_reference"), ("bl1b", "peer_llama_eager"),
             ("bl1b", "peer_llama_compile"), ("b1558_ac_none", "b1558_ac_none_reference"), ("b124", "b124_loss_plain"),
             ("b1558_z3_offload_all_cap24", "b1558"), ("b1558_z3_offload_optimizer", "b1558"),
             ("b1558_z3_offload_optimizer_delayed", "b1558")]:
    if a in t and b in t:
        print(f"ratio {a} / {b}: {t[a] / t[b]:.3f}")
PY
}

quick() {
  local out=${1:?usage: quick OUTDIR}
  local budget=${KILN_DEVKIT_BUDGET:-540} start=$SECONDS
  mkdir -p "$out"; out=$(cd "$out" && pwd)
  local work; work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-quick.XXXXXX")
  exec > >(tee -a "$out/session.log") 2>&1
  echo "quick: $(date -u +%Y-%m-%dT%H:%M:%SZ), budget $budget s"
  kit_env
  local t=$SECONDS
  { timeout 20 bash "$0" check; echo; cat "$kit/MANIFEST.txt"; nvidia-smi 2>&1 || true; } >"$out/env.txt" 2>&1 \
    || die "the kit's check failed: $(grep -m1 'error' "$out/env.txt" || tail -n 1 "$out/env.txt")"
  if ! gpu_probe; then
    [ -n "${KILN_DEVKIT_ALLOW_NO_GPU:-}" ] || die "$gpu_line; nothing measured"
    echo "device_kit: $gpu_line (KILN_DEVKIT_ALLOW_NO_GPU: going on)"
  else echo "$gpu_line"; fi
  echo "== check: $((SECONDS - t)) s"
  quick_plan
  local i=0 failed=0 ran=0 entry limit name cmd rc extra=0
  local steps=("${quick_core[@]}" "|extras|" "${quick_extra[@]}")
  for entry in "${steps[@]}"; do
    limit=${entry%%|*}; entry=${entry#*|}; name=${entry%%|*}; cmd=${entry#*|}
    if [ "$name" = extras ]; then extra=1; continue; fi
    i=$((i + 1)); limit=${KILN_DEVKIT_STEP_TIMEOUT:-$limit}
    if [ "$extra" -eq 1 ] && [ $((SECONDS - start + limit)) -gt "$budget" ]; then
      echo "== step $i ($name): not started, $((SECONDS - start)) s of $budget s spent and its limit is $limit s"
      continue
    fi
    echo "== step $i: $name ($(date -u +%H:%M:%S), $((SECONDS - start)) s spent; limit $limit s)"
    rc=0; t=$SECONDS
    case $name in
      test\ *)
        # shellcheck disable=SC2046
        KILN_DEVKIT_TEST_TIMEOUT=$limit one_test "${name#test }" "$work" $(gpu_test_cmd "${name#test }") || true
        [ "$n_fail" -eq 0 ] || rc=1; n_fail=0 ;;
      *)
        echo "\$ $cmd"
        (cd "$work" && timeout "$limit" bash -c "$cmd") >"$work/step$i.log" 2>&1 || rc=$?
        tail -n 25 "$work/step$i.log"
        case $rc in 0) ;; 124) echo "FAIL step $i: timed out after $limit s" ;; *) echo "FAIL step $i: exit $rc" ;; esac ;;
    esac
    ran=$((ran + 1)); [ "$rc" -eq 0 ] || failed=$((failed + 1))
    echo "== step $i: exit $rc, $((SECONDS - t)) s"
    if [ -f "$work/trace.json" ]; then gzip -f "$work/trace.json" && mv "$work/trace.json.gz" "$out/"; fi
    tar -C "$work" -cf "$out/results.tar" . 2>/dev/null || true
  done
  echo "== summary"
  quick_summary "$work" | tee "$work/summary.txt"
  tar -C "$work" -cf "$out/results.tar" . 2>/dev/null || true
  echo "quick: $ran steps in $((SECONDS - start)) s, $failed failed; results in $out/results.tar, $out/env.txt"
  [ "$failed" -eq 0 ] || die "$failed step(s) failed (see above)"
}

# ==== dispatch =================================================================================
action="${1:-}"
[ $# -gt 0 ] && shift
case "$action" in
  pack) pack "$@" ;;
  check) check ;;
  run)
    [ $# -gt 0 ] || die "usage: run CMD..."
    kit_env
    preflight "$KILN_BIN" "$MPIEXEC"
    exec "$@" ;;
  run-gpu-tests)
    kit_env
    gpu_tests "${1:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-gpu-tests.XXXXXX")}" || die "gpu tests failed (above)" ;;
  session) session "$@" ;;
  quick) quick "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; [ -z "$action" ] || die "unknown subcommand '$action'"; exit 2 ;;
esac
