#!/usr/bin/env bash
# Install the Debian packages stripelog's tests and tools need, when they are missing.
# Idempotent: does nothing when everything is there. Needs root (or sudo) only to install.
set -euo pipefail

# One line per package: why it is needed.
packages=(
  libnbd-bin      # nbdinfo, nbdcopy and nbdfuse: NBD clients the NBD server's tests drive it with
  python3-libnbd  # nbdsh: scripted NBD client (Python) for the server's tests
  nbdkit          # a reference NBD server, to check the client tests themselves against
  qemu-utils      # qemu-io and qemu-img: QEMU's NBD client, as a virtual machine would use the export
  fio             # fio's nbd engine: load on the NBD server (benchmarks and stress)
  fuse3           # fusermount3: mounting an export with nbdfuse (FUSE tests)
  e2fsprogs       # mkfs.ext4 and e2fsck: a real file system on the export (FUSE/loop tests)
  python3-prometheus-client  # the Prometheus project's own text-format parser, to check `serve --metrics`
  systemd         # systemd-analyze verify: the installed stripelog@.service is checked by systemd itself
  man-db          # man: systemd-analyze verify checks the unit's Documentation= man page exists
  openssl         # a certificate authority and certificates made per test run for NBD over TLS (scripts/tls-certificates.sh)
  fonts-dejavu-core  # a TrueType font for the benchmark's SVG and PNG charts (plotters lays text out with it)
)

# rustfmt and clippy for `make lint`: rustup components of the toolchain, when its profile
# left them out.
for component in rustfmt clippy; do
  command_name=$([ "$component" = rustfmt ] && echo fmt || echo clippy)
  if ! cargo "$command_name" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null; then
      echo "install-deps: adding the $component component with rustup"
      rustup component add "$component"
    else
      echo "install-deps: cargo $command_name is missing and rustup is not here to add it" >&2
      exit 1
    fi
  fi
done

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: nothing to install"
  exit 0
fi

if ! command -v apt-get >/dev/null; then
  echo "install-deps: apt-get not found; install these yourself: ${missing[*]}" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
