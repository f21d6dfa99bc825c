#!/usr/bin/env bash
# A CUDA-aware Open MPI for `make gpu-check`, built here from registry packages only, packed as one
# tarball for .gpu-wheels/ (docs/testing.md, "A CUDA-aware MPI"). Usage:
#
#   tests/gpu/build_cuda_mpi.sh OUT.tar.gz PREFIX
#
# Open MPI's source: Debian's source package (apt-get source, from the Debian mirror this machine's
# apt already uses, with deb-src lines and lists of this script's own under $WORK: the system's apt
# configuration is left as it is). CUDA's headers: NVIDIA's nvidia-cuda-runtime wheel from PyPI.
# libcuda.so (the driver) is in no registry package: the link goes against a stub made here from
# cuda.h's declarations, with the driver's soname, and the GPU machine's driver is what loads.
# The CUDA code is Open MPI's accelerator/cuda component, a plugin: where libcuda.so.1 is missing
# (this machine) it is left out and the library runs as a CPU-only MPI.
#
# Built to live at PREFIX (Open MPI reads its help files and plugins from the prefix it was
# configured with; OPAL_PREFIX moves it). Took 81 minutes on 2 cores shared with other work; nice -n 10.
set -euo pipefail

OUT=$(realpath -m "${1:?usage: $0 OUT.tar.gz PREFIX}")
PREFIX=${2:?usage: $0 OUT.tar.gz PREFIX}
case $PREFIX in /*/*) ;; *) echo "$0: PREFIX must be an absolute path two levels deep (it is emptied first), not '$PREFIX'" >&2; exit 2 ;; esac
OMPI_DEBIAN=${OMPI_DEBIAN:-5.0.7-1}  # trixie's openmpi source package (Open MPI 5.0.7 as released)
OMPI_SUITE=${OMPI_SUITE:-trixie}
CUDA_RUNTIME=${CUDA_RUNTIME:-nvidia-cuda-runtime==13.0.96}  # the oldest CUDA 13 headers: any 13.x driver
WORK=${CUDA_MPI_WORK:-/tmp/mcr-cuda-mpi-build}
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
ompi=openmpi-${OMPI_DEBIAN%-*}

mkdir -p "$WORK"
cd "$WORK"

# --- the source, from Debian's source packages ---------------------------------------------------
if [ ! -d "$ompi" ]; then
    # The Debian mirror of this machine's own apt sources (one-line or deb822 format)
    mirror=$(grep -rhoE '^(URIs:[[:space:]]*|deb[[:space:]]+(\[[^]]*\][[:space:]]*)?)[a-z]+://[^[:space:]]+/debian/?([[:space:]]|$)' \
        /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | grep -oE '[a-z]+://[^[:space:]]+' | head -n 1 || true)
    [ -n "$mirror" ] || { echo "$0: no Debian mirror in /etc/apt/sources.list{,.d}: cannot fetch $ompi's source" >&2; exit 1; }
    mkdir -p apt/lists/partial apt/cache/archives/partial
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $OMPI_SUITE main" >apt/sources.list
    apt_own=(-o Dir::Etc::SourceList="$WORK/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
        -o Dir::State::Lists="$WORK/apt/lists" -o Dir::Cache="$WORK/apt/cache" -o APT::Sandbox::User=root)
    apt-get -q "${apt_own[@]}" update
    apt-get -q "${apt_own[@]}" source --download-only "openmpi=$OMPI_DEBIAN"  # checked against the signed Sources list
    tar xf "openmpi_${OMPI_DEBIAN%-*}.orig.tar.xz"
fi

# --- CUDA's headers (PyPI) and a link stub for the driver ----------------------------------------
if [ ! -f cuda/include/cuda.h ]; then
    rm -rf cuda wheels && mkdir -p cuda wheels
    "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
        --python-version 3.12 -d wheels "$CUDA_RUNTIME"
    "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall("wheels/x")' wheels/*.whl
    mv wheels/x/nvidia/cu13/include cuda/include
fi
if [ ! -f cuda/stub/libcuda.so ]; then
    # Every cu* name in cuda.h, as written (configure links cuMemFree) and as its macros rename
    # them (cuMemFree_v2, what the code calls), as the driver exports both: the symbols of the
    # toolkit's lib64/stubs/libcuda.so, none of them ever called.
    mkdir -p cuda/stub
    { cat cuda/include/cuda.h; echo '#include <cuda.h>' | gcc -E -I cuda/include -; } |
        grep -oE '\bcu[A-Z][A-Za-z0-9_]*\b' | sort -u | sed 's/.*/void &(void) {}/' >cuda/stub/libcuda.c
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o cuda/stub/libcuda.so cuda/stub/libcuda.c
fi

# --- configure, build, install ---------------------------------------------------------------------
# Only what a one-node check needs: ob1 with the sm/smcuda and tcp BTLs, Open MPI's own PMIx, PRRTE,
# hwloc and libevent; no Fortran, OpenSHMEM, ROMIO (ompio serves MPI-IO), UCX, OFI or verbs.
configure=(--prefix="$PREFIX" --with-cuda="$WORK/cuda" --with-cuda-libdir="$WORK/cuda/stub"
    --disable-mpi-fortran --disable-oshmem --disable-io-romio --disable-static --disable-debug
    --disable-sphinx --without-ucx --without-ofi --without-psm2
    --without-ucc --without-hcoll --without-portals4 --without-rocm
    --with-hwloc=internal --with-libevent=internal --with-pmix=internal --with-prrte=internal)
build=build-${PREFIX//\//_}
if [ ! -f "$build/config.status" ] || [ "$(cat "$build/configure-line" 2>/dev/null)" != "${configure[*]}" ]; then
    rm -rf "$build" && mkdir -p "$build"
    (cd "$build" && nice -n 10 "../$ompi/configure" "${configure[@]}" >configure.log 2>&1) ||
        { tail -n 30 "$build/configure.log" >&2; exit 1; }
    echo "${configure[*]}" >"$build/configure-line"
fi
started=$SECONDS
nice -n 10 make -C "$build" -j "$JOBS" -s >"$build/make.log" 2>&1 || { tail -n 40 "$build/make.log" >&2; exit 1; }
rm -rf "$PREFIX"
nice -n 10 make -C "$build" -s install >"$build/install.log" 2>&1 || { tail -n 40 "$build/install.log" >&2; exit 1; }
echo "built and installed in $((SECONDS - started)) s"

# --- what the GPU machine runs, and nothing else ------------------------------------------------------
rm -rf "$PREFIX"/share/{man,doc} "$PREFIX"/include "$PREFIX"/lib/pkgconfig "$PREFIX"/share/openmpi/*.pc
find "$PREFIX" -name '*.la' -delete
find "$PREFIX"/bin "$PREFIX"/lib -type f \( -perm -u+x -o -name '*.so*' \) -exec strip --strip-unneeded {} + 2>/dev/null || true
echo "${configure[*]}" >"$PREFIX/configure-line"
mkdir -p "$(dirname "$OUT")"
tar czf "$OUT" -C "$PREFIX" .
du -sh "$PREFIX" "$OUT"
