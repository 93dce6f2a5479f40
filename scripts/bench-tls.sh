#!/usr/bin/env bash
# What NBD over TLS costs (docs/tls.md; results in BENCHMARKS.md, "NBD over TLS"): nbdcopy
# writes SIZE of random bytes into the export and reads them back, over loopback TCP, in
# plain and through TLS (STARTTLS, certificates of scripts/tls-certificates.sh), to
# `stripelog serve` (RAID-5 on 3 member files in WORK_DIRECTORY) and to `nbdkit memory`
# (GnuTLS), the peer. Prints MB/s for each and the ratios TLS ÷ plain and stripelog ÷ nbdkit.
# Each copy runs REPEATS times; the best is kept (the machine is small and noisy). The
# first stripelog copy fills a fresh volume; the later ones overwrite it.
# Usage: [SIZE=1GiB] [REPEATS=3] [FORCE=1] scripts/bench-tls.sh [WORK_DIRECTORY]
# WORK_DIRECTORY (default /dev/shm/stripelog-bench-tls: the members' speed out of the
# way): member files, credentials/ or source.bin already there are refused unless FORCE=1.
set -euo pipefail
work=${1:-/dev/shm/stripelog-bench-tls}
size=${SIZE:-1GiB}
repeats=${REPEATS:-3}
stripelog=${STRIPELOG:-./target/release/stripelog}
scripts=$(cd "$(dirname "$0")" && pwd)
for tool in nbdcopy nbdkit openssl; do
  command -v "$tool" >/dev/null || { echo "bench-tls: $tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -x "$stripelog" ] || { echo "bench-tls: build first: cargo build --release" >&2; exit 1; }
stripelog=$(realpath "$stripelog")
mkdir -p "$work"
work=$(cd "$work" && pwd)
found=$(for path in "$work"/member-* "$work/credentials" "$work/source.bin"; do
  if [ -e "$path" ]; then printf '%s ' "$path"; fi
done)
if [ "${FORCE:-0}" != 1 ] && [ -n "$found" ]; then
  echo "bench-tls: $work holds ${found}of an earlier run; give FORCE=1 to overwrite them" >&2
  exit 1
fi
bytes=$(numfmt --from=iec-i "${size%B}")
rm -rf "$work/credentials"
sh "$scripts/tls-certificates.sh" "$work/credentials" client
head -c "$bytes" /dev/urandom > "$work/source.bin"
# Members big enough for SIZE at the default 20 % spare, with room to spare.
member_bytes=$(( bytes * 3 / 4 + (256 << 20) ))
"$stripelog" create --force --raid 5 --member-size "$member_bytes" "$work"/member-{0,1,2} >/dev/null
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
server=""
stop() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; server=""; }
trap stop EXIT
wait_for_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "bench-tls: nothing listens on $port" >&2; exit 1
}
# copy_rates URI: one write then one read of the whole export (holes skipped through
# base:allocation), "write_MBps read_MBps".
copy_rates() {
  local uri=$1 start middle end
  start=$(date +%s.%N)
  nbdcopy --flush "$work/source.bin" "$uri"
  middle=$(date +%s.%N)
  nbdcopy "$uri" null:
  end=$(date +%s.%N)
  python3 -c "print($bytes / ($middle - $start) / 1e6, $bytes / ($end - $middle) / 1e6)"
}
certificates="tls-certificates=$work/credentials/client"
declare -A rate
# Repeats outermost, so every setting meets the machine's good and bad moments alike.
for _ in $(seq "$repeats"); do
  for target in stripelog nbdkit; do
    for mode in plain tls; do
      if [ "$target" = stripelog ]; then
        tls_arguments=(); [ "$mode" = tls ] && tls_arguments=(--tls-certificates "$work/credentials/server")
        "$stripelog" serve --log-level warn --listen "$port" "${tls_arguments[@]}" "$work"/member-{0,1,2} &
        export_name=stripelog
      else
        tls_arguments=(--tls=off)
        [ "$mode" = tls ] && tls_arguments=(--tls=require "--tls-certificates=$work/credentials/server")
        nbdkit --foreground --exit-with-parent --port "$port" -i 127.0.0.1 "${tls_arguments[@]}" memory "$bytes" &
        export_name=""
      fi
      server=$!
      wait_for_port
      if [ "$mode" = tls ]; then uri="nbds://localhost:$port/$export_name?$certificates"
      else uri="nbd://localhost:$port/$export_name"; fi
      read -r write read < <(copy_rates "$uri")
      previous=${rate[$target.$mode]:-0 0}
      rate[$target.$mode]=$(python3 -c "p='$previous'.split(); print(max(float(p[0]), $write), max(float(p[1]), $read))")
      stop
    done
  done
done
python3 - "${rate[stripelog.plain]}" "${rate[stripelog.tls]}" "${rate[nbdkit.plain]}" "${rate[nbdkit.tls]}" "$size" <<'PYTHON'
import sys
sp, st, kp, kt = ([float(x) for x in sys.argv[i].split()] for i in range(1, 5))
print(f"nbdcopy of {sys.argv[5]} of random bytes over loopback TCP, best of the repeats, MB/s")
print(f"{'':24}{'write':>10}{'read':>10}")
for name, (write, read) in [("stripelog plain", sp), ("stripelog TLS", st), ("nbdkit memory plain", kp), ("nbdkit memory TLS", kt)]:
    print(f"{name:24}{write:10.0f}{read:10.0f}")
print(f"{'stripelog TLS ÷ plain':24}{st[0]/sp[0]:10.2f}{st[1]/sp[1]:10.2f}")
print(f"{'nbdkit TLS ÷ plain':24}{kt[0]/kp[0]:10.2f}{kt[1]/kp[1]:10.2f}")
print(f"{'stripelog ÷ nbdkit, TLS':24}{st[0]/kt[0]:10.2f}{st[1]/kt[1]:10.2f}")
PYTHON
