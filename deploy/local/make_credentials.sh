#!/usr/bin/env bash
# Makes a throwaway CA, a server certificate (for 127.0.0.1, ::1, localhost
# and any extra names given), two client certificates (for mutual TLS: each
# a worker identity) and a bearer token, with Debian's openssl, into DIR:
#   ca.pem  server.pem server.key  client.pem client.key
#   client2.pem client2.key  token
# Keys and the token are mode 0600. For a local cluster and tests; a real
# deployment brings its own (deploy/helm/README.md).
# Usage: make_credentials.sh DIR [EXTRA_DNS_OR_IP ...]
set -euo pipefail
dir="$1"
shift
mkdir -p "$dir"
umask 077
san="IP:127.0.0.1,IP:::1,DNS:localhost"
for name in "$@"; do
  if [[ "$name" =~ ^[0-9.:]+$ ]]; then san="$san,IP:$name"; else san="$san,DNS:$name"; fi
done
openssl_quiet() { openssl "$@" 2>/dev/null; }
openssl_quiet req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 3650 -subj "/CN=muonps local CA"
for role in server client client2; do
  openssl_quiet req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$role.key" -out "$dir/$role.csr" -subj "/CN=muonps-$role"
  ext="$dir/$role.ext"
  if [[ "$role" == server ]]; then
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" >"$ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$ext"
  fi
  openssl_quiet x509 -req -in "$dir/$role.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$dir/$role.pem" -days 3650 -extfile "$ext"
  rm -f "$dir/$role.csr" "$ext"
done
rm -f "$dir/ca.key" "$dir/ca.srl"
openssl rand -hex 32 >"$dir/token"
chmod 0644 "$dir/ca.pem" "$dir/server.pem" "$dir/client.pem" "$dir/client2.pem"
