#!/usr/bin/env bash
# The original suite's MG-WFBP launcher (its mgwfbp/ folder), with the original's variables,
# defaults and meanings; it runs through horovod/horovod_mpi_cj.sh:
#
#   dnn=resnet50 bs=64 nworkers=8 senlen=64 rdma=0 compressor=none mgwfbp=1 threshold=0 \
#   ./mgwfbp/horovod_mpi_cj.sh
#
# - compressor other than none: the threshold method with the original's compressed-run
#   settings, density 0.001 and threshold 67108864 elements (256 MiB of fp32), whatever
#   mgwfbp and threshold say (as the original);
# - mgwfbp=1 (default): MG-WFBP, whose default is the original's merge of small groups
#   (mgwfbp_min_group, which may be set), with alpha and beta from the original's tables by
#   worker count and rdma (mgwfbp_ab=table, as the original planned; mgwfbp_ab=measured, or
#   DDLBENCH_MGWFBP_AB=measured, fits them on this cluster as the suite's own launchers do);
# - mgwfbp=0: the threshold method, threshold in ELEMENTS as the original counted it (the
#   suite's own flags count bytes: x4 for fp32): 0 = WFBP (wfbp), at least 536870912 (the
#   original's BSP setting, 2 GiB of fp32, more than any model's gradient) = BSP-A2A (bspa2a),
#   anything between = tensor fusion (fusion) at that many elements.
# The first line on stderr says which method and settings that made. rdma, hostfile, net,
# image_size, iters, extra_args and dry_run are horovod/horovod_mpi_cj.sh's.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/ddlbench/launch/common.sh"

[ -z "${method:-}" ] || die "method= is not a variable of this launcher (mgwfbp, threshold and compressor choose the method, as in the original); horovod/horovod_mpi_cj.sh takes method="
defaults compressor=none mgwfbp=1 threshold=0
elements "$threshold"
case "$mgwfbp" in 0|1) ;; *) die "mgwfbp must be 0 or 1, got '$mgwfbp'" ;; esac

BSP_ELEMENTS=536870912       # the original's threshold for BSP-A2A
COMPRESSED_ELEMENTS=67108864  # the original's threshold for compressed runs
if [ "$compressor" != none ]; then
    method=fusion; threshold="$COMPRESSED_ELEMENTS"; export density=0.001
    said="compressor=$compressor: fusion, density 0.001, threshold $threshold elements"
    if [ "$compressor" = signum ]; then  # the original's signSGD averaged the workers' signs
        compressor=signavg; said="$said; the original's signum averaged the signs: signavg"
    fi
elif [ "$mgwfbp" = 1 ]; then
    method=mgwfbp
    defaults "mgwfbp_ab=${DDLBENCH_MGWFBP_AB:-table}"  # the original's alpha-beta tables
    export mgwfbp_ab
    said="mgwfbp=1: mgwfbp, alpha-beta mgwfbp_ab=$mgwfbp_ab (with the original's small-group merge unless mgwfbp_min_group=0)"
elif [ "$threshold" = 0 ]; then
    method=wfbp; said="mgwfbp=0 threshold=0: wfbp"
elif [ "$threshold" -ge "$BSP_ELEMENTS" ]; then
    method=bspa2a; said="mgwfbp=0 threshold=$threshold elements: bspa2a (one all-reduce after backward)"
else
    method=fusion; said="mgwfbp=0 threshold=$threshold elements: fusion"
fi
echo "$LAUNCHER_NAME: $said" >&2
export NCCL_DEBUG="${NCCL_DEBUG:-INFO}"  # the original's launchers always set it
export method compressor threshold="$(element_bytes "$threshold")"
exec "$root/horovod/horovod_mpi_cj.sh"
