#!/usr/bin/env bash
# What a durable 4 KiB write costs this machine's disk, without any server in the way:
# the floor under `stripelog serve`'s flush without a write log (issue 21).
#
#   - buffered 4 KiB pwrite + fdatasync on one file: what `nbdkit file` does per fio
#     `--fsync=1` write;
#   - one O_DIRECT 4 KiB write + fdatasync;
#   - N O_DIRECT 4 KiB writes submitted together (Linux AIO, one per member file) + one
#     fdatasync, and the same + one syncfs: a short stripe row of N members made durable
#     (RAID-5 on 5 members writes 5 blocks: summary, data, 2 padding, parity; a stripe row
#     needs at least the data and its parity, 2 blocks).
#
# Usage: [MEMBERS=5] [ROUNDS=3] [OPERATIONS=2000] [FORCE=1] scripts/sync-floor.sh [DIRECTORY]
# DIRECTORY (default /tmp/stripelog-sync-floor) should be on the disk the members live on.
# Needs a C compiler (cc). Prints the mean latency in µs of each pattern, median of ROUNDS.
set -euo pipefail
directory=${1:-/tmp/stripelog-sync-floor}
members=${MEMBERS:-5}
rounds=${ROUNDS:-3}
operations=${OPERATIONS:-2000}
command -v cc >/dev/null || { echo "sync-floor: a C compiler (cc) is needed" >&2; exit 1; }
mkdir -p "$directory"
# The files this run writes and removes: any already there may be somebody's data, so
# they are refused (named) unless FORCE=1.
own_files=("$directory/floor-probe")
for member in $(seq 0 "$members"); do own_files+=("$directory/floor-file-$member"); done
if [ "${FORCE:-0}" != 1 ]; then
  for file in "${own_files[@]}"; do
    [ -e "$file" ] && { echo "sync-floor: $file exists (it would be overwritten and removed): FORCE=1 to go on" >&2; exit 1; }
  done
fi
trap 'rm -f "${own_files[@]}"' EXIT
for member in $(seq 0 "$members"); do
  dd if=/dev/zero of="$directory/floor-file-$member" bs=1M count=256 oflag=direct status=none
done
cc -O2 -o "$directory/floor-probe" -x c - <<'EOF'
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
  const char *directory = argv[1];
  int members = atoi(argv[2]), operations = atoi(argv[3]);
  char *block;
  if (posix_memalign((void **)&block, 4096, 4096)) return 1;
  memset(block, 0x5a, 4096);
  int direct[64], buffered;
  char path[4096];
  for (int member = 0; member < members; member++) {
    snprintf(path, sizeof path, "%s/floor-file-%d", directory, member);
    if ((direct[member] = open(path, O_RDWR | O_DIRECT)) < 0) { perror(path); return 1; }
  }
  snprintf(path, sizeof path, "%s/floor-file-%d", directory, members);
  if ((buffered = open(path, O_RDWR)) < 0) { perror(path); return 1; }
  aio_context_t context = 0;
  if (syscall(SYS_io_setup, 64, &context)) { perror("io_setup"); return 1; }
  const long blocks = (256L << 20) / 4096;
  double started = now_us();
  for (int i = 0; i < operations; i++) {
    if (pwrite(buffered, block, 4096, (random() % blocks) * 4096) != 4096 || fdatasync(buffered)) return 1;
  }
  printf("buffered %.1f\n", (now_us() - started) / operations);
  started = now_us();
  for (int i = 0; i < operations; i++) {
    if (pwrite(direct[0], block, 4096, (i % blocks) * 4096) != 4096 || fdatasync(direct[0])) return 1;
  }
  printf("direct-one %.1f\n", (now_us() - started) / operations);
  for (int sync_kind = 0; sync_kind < 2; sync_kind++) {
    for (int written = 2; written <= members; written += members - 2 > 0 ? members - 2 : 1) {
      started = now_us();
      for (int i = 0; i < operations; i++) {
        struct iocb requests[64], *pointers[64];
        struct io_event events[64];
        for (int member = 0; member < written; member++) {
          memset(&requests[member], 0, sizeof requests[member]);
          requests[member].aio_fildes = direct[member];
          requests[member].aio_lio_opcode = IOCB_CMD_PWRITE;
          requests[member].aio_buf = (unsigned long)block;
          requests[member].aio_nbytes = 4096;
          requests[member].aio_offset = (i % blocks) * 4096;
          pointers[member] = &requests[member];
        }
        if (syscall(SYS_io_submit, context, written, pointers) != written) { perror("io_submit"); return 1; }
        for (int done = 0; done < written;) {
          long got = syscall(SYS_io_getevents, context, 1, written - done, events, NULL);
          if (got < 0) { perror("io_getevents"); return 1; }
          done += got;
        }
        if (sync_kind == 0 ? fdatasync(direct[0]) : syncfs(direct[0])) return 1;
      }
      printf("rows-%d-%s %.1f\n", written, sync_kind == 0 ? "fdatasync" : "syncfs", (now_us() - started) / operations);
      if (members == 2) break;
    }
  }
  return 0;
}
EOF
declare -A results
for _ in $(seq "$rounds"); do
  while read -r name value; do results[$name]+="$value "; done < <("$directory/floor-probe" "$directory" "$members" "$operations")
done
median() { python3 -c 'import statistics,sys; print(round(statistics.median(float(x) for x in sys.argv[1:]), 1))' "$@"; }
describe() {
  case $1 in
    buffered) echo "buffered 4 KiB write + fdatasync (nbdkit file)" ;;
    direct-one) echo "one O_DIRECT 4 KiB write + fdatasync" ;;
    rows-*) local parts=(${1//-/ }); echo "${parts[1]} O_DIRECT 4 KiB writes at once (one per file) + one ${parts[2]}" ;;
  esac
}
echo "| pattern ($members files on $(df --output=source "$directory" | tail -1)) | mean µs (median of $rounds) |"
echo "|---|---:|"
for name in buffered direct-one rows-2-fdatasync rows-$members-fdatasync rows-2-syncfs rows-$members-syncfs; do
  [ -n "${results[$name]:-}" ] || continue
  printf '| %s | %s |\n' "$(describe "$name")" "$(median ${results[$name]})"
done
