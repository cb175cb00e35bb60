#!/usr/bin/env bash
# One job on two hosts under torchrun: an embedding server and trainer 0 on host 0, trainers
# 1 and 2 on host 1 (ranks give roles: embedding servers first, then trainers). Run it on
# both hosts, host 0's address first, then this host's rank:
#
#   examples/two_hosts.sh HOST0 0 [OPTIONS...]     # on host 0 (it holds the rendezvous)
#   examples/two_hosts.sh HOST0 1 [OPTIONS...]     # on host 1
#
# OPTIONS are shadowsync train's (--examples 200000, --sync s-easgd, ...), the same on both
# hosts, as is the data. Set GLOO_SOCKET_IFNAME and TP_SOCKET_IFNAME to the interface the
# hosts share (e.g. eth0) if the host name resolves to a loopback address. PORT (default
# 29400) is the rendezvous port on HOST0; OUT (default runs/two-hosts) the run directory on
# each host. Only on a network you trust: the job's processes accept any connection.
set -euo pipefail
usage() { sed -n '2,13p' "$0" | cut -c3-; }
case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -lt 2 ]; then usage >&2; exit 2; fi
host0=$1
rank=$2
shift 2
exec torchrun --nnodes 2 --node-rank "$rank" --nproc-per-node 2 \
    --rdzv-endpoint "$host0:${PORT:-29400}" \
    -m shadowsync.run --embedding-servers 1 --trainers 3 --out "${OUT:-runs/two-hosts}" "$@"
