# A one-node SLURM cluster (munge + slurmctld + slurmd) for the SLURM tests.
# Meant to be sourced (`source .ci/slurm.sh`): idempotent, returns at once when the
# cluster already answers, and never exits the calling shell (failures only print).
# Needs root. State and logs live under /tmp/slurm.
#
# Facts this relies on: proctrack/linuxproc and task/none (no cgroups in containers),
# select/cons_tres with CR_Core, no accounting storage (sacct then fails; submitit only
# warns), the node line exactly as `slurmd -C` prints it.

_sam_slurm_up() {
    timeout 5 sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'
}

_sam_slurm_start() {
    if _sam_slurm_up; then
        return 0
    fi
    if [ "$(id -u)" != 0 ]; then
        echo ".ci/slurm.sh: needs root to start SLURM; the SLURM tests will skip" >&2
        return 1
    fi
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
        || ! command -v munged >/dev/null; then
        echo ".ci/slurm.sh: installing slurmctld slurmd slurm-client munge" >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            slurmctld slurmd slurm-client munge >/dev/null) || {
            echo ".ci/slurm.sh: apt-get install failed; the SLURM tests will skip" >&2
            return 1
        }
    fi
    local d=/tmp/slurm host node
    mkdir -p "$d/state" "$d/spool" /etc/slurm /run/munge /var/lib/munge /var/log/munge /etc/munge

    # munge: a key, then munged as the munge user
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey -c -k /etc/munge/munge.key 2>/dev/null \
            || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
    chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key && chmod 0755 /run/munge || true
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged --force 2>/dev/null \
            || su -s /bin/sh munge -c "/usr/sbin/munged --force"
        sleep 0.3
    fi

    host=$(hostname -s)
    node=$(slurmd -C 2>/dev/null | head -n 1)
    if [ -z "$node" ]; then
        echo ".ci/slurm.sh: slurmd -C printed nothing; the SLURM tests will skip" >&2
        return 1
    fi
    cat > /etc/slurm/slurm.conf <<CONF
# written by .ci/slurm.sh: a one-node test cluster
ClusterName=samci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
KillWait=5
MinJobAge=600
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
$node State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
    pgrep -x slurmctld >/dev/null || slurmctld -c 2>>"$d/start.log"
    pgrep -x slurmd >/dev/null || slurmd 2>>"$d/start.log"
    local i
    for i in $(seq 1 50); do
        if _sam_slurm_up; then
            return 0
        fi
        # a node left DOWN by an earlier run of the daemons
        timeout 5 scontrol update nodename="$(echo "${node#NodeName=}" | cut -d" " -f1)" state=resume >/dev/null 2>&1 || true
        sleep 0.2
    done
    echo ".ci/slurm.sh: SLURM did not come up (logs in $d); the SLURM tests will skip" >&2
    return 1
}

_sam_slurm_start
unset -f _sam_slurm_start _sam_slurm_up
true
