#!/bin/sh
# Make a certificate authority and the certificate directories NBD over TLS needs, in the
# layout qemu's tls-creds-x509, libnbd's tls-certificates= and nbdkit read:
#   DIR/server/  ca-cert.pem server-cert.pem server-key.pem   (stripelog serve --tls-certificates)
#   DIR/NAME/    ca-cert.pem client-cert.pem client-key.pem   (one per client NAME, its CN)
# For tests and trials: a production CA is the operator's own (docs/tls.md).
# DIR must be empty or missing: keys and certificates already there (an authority's key,
# perhaps) are never overwritten unless FORCE=1.
# Usage: [FORCE=1] scripts/tls-certificates.sh DIR [CLIENT-NAME...]   (default client: client)
set -eu
. "$(dirname "$0")/common.sh"
directory=${1:?usage: $0 DIR [CLIENT-NAME...]}
shift
[ $# -gt 0 ] || set -- client
need openssl
refuse_existing "$directory"
mkdir -p "$directory/authority" "$directory/server"
cd "$directory"
quiet() { "$@" >/dev/null 2>&1 || { "$@"; fail "failed: $*"; }; }
quiet openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=stripelog test authority" \
    -keyout authority/ca-key.pem -out authority/ca-cert.pem
sign() { # sign NAME DIR PREFIX EXTENSIONS
    quiet openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$2/$3-key.pem" -out "$2/$3.csr"
    printf '%s\n' "$4" > "$2/$3.ext"
    quiet openssl x509 -req -in "$2/$3.csr" -CA authority/ca-cert.pem -CAkey authority/ca-key.pem \
        -CAcreateserial -days 3650 -extfile "$2/$3.ext" -out "$2/$3-cert.pem"
    rm -f "$2/$3.csr" "$2/$3.ext"
    cp authority/ca-cert.pem "$2/ca-cert.pem"
    chmod 600 "$2/$3-key.pem"
}
sign localhost server server "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage=serverAuth"
for name in "$@"; do
    mkdir -p "$name"
    sign "$name" "$name" client "extendedKeyUsage=clientAuth"
done
