# shellcheck shell=bash
# shellcheck disable=SC2034 # the sourcing scripts use these
# Shared by the tools/ompi5-*.sh scripts (sourced): the Open MPI 5 of tools/ompi5-setup.sh
# (PyPI's, built without dlopen), the component built for it (tools/build-ompi.sh --ompi5)
# and mpirun's common arguments: the component comes in through the preloaded list of
# BTLs (ompi/ompi5/preload.c), in the ranks only.
OMPI5_PREFIX="$PWD/target/ompi5/venv"
OMPI5_OUT="$PWD/target/ompi5"
export OPAL_PREFIX="$OMPI5_PREFIX"
export PATH="$OMPI5_PREFIX/bin:$PATH"
MPIRUN5=("$OMPI5_PREFIX/bin/mpirun" -x LD_PRELOAD="$OMPI5_OUT/libringbtl_preload.so" --mca pml ob1)
if [ "$(id -u)" = 0 ]; then
  MPIRUN5+=(--allow-run-as-root)
fi
# 4 ranks on 2 cores.
MPIRUN5+=(--oversubscribe)
