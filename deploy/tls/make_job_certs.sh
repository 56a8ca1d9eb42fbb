#!/usr/bin/env bash
# Makes one training job's PKI for mutual TLS: a job CA, a server
# certificate per shard and a client certificate per worker.
#
#   deploy/tls/make_job_certs.sh DIR --server=NAME[,SAN...] ... --worker=ID ...
#       [--days=N] [--reuse_ca] [--force]
#
#   --server=NAME[,SAN...]  one shard: NAME.pem/NAME.key, CN=NAME, SANs NAME and
#                           every SAN listed (an IPv4/IPv6 address becomes an
#                           IP SAN, anything else a DNS SAN), extendedKeyUsage
#                           serverAuth and clientAuth (clientAuth so that the
#                           shard's own health check, ps-health, can present
#                           it to its mutual-TLS port)
#   --worker=ID             one worker: ID.pem/ID.key, CN=ID and
#                           subjectAltName DNS:ID, extendedKeyUsage clientAuth.
#                           The server admits a registration for worker id ID
#                           only from a certificate naming ID, so ID must be
#                           the worker's --worker_id (w0, w1, ...)
#   --days=N                validity of every certificate (365)
#   --reuse_ca              DIR holds a CA already (ca.pem, ca.key): issue
#                           with it (a worker added to a running job)
#   --force                 replace DIR's CA with a new one; every certificate
#                           it signed stops being trusted
#
# Without --reuse_ca or --force, a DIR that holds a CA is refused (exit 3),
# so a rerun never silently replaces the trust root of a running job.
# Writes ca.pem (give it to everyone), ca.key (keep it off the job's
# machines), and a .pem and .key per name; keys are P-256, unencrypted
# PKCS#8, mode 0600; certificates mode 0644. Files are made in a private
# folder and renamed into place, the CA last, so a DIR with ca.pem holds a
# complete set. Needs only the openssl command (Debian's openssl package;
# the ps-server image has it as ps-make-job-certs). IDs and names are
# [A-Za-z0-9._-], up to 64 characters.
set -euo pipefail

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }

dir="" days=365 reuse_ca=0 force=0 servers=() workers=()
for arg in "$@"; do
  case "$arg" in
    --server=*) servers+=("${arg#*=}") ;;
    --worker=*) workers+=("${arg#*=}") ;;
    --days=*) days="${arg#*=}" ;;
    --reuse_ca) reuse_ca=1 ;;
    --force) force=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "make_job_certs: unknown flag $arg (see --help)" >&2; exit 2 ;;
    *)
      if [[ -n "$dir" ]]; then echo "make_job_certs: one DIR only (see --help)" >&2; exit 2; fi
      dir=$arg ;;
  esac
done
if [[ -z "$dir" ]] || ((${#servers[@]} + ${#workers[@]} == 0)); then
  echo "usage: $0 DIR --server=NAME[,SAN...] ... --worker=ID ... (see --help)" >&2
  exit 2
fi
[[ "$days" =~ ^[1-9][0-9]*$ ]] || { echo "make_job_certs: --days=$days is no positive number" >&2; exit 2; }

valid_name() { [[ "$1" =~ ^[A-Za-z0-9._-]{1,64}$ && "$1" != ca && "$1" != . && "$1" != .. ]]; }
declare -A seen=()
for entry in "${servers[@]}" "${workers[@]}"; do
  name=${entry%%,*}
  if ! valid_name "$name"; then
    echo "make_job_certs: '$name' is no valid name ([A-Za-z0-9._-], 1-64 characters, not 'ca')" >&2
    exit 2
  fi
  if [[ -n "${seen[$name]:-}" ]]; then echo "make_job_certs: '$name' is named twice" >&2; exit 2; fi
  seen[$name]=1
done

mkdir -p "$dir"
if [[ -e "$dir/ca.pem" || -e "$dir/ca.key" ]]; then
  if ((force)); then
    reuse_ca=0
  elif ((reuse_ca)); then
    [[ -r "$dir/ca.pem" && -r "$dir/ca.key" ]] || {
      echo "make_job_certs: --reuse_ca needs both $dir/ca.pem and $dir/ca.key" >&2; exit 3; }
  else
    echo "make_job_certs: $dir already holds a CA; --reuse_ca issues with it, --force replaces it" >&2
    exit 3
  fi
elif ((reuse_ca)); then
  echo "make_job_certs: --reuse_ca: $dir holds no CA" >&2
  exit 3
fi

umask 077
tmp=$(mktemp -d "$dir/.make_job_certs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log="$tmp/openssl.log"
run() {
  if ! "$@" >>"$log" 2>&1; then
    echo "make_job_certs: failed: $*" >&2
    cat "$log" >&2
    exit 1
  fi
}

san_of() {  # NAME,SAN,... -> DNS:NAME,DNS:SAN,IP:...
  local out="" part
  IFS=, read -r -a parts <<<"$1"
  for part in "${parts[@]}"; do
    [[ -z "$part" ]] && continue
    if [[ $part =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $part == *:* ]]; then
      out+="${out:+,}IP:$part"
    else
      out+="${out:+,}DNS:$part"
    fi
  done
  echo "$out"
}

# One extensions file per certificate (the SANs differ); nothing of the
# system's openssl.cnf is read.
extensions() {  # kind san
  echo "basicConstraints = critical, CA:FALSE"
  echo "subjectKeyIdentifier = hash"
  echo "authorityKeyIdentifier = keyid"
  echo "subjectAltName = $2"
  case "$1" in
    server) echo "keyUsage = critical, digitalSignature, keyEncipherment"
            echo "extendedKeyUsage = serverAuth, clientAuth" ;;
    worker) echo "keyUsage = critical, digitalSignature"
            echo "extendedKeyUsage = clientAuth" ;;
  esac
}
cat >"$tmp/req.cnf" <<'CNF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
CNF

new_key() { run openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/$1.key"; }

if ((reuse_ca)); then
  cp "$dir/ca.pem" "$dir/ca.key" "$tmp/"
else
  new_key ca
  run openssl req -new -x509 -config "$tmp/req.cnf" -extensions ca_ext -key "$tmp/ca.key" \
    -subj "/CN=ps job CA $(openssl rand -hex 4)" -days "$days" -sha256 \
    -set_serial "0x$(openssl rand -hex 16)" -out "$tmp/ca.pem"
fi

leaf() {  # kind name san
  new_key "$2"
  extensions "$1" "$3" >"$tmp/$2.ext"
  run openssl req -new -config "$tmp/req.cnf" -key "$tmp/$2.key" -subj "/CN=$2" -out "$tmp/$2.csr"
  run openssl x509 -req -in "$tmp/$2.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
    -extfile "$tmp/$2.ext" -days "$days" -sha256 -set_serial "0x$(openssl rand -hex 16)" \
    -out "$tmp/$2.pem"
}

names=()
for entry in "${servers[@]}"; do
  leaf server "${entry%%,*}" "$(san_of "$entry")"
  names+=("${entry%%,*}")
done
for id in "${workers[@]}"; do
  leaf worker "$id" "DNS:$id"
  names+=("$id")
done

for name in "${names[@]}" ca; do
  chmod 600 "$tmp/$name.key"
  chmod 644 "$tmp/$name.pem"
done
for name in "${names[@]}"; do
  mv -f "$tmp/$name.key" "$dir/$name.key"
  mv -f "$tmp/$name.pem" "$dir/$name.pem"
done
if ((!reuse_ca)); then
  mv -f "$tmp/ca.key" "$dir/ca.key"
  mv -f "$tmp/ca.pem" "$dir/ca.pem"
fi
echo "make_job_certs: $dir: CA $( ((reuse_ca)) && echo reused || echo new), certificates for ${names[*]} (valid $days days)"
