# same_blas.sh - sourced by the scripts that time tally beside PyTorch: the peers get the OpenBLAS kernels
# tally runs (where OpenBLAS fell back to SSE ones on a newer CPU, tally picks the CPU's best; docs/cli.md).
# Needs $tally, the tally binary. A user's OPENBLAS_CORETYPE is kept.
if [ -z "${OPENBLAS_CORETYPE+set}" ]; then
  tally_blas_core=$("$tally" --version | sed -n 's/^OpenBLAS kernels: \([A-Za-z0-9]*\).*/\1/p')
  [ -n "$tally_blas_core" ] && export OPENBLAS_CORETYPE=$tally_blas_core
fi
echo "OpenBLAS kernels for tally and the peers: ${OPENBLAS_CORETYPE:-as OpenBLAS picks them}"
