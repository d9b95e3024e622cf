#!/usr/bin/env bash
# svcframe under a real Slurm and a real MPI, on this one machine (root, Debian or Ubuntu): Debian's munge,
# slurmctld and slurmd, MPICH (Debian's, and the mpi-wheel extra's), then tests/test_cluster.py for real.
#
#   bash .ci/cluster.sh           install, start, run tests/test_cluster.py, stop (what .ci/run does)
#   bash .ci/cluster.sh up        install and start, then leave the cluster running; it prints how to use it
#   bash .ci/cluster.sh down      stop a cluster left running by `up`
#
# The cluster (state, configs and logs in $SVCF_CLUSTER_DIR, default /tmp/svcf-cluster):
#   slurmctld and a slurmd on this host (node `hostname -s`, partition `local`, the default), and one slurmd
#   in each namespace node of tools/netns_nodes.sh (svcf-node1 and svcf-node2 at 10.200.0.11/12, partition
#   `netns`), each with its own host name and /etc/hosts; munged on a socket of its own. Every node claims 4
#   CPUs (SlurmdParameters=config_overrides), so `salloc -n 4` fits on 2 cores; OverSubscribe=YES.
#
# Hard time limits on every step (timeout(1), then SIGKILL); whatever happens, an EXIT trap cancels the jobs,
# stops the daemons by the PIDs this script started them with (TERM, then KILL), ends any process still
# running with this cluster's marker in its environment (SVCF_CLUSTER, inherited by slurmstepd and the tasks),
# and deletes the namespaces. Environment: PYTHON (for tools/test.sh), SVCF_CLUSTER_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${SVCF_CLUSTER_DIR:-/tmp/svcf-cluster}
HOST=$(hostname -s)
PACKAGES=(slurmctld slurmd slurm-client munge mpich libpmix-dev)
# libpmix-dev: Debian's mpi/pmix plugin dlopens libpmix.so, which only the -dev package provides

limit() {  # limit SECONDS COMMAND...: the command, killed (TERM, then KILL 10 s later) past SECONDS
  local seconds=$1
  shift
  timeout --kill-after=10 "$seconds" "$@"
}
note() { echo "cluster: $*" >&2; }
export SLURM_CONF="$STATE/slurm.conf"

install() {
  local missing=()
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    note "installing ${missing[*]}"
    limit 120 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive limit 600 apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

configure() {
  mkdir -p "$STATE/state" "$STATE/munge"
  for node in "$HOST" svcf-node1 svcf-node2; do
    mkdir -p "$STATE/spool/$node"
  done
  chmod 711 "$STATE/munge"
  if [ ! -s "$STATE/munge/munge.key" ]; then
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$STATE/munge/munge.key"
  fi
  cat >"$SLURM_CONF" <<EOF
# written by .ci/cluster.sh
ClusterName=svcframe-ci
SlurmctldHost=$HOST(10.200.0.1)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
KillWait=5
MinJobAge=30
InactiveLimit=0
MessageTimeout=10
SchedulerType=sched/backfill
NodeName=$HOST NodeAddr=10.200.0.1 CPUs=4 State=UNKNOWN
NodeName=svcf-node1 NodeAddr=10.200.0.11 CPUs=4 State=UNKNOWN
NodeName=svcf-node2 NodeAddr=10.200.0.12 CPUs=4 State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES OverSubscribe=YES MaxTime=30 State=UP
PartitionName=netns Nodes=svcf-node[1-2] OverSubscribe=YES MaxTime=30 State=UP
EOF
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds (bounded polling), else fail
  local seconds=$1 what=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ $((SECONDS - t0)) -ge "$seconds" ]; then
      note "$what: not within $seconds s"
      return 1
    fi
    sleep 0.2
  done
}

daemon() {  # daemon NAME COMMAND...: start a daemon in the foreground mode, in the background; remember its PID
  local name=$1
  shift
  SVCF_CLUSTER="$STATE" "$@" >"$STATE/$name.out" 2>&1 &
  echo "$! $name" >>"$STATE/pids"
}

nodes_idle() {
  [ "$(limit 10 sinfo -h -N -o '%N %T' | grep -c -E ' idle$')" = 3 ]
}

start() {
  bash tools/netns_nodes.sh up >/dev/null
  configure
  : >"$STATE/pids"
  daemon munged munged -F --force --socket="$STATE/munge/munge.sock" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munge/munged.pid" --seed-file="$STATE/munge/munged.seed" --log-file="$STATE/munge/munged.log"
  wait_for 20 "munged's socket" test -S "$STATE/munge/munge.sock"
  daemon slurmctld slurmctld -D -f "$SLURM_CONF"
  daemon "slurmd-$HOST" slurmd -D -f "$SLURM_CONF" -N "$HOST"
  for node in svcf-node1 svcf-node2; do
    daemon "slurmd-$node" bash tools/netns_nodes.sh run "$node" slurmd -D -f "$SLURM_CONF" -N "$node"
  done
  if ! wait_for 60 "three idle nodes" nodes_idle; then
    limit 10 sinfo -N || true
    tail -n 5 "$STATE"/*.out "$STATE"/*.log >&2 || true
    return 1
  fi
  note "up: $(limit 10 sinfo -h -o '%P %D %N' | tr '\n' ';') state in $STATE"
}

kill_pids() {  # kill_pids PID...: TERM, up to 10 s for them to exit, then KILL
  local pid alive t0=$SECONDS
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  while :; do
    alive=()
    for pid in "$@"; do
      kill -0 "$pid" 2>/dev/null && alive+=("$pid")
    done
    [ ${#alive[@]} -gt 0 ] || return 0
    [ $((SECONDS - t0)) -lt 10 ] || break
    sleep 0.2
  done
  note "killing ${alive[*]} (still running 10 s after SIGTERM)"
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

marked_pids() {  # processes with this cluster's marker in their environment (slurmstepd, tasks), not this shell
  local environ pid
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}
    pid=${pid%/environ}
    [ "$pid" != $$ ] && [ "$pid" != "$BASHPID" ] || continue
    { tr '\0' '\n' <"$environ"; } 2>/dev/null | grep -qx "SVCF_CLUSTER=$STATE" && echo "$pid"
  done
  return 0
}

stop() {
  if [ -f "$SLURM_CONF" ] && command -v scancel >/dev/null; then
    limit 20 scancel --full -u "$(id -un)" 2>/dev/null || true
  fi
  if [ -f "$STATE/pids" ]; then
    # the slurmds first, then slurmctld, then munged (the reverse of their start)
    mapfile -t started < <(tac "$STATE/pids" | cut -d' ' -f1)
    kill_pids "${started[@]}"
    rm -f "$STATE/pids"
  fi
  mapfile -t left < <(marked_pids)
  if [ ${#left[@]} -gt 0 ]; then
    note "ending ${#left[@]} process(es) the cluster left: ${left[*]}"
    kill_pids "${left[@]}"
  fi
  bash tools/netns_nodes.sh down
}

case "${1:-ci}" in
  up)
    [ "$(id -u)" = 0 ] || { echo "cluster: needs root (daemons, namespaces)" >&2; exit 1; }
    install
    start
    echo "export SLURM_CONF=$SLURM_CONF   # then: sinfo; srun -n 4 ...; bash .ci/cluster.sh down"
    ;;
  down)
    stop
    rm -rf "$STATE"
    ;;
  ci)
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
      echo "cluster: needs root and apt-get (Debian, Ubuntu): not run" >&2
      exit 1
    fi
    ok=0
    trap 'stop; [ $ok = 1 ] && rm -rf "$STATE"' EXIT
    trap 'exit 130' INT TERM
    install
    stop 2>/dev/null || true  # a cluster an interrupted run left behind
    start
    # tools/test.sh: the repository's venv, with the mpi-wheel extra (CI=true); every case must run here
    # MPICH's PMI2 client can hang in MPI_Init under srun --mpi=pmi2, outside svcframe (the rank's watchdog ends
    # it with one line). The cases that start ranks with MPI's barrier under pmi2 are run again, at most twice,
    # when they are all that failed, and each rerun is said; any other failure fails at once.
    run_log="$STATE/test_cluster.log"
    rc=0
    rm -f /dev/shm/mpich_shm_*  # (segments of ranks killed before: with them, a job's MPI_Init hung)
    CI=true SVCF_CLUSTER="$STATE" SVCFRAME_CLUSTER_REQUIRED=1 limit 900 bash tools/test.sh -p no:cacheprovider -rf \
      tests/test_cluster.py 2>&1 | tee "$run_log" || rc=$?
    for attempt in 2 3; do
      [ $rc != 0 ] || break
      mapfile -t failed_cases < <(sed -n 's/^FAILED \([^ ]*\).*/\1/p' "$run_log")
      if [ ${#failed_cases[@]} = 0 ] || printf '%s\n' "${failed_cases[@]}" | grep -qv -e 'pmi2' -e 'under_mpi_barrier'; then
        exit 1
      fi
      echo "cluster: run $attempt of ${failed_cases[*]} (MPI_Init can hang under srun --mpi=pmi2: MPICH's PMI2 client)"
      rc=0
      rm -f /dev/shm/mpich_shm_*
      CI=true SVCF_CLUSTER="$STATE" SVCFRAME_CLUSTER_REQUIRED=1 limit 600 bash tools/test.sh -p no:cacheprovider -rf \
        "${failed_cases[@]}" 2>&1 | tee "$run_log" || rc=$?
    done
    [ $rc = 0 ] || exit 1
    ok=1
    ;;
  *)
    echo "usage: $0 [up|down]" >&2
    exit 2
    ;;
esac
