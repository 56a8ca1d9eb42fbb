#!/usr/bin/env bash
# Makes a throwaway PKI for TLS and mutual-TLS tests and local clusters:
#
#   deploy/tls/make_test_certs.sh DIR [extra server names...]
#
# writes into DIR (created if missing; files there are replaced):
#   ca.pem ca.key                   a test CA
#   server.pem server.key           signed by it; SAN DNS:localhost,
#                                   IP:127.0.0.1, DNS:server and each extra
#                                   name (an IPv4/IPv6 address becomes an IP
#                                   SAN, anything else a DNS SAN)
#   worker.pem worker.key           a client certificate (extendedKeyUsage
#                                   clientAuth) signed by the CA
#   w0.pem w0.key w1.pem w1.key     per-worker client certificates signed
#                                   by the CA, CN and subjectAltName
#                                   (DNS) = the worker id: under mutual TLS
#                                   a worker registers only as the id its
#                                   certificate names (docs/security.md)
#   other-ca.pem                    a second, unrelated CA, and
#   other-worker.pem other-worker.key  a client certificate signed by it,
#                                   for tests that must be refused
#
# Keys are P-256, unencrypted PKCS#8, mode 0600; certificates mode 0644 and
# valid for 30 days. Needs Debian's openssl (deploy/setup.sh installs it) and
# nothing of the system's openssl.cnf. Quiet: prints the files it wrote, and
# openssl's output only when a step fails. Not for production keys.
set -euo pipefail

if (($# < 1)); then
  echo "usage: $0 DIR [extra server names...]" >&2
  exit 2
fi
dir=$1
shift

readonly days=30
mkdir -p "$dir"
umask 077
# Everything is made in a private directory inside DIR, then renamed into
# place, so a rerun replaces files whatever their old modes were.
tmp=$(mktemp -d "$dir/.make_test_certs.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log="$tmp/openssl.log"

run() {
  if ! "$@" >>"$log" 2>&1; then
    echo "make_test_certs: failed: $*" >&2
    cat "$log" >&2
    exit 1
  fi
}

# server SAN: the defaults, then the extra names.
san="DNS:localhost,IP:127.0.0.1,DNS:server"
for name in "$@"; do
  if [[ $name =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $name == *:* ]]; then
    san+=",IP:$name"
  else
    san+=",DNS:$name"
  fi
done

cat >"$tmp/openssl.cnf" <<CNF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF

new_key() {  # name
  run openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/$1.key"
}

new_ca() {  # name common-name
  new_key "$1"
  run openssl req -new -x509 -config "$tmp/openssl.cnf" -extensions ca_ext \
    -key "$tmp/$1.key" -subj "/CN=$2" -days "$days" -sha256 \
    -set_serial "0x$(openssl rand -hex 16)" -out "$tmp/$1.pem"
}

new_leaf() {  # name common-name extensions ca
  new_key "$1"
  run openssl req -new -config "$tmp/openssl.cnf" -key "$tmp/$1.key" -subj "/CN=$2" \
    -out "$tmp/$1.csr"
  run openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/$4.pem" -CAkey "$tmp/$4.key" \
    -extfile "$tmp/openssl.cnf" -extensions "$3" -days "$days" -sha256 \
    -set_serial "0x$(openssl rand -hex 16)" -out "$tmp/$1.pem"
}

# One client extension per worker id: its subjectAltName is the id.
readonly worker_ids=(w0 w1)
for id in "${worker_ids[@]}"; do
  cat >>"$tmp/openssl.cnf" <<CNF
[client_${id}_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:$id
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF
done

new_ca ca "ps test CA"
new_leaf server server server_ext ca
new_leaf worker worker client_ext ca
for id in "${worker_ids[@]}"; do
  new_leaf "$id" "$id" "client_${id}_ext" ca
done
new_ca other-ca "ps other test CA"
new_leaf other-worker other-worker client_ext other-ca

written=()
for f in ca.pem ca.key server.pem server.key worker.pem worker.key \
         w0.pem w0.key w1.pem w1.key \
         other-ca.pem other-worker.pem other-worker.key; do
  case $f in
    *.key) chmod 600 "$tmp/$f" ;;
    *) chmod 644 "$tmp/$f" ;;
  esac
  mv -f "$tmp/$f" "$dir/$f"
  written+=("$dir/$f")
done
echo "make_test_certs: wrote ${written[*]} (server SAN $san, valid $days days)"
