# shellcheck shell=bash
# shellcheck disable=SC2034,SC2054 # the sourcing scripts use these; commas are MCA lists
# Shared by the tools/ompi-*.sh scripts (sourced): where the component is, and mpirun's
# common arguments for runs on this host.
OMPI_OUT="$PWD/target/ompi"
OMPI_PATH="$(ompi_info --path pkglibdir | sed 's/^.*Pkglibdir: *//'):$OMPI_OUT"
MPIRUN=(mpirun --mca pml ob1 --mca mca_base_component_path "$OMPI_PATH")
if [ "$(id -u)" = 0 ]; then
  MPIRUN+=(--allow-run-as-root --oversubscribe)
fi
# The two transports compared, both on loopback: ringbtl, and Open MPI's TCP BTL.
BTL_ringbtl=(--mca btl self,ringbtl --mca btl_ringbtl_if_include lo)
BTL_tcp=(--mca btl self,tcp --mca btl_tcp_if_include lo)
