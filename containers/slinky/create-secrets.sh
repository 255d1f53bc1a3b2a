#!/bin/sh
# The Secrets the Slinky manifests name, made ONCE per cluster with random values, before the first
# `kubectl apply -f containers/slinky/`. No manifest here holds a secret value: a value written in a file
# that everybody can read is known to everybody (the slurm.key once shipped here let anyone who applied it
# unchanged forge Slurm credentials as root on every node), and the agents refuse a short key or password,
# or one holding a placeholder such as REPLACE-ME, at start.
#
#   containers/slinky/create-secrets.sh NAMESPACE SSSD_CONF
#
# NAMESPACE: where the manifests are applied (the repair executor's RBAC in rbac.yaml names it too);
# SSSD_CONF: your directory's SSSD configuration (the LoginSet's sssd.conf).
#
# What it makes (each with `kubectl create secret generic ... --from-file`, from files in a private
# temporary directory, so that no value is on a command line, where every user of this host can read it):
#   slurm-key                   slurm.key: 1 KiB of random bytes (auth/slurm), for every Slurm daemon
#   slurm-db-password           password: slurmdbd's database password (the Accounting's passwordKeyRef);
#                               repair-password, page-password, backup-password: the database accounts of
#                               the repair store, the page and the backups (least privilege: see
#                               docs/operator/containers.md); all printable ASCII without spaces, '#' or '\'
#                               (slurmdbd.conf has no quoting)
#   slurm-ext-agent-credential  agent-credential: the node agents' credential (docs/operator/agent-credential.md)
#   slurm-accounting-backup-key key: the key that authenticates the backups' manifests (accounting.backup_key):
#                               keep a copy apart from the backups, for wherever one is restored
#   sssd-conf                   sssd.conf: SSSD_CONF as given
#
# The database passwords must outlive reinstalls: a database initialised with one refuses another (Slinky
# issue 44), so slurm-db-password carries helm.sh/resource-policy=keep and is never part of what a chart
# or `kubectl apply` regenerates. Rotating a value on purpose: `kubectl create secret ... --dry-run=client
# -o yaml | kubectl replace -f -` with a new file, then restart the pods that read it (the mariadb pod sets
# every account's password from its files at each start).
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 NAMESPACE SSSD_CONF" >&2
    exit 2
fi
namespace=$1
sssd_conf=$2
if [ ! -r "$sssd_conf" ]; then
    echo "$0: cannot read the SSSD configuration $sssd_conf" >&2
    exit 2
fi

umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT INT TERM

# BYTES random bytes as hex digits, without a newline: slurmdbd.conf takes a password as it is
random_hex() {
    od -An -N"$2" -tx1 /dev/urandom | tr -d ' \n' > "$1"
}

head -c 1024 /dev/urandom > "$work/slurm.key"
for name in password repair-password page-password backup-password agent-credential; do
    random_hex "$work/$name" 24
done
random_hex "$work/backup-key" 32

kubectl -n "$namespace" create secret generic slurm-key --from-file=slurm.key="$work/slurm.key"
kubectl -n "$namespace" create secret generic slurm-db-password \
    --from-file=password="$work/password" \
    --from-file=repair-password="$work/repair-password" \
    --from-file=page-password="$work/page-password" \
    --from-file=backup-password="$work/backup-password"
kubectl -n "$namespace" annotate secret slurm-db-password helm.sh/resource-policy=keep
kubectl -n "$namespace" create secret generic slurm-ext-agent-credential \
    --from-file=agent-credential="$work/agent-credential"
kubectl -n "$namespace" create secret generic slurm-accounting-backup-key --from-file=key="$work/backup-key"
kubectl -n "$namespace" annotate secret slurm-accounting-backup-key helm.sh/resource-policy=keep
kubectl -n "$namespace" create secret generic sssd-conf --from-file=sssd.conf="$sssd_conf"
