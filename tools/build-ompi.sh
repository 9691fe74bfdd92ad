#!/usr/bin/env bash
# Builds the Open MPI BTL component mca_btl_ringbtl.so (ompi/) against the installed Open
# MPI headers (Debian: libopenmpi-dev), with ringbtl's C ABI (ffi/, built here by cargo)
# linked in statically, so the component is one self-contained shared object.
#
# Usage: tools/build-ompi.sh            builds target/ompi/mca_btl_ringbtl.so (+ MPI tests)
#        tools/build-ompi.sh --install  also copies it to ~/.openmpi/components, where
#                                       mpirun finds it with no --mca option
# Then:  mpirun --mca pml ob1 --mca btl self,ringbtl \
#          --mca mca_base_component_path "$(tools/build-ompi.sh --path)" ./a.out
#
#        tools/build-ompi.sh --ompi5    the same component for Open MPI 5.0 (BTL interface
#          3.3) into target/ompi5/, with libringbtl_preload.so and the MPI tests. Open MPI 5:
#          $OMPI5_MPICC, else the one of tools/ompi5-setup.sh (PyPI), else `mpicc` if it is
#          Open MPI 5.0. A distribution's Open MPI 5 loads it from mca_base_component_path as
#          above; PyPI's (built without dlopen) from the preloaded list of BTLs:
#          mpirun -x LD_PRELOAD=target/ompi5/libringbtl_preload.so --mca btl self,ringbtl ...
#          (docs/ompi5.md).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/ompi"
stock_dir() { ompi_info --path pkglibdir | sed 's/^.*Pkglibdir: *//'; }
case "${1:-}" in
  --path) echo "$(stock_dir):$out"; exit 0 ;;
  --ompi5)
    out="$PWD/target/ompi5"
    mpicc5="${OMPI5_MPICC:-}"
    if [ -z "$mpicc5" ] && [ -x target/ompi5/venv/bin/mpicc ]; then
      export OPAL_PREFIX="$PWD/target/ompi5/venv"
      mpicc5="$OPAL_PREFIX/bin/mpicc"
    fi
    [ -n "$mpicc5" ] || mpicc5=$(command -v mpicc || true)
    ver=$("$(dirname "$mpicc5")/ompi_info" --version 2>/dev/null | sed -n 's/^Open MPI v//p')
    case "$ver" in
      5.0.*) ;;
      *) echo "no Open MPI 5.0 found (${mpicc5:-no mpicc}: ${ver:-not Open MPI}): run" \
           "tools/ompi5-setup.sh or set OMPI5_MPICC" >&2; exit 1 ;;
    esac
    make -s -C ompi all tests OMPI5=1 MPICC="$mpicc5" OUT="$out"
    echo "built $out/mca_btl_ringbtl.so and libringbtl_preload.so (Open MPI $ver)"
    exit 0 ;;
esac
make -s -C ompi all tests OUT="$out"
echo "built $out/mca_btl_ringbtl.so (Open MPI $(ompi_info --version | sed -n 's/^Open MPI v//p'))"
if [ "${1:-}" = --install ]; then
  mkdir -p "$HOME/.openmpi/components"
  install -m 0755 "$out/mca_btl_ringbtl.so" "$HOME/.openmpi/components/"
  echo "installed $HOME/.openmpi/components/mca_btl_ringbtl.so"
fi
