#!/usr/bin/env bash
# Makes the job's Secrets for the manifests: a job CA and certificates
# (deploy/tls/make_job_certs.sh) and a random job token, written as Secret
# manifests to apply before the job:
#
#   deploy/k8s/make_secrets.sh DIR [--servers=2] [--workers=2]
#       [--namespace=NS] [--jobset=NAME]
#   kubectl apply -f DIR/secrets.yaml && kubectl apply -k deploy/k8s/overlays/cpu
#
# DIR keeps the PKI (ca.key among it: keep DIR off the cluster, or delete it
# once the job has its Secrets) and secrets.yaml, mode 0600, holding:
#   ps-job-token   key token: 32 random bytes, hex
#   ps-server-tls  ca.crt and, per shard, POD.crt and POD.key, POD being the
#                  shard's pod name (ps-server-N; with --jobset=NAME,
#                  NAME-server-0-N); its SANs: POD.SUBDOMAIN,
#                  POD.SUBDOMAIN.NS.svc, POD.SUBDOMAIN.NS.svc.cluster.local
#                  (SUBDOMAIN: ps-server, or NAME for a JobSet) and localhost
#                  (the shard's own probe)
#   ps-worker-tls  ca.crt and, per worker, ID.crt and ID.key with CN and
#                  subjectAltName = the worker id: ps-worker-N (StatefulSet,
#                  the pod name) or wN (JobSet, N = the completion index)
# A DIR that holds a CA already is refused (make_job_certs.sh's rule): one
# job, one CA. --namespace (default: "default") only shapes the SANs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

dir="" servers=2 workers=2 namespace=default jobset=""
for arg in "$@"; do
  case "$arg" in
    --servers=*) servers="${arg#*=}" ;;
    --workers=*) workers="${arg#*=}" ;;
    --namespace=*) namespace="${arg#*=}" ;;
    --jobset=*) jobset="${arg#*=}" ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "make_secrets: unknown flag $arg (see --help)" >&2; exit 2 ;;
    *) dir=$arg ;;
  esac
done
[[ -n "$dir" ]] || { echo "usage: $0 DIR [--servers=N] [--workers=N] [--namespace=NS] [--jobset=NAME]" >&2; exit 2; }
[[ "$servers" =~ ^[1-9][0-9]*$ && "$workers" =~ ^[1-9][0-9]*$ ]] || {
  echo "make_secrets: --servers and --workers are positive numbers" >&2; exit 2; }

args=() server_names=() worker_ids=()
for ((i = 0; i < servers; ++i)); do
  if [[ -n "$jobset" ]]; then pod="$jobset-server-0-$i" subdomain=$jobset
  else pod="ps-server-$i" subdomain=ps-server; fi
  server_names+=("$pod")
  fqdn="$pod.$subdomain"
  args+=("--server=$pod,$fqdn,$fqdn.$namespace.svc,$fqdn.$namespace.svc.cluster.local,localhost")
done
for ((i = 0; i < workers; ++i)); do
  if [[ -n "$jobset" ]]; then id="w$i"; else id="ps-worker-$i"; fi
  worker_ids+=("$id")
  args+=("--worker=$id")
done
bash "$here/../tls/make_job_certs.sh" "$dir" "${args[@]}"

umask 077
token="$dir/token"
[[ -s "$token" ]] || openssl rand -hex 32 >"$token"

b64() { base64 -w0 <"$1"; }
secret() {  # name, then KEY=FILE pairs
  local name=$1 pair
  shift
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n' "$name"
  printf '  labels:\n    app.kubernetes.io/part-of: parameter-server\ntype: Opaque\ndata:\n'
  for pair in "$@"; do printf '  %s: %s\n' "${pair%%=*}" "$(b64 "${pair#*=}")"; done
}
{
  echo "# The job's Secrets (deploy/k8s/make_secrets.sh): kubectl apply -f this file."
  secret ps-job-token "token=$token"
  pairs=("ca.crt=$dir/ca.pem")
  for name in "${server_names[@]}"; do pairs+=("$name.crt=$dir/$name.pem" "$name.key=$dir/$name.key"); done
  secret ps-server-tls "${pairs[@]}"
  pairs=("ca.crt=$dir/ca.pem")
  for id in "${worker_ids[@]}"; do pairs+=("$id.crt=$dir/$id.pem" "$id.key=$dir/$id.key"); done
  secret ps-worker-tls "${pairs[@]}"
} >"$dir/secrets.yaml"
echo "make_secrets: wrote $dir/secrets.yaml (ps-job-token, ps-server-tls for ${server_names[*]}, ps-worker-tls for ${worker_ids[*]})"
