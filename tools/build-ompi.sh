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
set -euo pipefail
cd "$(dirname "$0")/.."
out="$PWD/target/ompi"
stock_dir() { ompi_info --path pkglibdir | sed 's/^.*Pkglibdir: *//'; }
case "${1:-}" in
  --path) echo "$(stock_dir):$out"; exit 0 ;;
esac
make -s -C ompi all tests OUT="$out"
echo "built $out/mca_btl_ringbtl.so (Open MPI $(ompi_info --version | sed -n 's/^Open MPI v//p'))"
if [ "${1:-}" = --install ]; then
  mkdir -p "$HOME/.openmpi/components"
  install -m 0755 "$out/mca_btl_ringbtl.so" "$HOME/.openmpi/components/"
  echo "installed $HOME/.openmpi/components/mca_btl_ringbtl.so"
fi
