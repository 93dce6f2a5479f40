#!/usr/bin/env bash
# The compression corpora of issue 22, built on this machine (nothing downloaded), and
# what stripelog's compression would store for each (`stripelog bench compressibility`:
# the engine's own LZ4 fragments and packing over every 4 KiB block; reads only):
#   usr.ext4       an ext4 image holding a copy of the installed system's /usr
#                  (mkfs.ext4 -d: no mount needed)
#   pgbench.ext4   an ext4 image holding a PostgreSQL data directory after
#                  `pgbench -i -s 50` (the server stopped cleanly first)
#   fio-0.dat      1 GiB written by fio with buffer_compress_percentage=0
#   fio-75.dat     ... with buffer_compress_percentage=75
# Usage (as root: PostgreSQL runs as the postgres user):
#   [FIO_MIB=M] [PGBENCH_SCALE=S] [FORCE=1] scripts/compression-corpora.sh [DIRECTORY]
# The corpora stay in DIRECTORY for the NBD measurements; files of these names already
# there are refused (named) unless FORCE=1.
set -euo pipefail
. "$(dirname "$0")/common.sh"
directory=${1:-/var/tmp/stripelog-corpora}
fio_mib=${FIO_MIB:-1024}
scale=${PGBENCH_SCALE:-50}
stripelog=${STRIPELOG:-./target/release/stripelog}
postgres_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
need fio mkfs.ext4 pgbench runuser du
[ -n "$postgres_bin" ] || fail "PostgreSQL server is not installed (scripts/install-deps.sh)"
[ -x "$stripelog" ] || fail "build first: cargo build --release"
[ "$(id -u)" = 0 ] || fail "run as root (PostgreSQL runs as postgres)"
stripelog=$(realpath "$stripelog")
mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
corpora=("$directory/usr.ext4" "$directory/pgbench.ext4" "$directory/fio-0.dat" "$directory/fio-75.dat")
refuse_existing "${corpora[@]}" "$directory/pgdata"
rm -f "${corpora[@]}"

# An image a quarter larger than what it holds, at least 256 MiB.
image_of() {
  local source=$1 image=$2
  local mib
  mib=$(du -sm --apparent-size "$source" | cut -f1)
  mib=$(( mib + mib / 4 + 256 ))
  truncate -s "${mib}M" "$image"
  mkfs.ext4 -q -F -d "$source" "$image"
}

echo "compression-corpora: usr.ext4 (a copy of /usr)"
image_of /usr "$directory/usr.ext4"

echo "compression-corpora: pgbench.ext4 (pgbench -i -s $scale)"
rm -rf "$directory/pgdata"
mkdir "$directory/pgdata" && chown postgres "$directory/pgdata"
runuser -u postgres -- "$postgres_bin/initdb" -D "$directory/pgdata" >/dev/null 2>&1
runuser -u postgres -- "$postgres_bin/pg_ctl" -D "$directory/pgdata" -o "-p 5498 -k /tmp -c listen_addresses=''" \
  -l "$directory/pgdata/postgres.log" -w start >/dev/null
runuser -u postgres -- pgbench -h /tmp -p 5498 -i -s "$scale" -q postgres >/dev/null 2>&1
runuser -u postgres -- "$postgres_bin/pg_ctl" -D "$directory/pgdata" -m fast -w stop >/dev/null
image_of "$directory/pgdata" "$directory/pgbench.ext4"
rm -rf "$directory/pgdata"

for percent in 0 75; do
  echo "compression-corpora: fio-$percent.dat (buffer_compress_percentage=$percent)"
  fio --name=corpus --filename="$directory/fio-$percent.dat" --rw=write --bs=4k --size="${fio_mib}M" \
    --buffer_compress_percentage="$percent" --buffer_compress_chunk=4k --refill_buffers \
    --ioengine=psync --end_fsync=1 >/dev/null
done

"$stripelog" bench compressibility --quiet --json "$directory/compressibility.json" "${corpora[@]}"
