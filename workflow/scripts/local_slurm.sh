#!/usr/bin/env bash
# A single-node Slurm on this machine, to try the slurm profile (and for CI). Debian/Ubuntu,
# as root, without systemd: the daemons are started and stopped by hand.
#
#   workflow/scripts/local_slurm.sh up      install slurm-wlm + munge if missing, write
#                                           /etc/slurm/slurm.conf, start munged, slurmctld,
#                                           slurmd, and wait until the node is idle
#   workflow/scripts/local_slurm.sh down    stop the three daemons (by their PID files) and
#                                           remove the slurm.conf that up wrote
#   workflow/scripts/local_slurm.sh status  sinfo and squeue
#
# Environment: SLURM_UP_TIMEOUT (seconds to wait for an idle node, default 60),
# LOCAL_SLURM_PARTITION (the partition's name, default "local").
set -euo pipefail

PARTITION="${LOCAL_SLURM_PARTITION:-local}"
TIMEOUT="${SLURM_UP_TIMEOUT:-60}"
CONF=/etc/slurm/slurm.conf

die() { echo "local_slurm: error: $*" >&2; exit 1; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        || [[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd && -x /usr/sbin/munged ]]; then
        return
    fi
    [[ $(id -u) == 0 ]] || die "installing slurm-wlm and munge needs root (apt-get)"
    echo "local_slurm: installing slurm-wlm and munge (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

write_conf() {
    local host cpus mem_kb real_mb
    host="$(hostname -s)"
    cpus="$(nproc)"
    mem_kb="$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)"
    # 90% of the available memory: every job's mem_mb must fit, or Slurm never schedules it
    real_mb=$((mem_kb * 9 / 10 / 1024))
    install -d /etc/slurm
    cat >"$CONF" <<EOF
# Written by workflow/scripts/local_slurm.sh: a single-node cluster for trying the profile.
ClusterName=kvasym-local
SlurmctldHost=${host}
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
# finished jobs stay visible to squeue for 300 s: the executor plugin polls squeue (no sacct
# without accounting), and must see a job's final state (>= 3x its first status-check delay)
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=${host} CPUs=${cpus} RealMemory=${real_mb} State=UNKNOWN
PartitionName=${PARTITION} Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
}

wait_idle() {
    local deadline=$((SECONDS + TIMEOUT)) state=""
    while ((SECONDS < deadline)); do
        # slurmctld exits 0 even when it dies seconds later: readiness is an idle node
        state="$(sinfo -h -N -o %t 2>/dev/null | head -n1 || true)"
        if [[ "$state" == idle* ]]; then
            echo "local_slurm: node $(hostname -s) is idle (partition ${PARTITION}, $(nproc) CPUs)"
            return 0
        fi
        sleep 1
    done
    echo "local_slurm: last node state: '${state:-none}'" >&2
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
    die "no idle Slurm node after ${TIMEOUT} s"
}

up() {
    [[ $(id -u) == 0 ]] || die "starting the Slurm daemons needs root"
    install_packages
    if sinfo -h -N -o %t 2>/dev/null | grep -q '^idle'; then
        echo "local_slurm: already up"
        return 0
    fi
    write_conf
    install -d -o munge -g munge -m 0755 /run/munge
    [[ -s /etc/munge/munge.key ]] || die "/etc/munge/munge.key is missing (reinstall munge)"
    if ! [[ -s /run/munge/munged.pid ]] || ! kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
        runuser -u munge -- /usr/sbin/munged
    fi
    install -d -o slurm -g slurm /var/spool/slurmctld /var/log/slurm
    install -d /var/spool/slurmd
    /usr/sbin/slurmctld
    /usr/sbin/slurmd
    wait_idle
}

down() {
    local pidfile pid
    for pidfile in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
        [[ -s $pidfile ]] || continue
        pid="$(cat "$pidfile")"
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
    # A slurm.conf naming a controller that is down makes every `scontrol show config` wait 9 s
    # for it, and the Slurm executor plugin runs that command whenever Snakemake starts (loading
    # its plugins), with any executor: remove the configuration this script wrote (up writes it
    # again), never one it did not write.
    if [[ -f $CONF ]] && head -n1 "$CONF" | grep -q '^# Written by workflow/scripts/local_slurm.sh'; then
        rm -f "$CONF"
    fi
    echo "local_slurm: stopped"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) sinfo; squeue ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
