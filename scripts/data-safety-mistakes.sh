#!/usr/bin/env bash
# The administrators' mistakes of docs/data-safety.md, each tried with the release binary on
# five 256 MiB file members (RAID-5), as the issue that asked for the refusals reproduced them.
# Prints every command and what it answered, then reads back the data written at the start.
# Needs qemu-io (scripts/install-deps.sh). Usage: scripts/data-safety-mistakes.sh [DIRECTORY]
set -uo pipefail
stripelog="$(cd "$(dirname "$0")/.." && pwd)/target/release/stripelog"
[ -x "$stripelog" ] || { echo "build it first: cargo build --release" >&2; exit 1; }
directory="${1:-$(mktemp -d /var/tmp/stripelog-mistakes.XXXXXX)}"
mkdir -p "$directory" && cd "$directory" || exit 1
rm -f m? new* notes.txt other* data.img *.sock *.control *.log
members=(m0 m1 m2 m3 m4)

try() { # show a command and its answer (stderr too) and its exit status
  echo "\$ $*"
  "$@" 2>&1 | sed 's/^/    /' | head -12
  echo "    (exit ${PIPESTATUS[0]})"
}
serve() { # serve on $1, log to $1.log, wait for the socket
  "$stripelog" serve --socket "$1" "${@:2}" > "$1.log" 2>&1 &
  for _ in $(seq 100); do [ -S "$1" ] && grep -q ready "$1.log" && return; sleep 0.1; done
  cat "$1.log"
}
uri() { echo "nbd+unix:///stripelog?socket=$directory/$1"; }

"$stripelog" create --raid 5 --chunk 64KiB --member-size 256MiB "${members[@]}" > /dev/null
serve a.sock "${members[@]}"
qemu-io -f raw -t writeback "$(uri a.sock)" -c "write -P 0x5a 0 4M" -c flush > /dev/null

echo "== 1. two processes serve the same members; one process twice; maintenance beside a server"
try "$stripelog" serve --socket b.sock "${members[@]}"
try "$stripelog" serve --socket c.sock --export "x=$(IFS=,; echo "${members[*]}")" --export "y=$(IFS=,; echo "${members[*]}")"
try "$stripelog" scrub "${members[@]}"
try "$stripelog" bench mix "engine:$(IFS=,; echo "${members[*]}")" --force --duration 1s --quiet
echo "== 7. a write benchmark on an NBD export that holds data"
try "$stripelog" bench mix "$(uri a.sock)" --duration 1s --quiet
echo "== 3. replace a member with a live member of the same volume (online)"
try "$stripelog" replace --control a.sock.control --member 3 --with "$directory/m0"
kill -TERM %1; wait
echo "== 1. the second export of the same members in one process (offline now)"
try "$stripelog" serve --socket c.sock --export "x=$(IFS=,; echo "${members[*]}")" --export "y=$(IFS=,; echo "${members[*]}")"
echo "== 2. create over an existing volume; over a file holding data"
try "$stripelog" create --raid 5 "${members[@]}"
head -c 1048576 /dev/urandom > data.img
try "$stripelog" create --raid 5 --member-size 8MiB new0 new1 data.img
echo "== 3. replace with a live member (offline), with another volume's member, with a file holding data"
try "$stripelog" replace --member 3 --with m0 "${members[@]}"
"$stripelog" create --raid 5 --member-size 256MiB other0 other1 other2 > /dev/null
try "$stripelog" replace --member 3 --with other0 "${members[@]}"
try "$stripelog" replace --member 3 --with data.img "${members[@]}"
echo "== 4. serve --socket on a regular file"
echo "meeting at ten" > notes.txt
try "$stripelog" serve --socket notes.txt "${members[@]}"
try cat notes.txt
echo "== 5. a mistyped member path"
try "$stripelog" serve --socket d.sock m0 m1 m2 m3 m44
echo "== 6. a replaced member offered again"
try "$stripelog" replace --member 2 --with new2 "${members[@]}"
try "$stripelog" info "${members[@]}"
echo "== 8. RAID-10 survivability (4 members)"
"$stripelog" create --raid 10 --member-size 64MiB r0 r1 r2 r3 > /dev/null
try "$stripelog" info r0 r1 r2 r3
echo "== the data written at the start reads back"
serve e.sock m0 m1 new2 m3 m4
try qemu-io -f raw "$(uri e.sock)" -c "read -P 0x5a 0 4M"
kill -TERM %1 2>/dev/null; kill -TERM $(jobs -p) 2>/dev/null; wait
try "$stripelog" check m0 m1 new2 m3 m4
