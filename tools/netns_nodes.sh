#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by a bridge, for tests and CI that need
# processes on distinct hosts (a two-node Slurm cluster in .ci/cluster.sh, group membership and network
# faults with tc netem).
#
#   bash tools/netns_nodes.sh up            create the bed (idempotent: an existing bed is checked, not rebuilt)
#   bash tools/netns_nodes.sh down          delete everything `up` made (idempotent)
#   bash tools/netns_nodes.sh status        print the namespaces, links and addresses; exit 1 if not up
#   bash tools/netns_nodes.sh run NODE CMD [ARG...]
#                                           run CMD on NODE: in its network namespace, with its own host name
#                                           and /etc/hosts, and a sysfs that shows its interfaces (with the
#                                           cgroup tree bound back in, which slurmd needs); CMD keeps the
#                                           script's PID, so `... run NODE daemon &` gives the daemon's in $!
#
# The bed (root only; needs iproute2, util-linux's nsenter and unshare):
#
#   root namespace: bridge svcf-br 10.200.0.1/24 (the host side: slurmctld, a coordinator, a test)
#     |-- veth svcf-veth1 <-> eth0 10.200.0.11/24 in namespace svcf-node1 (host name svcf-node1)
#     '-- veth svcf-veth2 <-> eth0 10.200.0.12/24 in namespace svcf-node2 (host name svcf-node2)
#
# Each namespace has its loopback up and a default route via 10.200.0.1. The nodes resolve each other and
# the host side (svcf-host) through $SVCF_NODES_DIR/hosts (default /run/svcf-nodes/hosts), which `run` binds
# over /etc/hosts. A fault is injected on a node's side of its link, e.g.
#   ip netns exec svcf-node2 tc qdisc add dev eth0 root netem delay 50ms loss 5%
# and tests find the names above in the environment variables SVCF_NODES (the namespaces, space-separated),
# SVCF_NODE_ADDRESSES and SVCF_BRIDGE_ADDRESS when they source this file with `source tools/netns_nodes.sh`
# (sourcing defines the names and functions and runs nothing).
#
# A second bed beside the first (a benchmark injecting faults while a cluster runs on the default one) takes
# other names from the same variables, set before running or sourcing this file, e.g.
#   SVCF_BRIDGE=svcg-br SVCF_BRIDGE_ADDRESS=10.201.0.1 SVCF_NODES="svcg-node1 svcg-node2" \
#   SVCF_NODE_ADDRESSES="10.201.0.11 10.201.0.12" SVCF_VETH=svcg-veth SVCF_NODES_DIR=/run/svcg-nodes \
#   bash tools/netns_nodes.sh up

SVCF_BRIDGE=${SVCF_BRIDGE:-svcf-br}
SVCF_BRIDGE_ADDRESS=${SVCF_BRIDGE_ADDRESS:-10.200.0.1}
SVCF_NODES=${SVCF_NODES:-"svcf-node1 svcf-node2"}
SVCF_NODE_ADDRESSES=${SVCF_NODE_ADDRESSES:-"10.200.0.11 10.200.0.12"}
SVCF_VETH=${SVCF_VETH:-svcf-veth}
SVCF_PREFIX=24
SVCF_NODES_DIR=${SVCF_NODES_DIR:-/run/svcf-nodes}
export SVCF_BRIDGE SVCF_BRIDGE_ADDRESS SVCF_NODES SVCF_NODE_ADDRESSES SVCF_VETH SVCF_NODES_DIR

_svcf_address() {  # _svcf_address NODE: the node's address
  local i=1 node
  for node in $SVCF_NODES; do
    if [ "$node" = "$1" ]; then
      echo "$SVCF_NODE_ADDRESSES" | cut -d' ' -f"$i"
      return 0
    fi
    i=$((i + 1))
  done
  echo "netns_nodes: no node $1 (nodes: $SVCF_NODES)" >&2
  return 1
}

svcf_nodes_up() {
  local i=1 node address veth
  if svcf_nodes_status >/dev/null 2>&1; then
    return 0
  fi
  svcf_nodes_down  # a half-made bed from an interrupted run
  mkdir -p "$SVCF_NODES_DIR"
  {
    echo "127.0.0.1 localhost"
    echo "$SVCF_BRIDGE_ADDRESS svcf-host"
    for node in $SVCF_NODES; do
      echo "$(_svcf_address "$node") $node"
    done
  } >"$SVCF_NODES_DIR/hosts"
  ip link add "$SVCF_BRIDGE" type bridge
  ip addr add "$SVCF_BRIDGE_ADDRESS/$SVCF_PREFIX" dev "$SVCF_BRIDGE"
  ip link set "$SVCF_BRIDGE" up
  for node in $SVCF_NODES; do
    address=$(_svcf_address "$node")
    veth=$SVCF_VETH$i
    ip netns add "$node"
    ip link add "$veth" type veth peer name eth0 netns "$node"
    ip link set "$veth" master "$SVCF_BRIDGE"
    ip link set "$veth" up
    ip -n "$node" addr add "$address/$SVCF_PREFIX" dev eth0
    ip -n "$node" link set eth0 up
    ip -n "$node" link set lo up
    ip -n "$node" route add default via "$SVCF_BRIDGE_ADDRESS"
    i=$((i + 1))
  done
  # the bridge forwards at once (no spanning-tree learning delay before the first frame passes)
  ip link set "$SVCF_BRIDGE" type bridge forward_delay 0 stp_state 0
  svcf_nodes_status >/dev/null
}

svcf_nodes_down() {
  local i=1 node
  for node in $SVCF_NODES; do
    ip netns del "$node" 2>/dev/null || true  # deletes eth0, and with it the veth's other end
    ip link del "$SVCF_VETH$i" 2>/dev/null || true
    i=$((i + 1))
  done
  ip link del "$SVCF_BRIDGE" 2>/dev/null || true
  rm -f "$SVCF_NODES_DIR/hosts"
  rmdir "$SVCF_NODES_DIR" 2>/dev/null || true
}

svcf_nodes_status() {  # exit 1 unless every namespace, link and address is in place
  local node address ok=0
  ip -br addr show dev "$SVCF_BRIDGE" 2>/dev/null || { echo "no bridge $SVCF_BRIDGE"; ok=1; }
  for node in $SVCF_NODES; do
    address=$(_svcf_address "$node")
    if ip -n "$node" -br addr show dev eth0 2>/dev/null | grep -q "$address/"; then
      echo "$node: $(ip -n "$node" -br addr show dev eth0)"
    else
      echo "$node: missing (no namespace, or no $address on its eth0)"
      ok=1
    fi
  done
  [ -f "$SVCF_NODES_DIR/hosts" ] || { echo "no $SVCF_NODES_DIR/hosts"; ok=1; }
  return $ok
}

svcf_nodes_run() {  # svcf_nodes_run NODE CMD [ARG...]
  local node=$1
  shift
  _svcf_address "$node" >/dev/null
  [ $# -gt 0 ] || { echo "netns_nodes: run $node: no command" >&2; return 2; }
  # A new mount and UTS namespace (private propagation: nothing leaks to the host): the host name, the
  # nodes' /etc/hosts, and a fresh sysfs (this namespace's interfaces) with the cgroup tree bound back in.
  ${_SVCF_EXEC:-} nsenter --net="/run/netns/$node" unshare --mount --uts --propagation private -- \
    sh -c 'set -e
      node=$1 hosts=$2
      shift 2
      hostname "$node"
      mount --bind "$hosts" /etc/hosts
      keep=$(mktemp -d)
      mount --rbind /sys/fs/cgroup "$keep"
      mount -t sysfs sysfs /sys
      mount --move "$keep" /sys/fs/cgroup
      rmdir "$keep"
      exec "$@"' sh "$node" "$SVCF_NODES_DIR/hosts" "$@"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  case "${1:-}" in
    up) svcf_nodes_up ;;
    down) svcf_nodes_down ;;
    status) svcf_nodes_status ;;
    run)  # exec: CMD keeps this script's PID (nsenter and unshare exec too), so a caller's $! is CMD's
      shift
      [ $# -ge 1 ] || { echo "usage: $0 run NODE CMD [ARG...]" >&2; exit 2; }
      _SVCF_EXEC=exec svcf_nodes_run "$@"
      ;;
    *)
      echo "usage: $0 up|down|status|run NODE CMD [ARG...]" >&2
      exit 2
      ;;
  esac
fi
