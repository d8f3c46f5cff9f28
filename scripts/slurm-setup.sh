#!/usr/bin/env bash
# A real two-node Slurm cluster on this machine, for the `kind: slurm` tests (and for trying
# `fab deploy --host cluster` by hand). No systemd: munged, slurmctld and two slurmd run as
# plain daemons, everything (config, munge key and socket, state, spool, logs, pids) under
# one directory.
#
#   scripts/slurm-setup.sh install      # apt-get install slurmctld slurmd munge (Debian 12:
#                                       # Slurm 22.05), only when missing
#   scripts/slurm-setup.sh start DIR    # write DIR/slurm.conf, start the daemons, wait for
#                                       # both nodes to be idle; prints `export SLURM_CONF=...`
#   scripts/slurm-setup.sh stop DIR     # stop the daemons started by `start DIR`
#
# The nodes n1 and n2 are two slurmd on 127.0.0.1 with their own ports (`slurmd -N n1`);
# each declares 2 CPUs (SlurmdParameters=config_overrides: more than a 2-core machine has),
# so one gloo rank per node, or two on one node, can start. UPS_SLURM_PORT (default 16817)
# is slurmctld's port; the nodes use the next two.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null && command -v sbatch >/dev/null; then
        return 0
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # policy-rc.d keeps the packages' postinst from starting system daemons.
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
        trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    $SUDO apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
}

conf() {
    local dir=$1 port=$2 host
    host=$(hostname)
    cat <<EOF
ClusterName=ups-test
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=${port}
SlurmUser=$(id -un)
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job may start again after this many seconds (default 120).
AuthInfo=socket=${dir}/munge/munge.socket,cred_expire=5
StateSaveLocation=${dir}/state
SlurmdSpoolDir=${dir}/spool/%n
SlurmctldPidFile=${dir}/run/slurmctld.pid
SlurmdPidFile=${dir}/run/slurmd-%n.pid
SlurmctldLogFile=${dir}/log/slurmctld.log
SlurmdLogFile=${dir}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=sched_interval=1
KillWait=30
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=n1 NodeHostname=${host} NodeAddr=127.0.0.1 Port=$((port + 1)) CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=${host} NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start() {
    local dir=$1 port=${UPS_SLURM_PORT:-16817}
    mkdir -p "$dir"/{munge,state,spool/n1,spool/n2,run,log}
    chmod 0700 "$dir/munge"
    conf "$dir" "$port" >"$dir/slurm.conf"
    export SLURM_CONF=$dir/slurm.conf
    if [ ! -f "$dir/munge/munge.key" ]; then
        dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
        chmod 0400 "$dir/munge/munge.key"
    fi
    # --force: munged refuses root otherwise. Its socket is the cluster's own (AuthInfo).
    $SUDO munged --force --key-file="$dir/munge/munge.key" \
        --socket="$dir/munge/munge.socket" --pid-file="$dir/run/munged.pid" \
        --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
    $SUDO env SLURM_CONF="$SLURM_CONF" slurmctld -c  # -c: no jobs left from an earlier start
    for node in n1 n2; do
        $SUDO env SLURM_CONF="$SLURM_CONF" slurmd -N "$node"
    done
    for _ in $(seq 1 120); do
        if [ "$(sinfo -h -o '%t' -N 2>/dev/null | grep -c '^idle')" = 2 ]; then
            echo "export SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.5
    done
    echo "slurm-setup.sh: the nodes did not become idle within 60 s; logs in $dir/log" >&2
    sinfo -N >&2 || true
    tail -n 20 "$dir"/log/*.log >&2 || true
    return 1
}

stop() {
    local dir=$1
    for pidfile in "$dir"/run/slurmd-n1.pid "$dir"/run/slurmd-n2.pid \
        "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
        if [ -f "$pidfile" ]; then $SUDO kill "$(cat "$pidfile")" 2>/dev/null || true; fi
    done
    for pidfile in "$dir"/run/*.pid; do  # gone, so that a new start can take the ports
        [ -f "$pidfile" ] || continue
        for _ in $(seq 1 100); do
            $SUDO kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || break
            sleep 0.1
        done
        $SUDO rm -f "$pidfile"
    done
}

case "${1:-}" in
install) install ;;
start) start "${2:?usage: slurm-setup.sh start DIR}" ;;
stop) stop "${2:?usage: slurm-setup.sh stop DIR}" ;;
*)
    echo "usage: slurm-setup.sh install | start DIR | stop DIR" >&2
    exit 2
    ;;
esac
