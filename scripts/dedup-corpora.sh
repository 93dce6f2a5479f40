#!/usr/bin/env bash
# The deduplication corpus of issue 23, built on this machine (nothing downloaded): ten
# ext4 images of the installed system's /usr (mkfs.ext4 -d, no mount), image k with
# FILES_CHANGED files (default 20) of its own changed: 4 KiB of random bytes written into
# each, at a place that depends on k. Ten images of /usr do not fit beside each other on
# this machine's disk, so each is made, handed to its consumer and removed before the
# next: the images are written in order into the named pipes DIRECTORY/image-0 …
# image-9, which a reader opens in the same order (their size in bytes is in
# DIRECTORY/image-bytes before the first is written), e.g.
#   scripts/dedup-corpora.sh /var/tmp/dedup &
#   ./target/release/stripelog bench dedupability --capacity 12GiB /var/tmp/dedup/image-{0..9}
# Usage: [IMAGES=10] [FILES_CHANGED=20] [SOURCE=/usr] [FORCE=1] scripts/dedup-corpora.sh DIRECTORY
# The tree of each image is a hard-linked copy of SOURCE (so it must be on the same
# filesystem as DIRECTORY) in which the changed files are replaced, never written through.
set -euo pipefail
. "$(dirname "$0")/common.sh"
directory=${1:?usage: scripts/dedup-corpora.sh DIRECTORY}
images=${IMAGES:-10}
changed=${FILES_CHANGED:-20}
source=${SOURCE:-/usr}
need mkfs.ext4 du cp find
mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
for name in tree image.ext4 image-bytes $(seq -f 'image-%g' 0 $((images - 1))); do
  refuse_existing "$directory/$name"
done
tree="$directory/tree"
image="$directory/image.ext4"
cleanup() { rm -rf "$tree" "$image"; }
trap cleanup EXIT
for index in $(seq 0 $((images - 1))); do
  rm -f "$directory/image-$index"
  mkfifo "$directory/image-$index"
done
# The regular files large enough to change, in a fixed order.
mapfile -t candidates < <(find "$source" -xdev -type f -size +64k 2>/dev/null | sort)
[ "${#candidates[@]}" -gt 0 ] || fail "no files over 64 KiB under $source"
mib=$(du -sm --apparent-size "$source" | cut -f1)
mib=$(( mib + mib / 4 + 256 ))
# The images' size, for a consumer that places them side by side in one volume.
echo $(( mib << 20 )) >"$directory/image-bytes"
for index in $(seq 0 $((images - 1))); do
  rm -rf "$tree" "$image"
  cp -al "$source" "$tree" 2>/dev/null || fail "cannot hard-link $source into $directory (another filesystem?)"
  if [ "$index" -gt 0 ]; then
    for change in $(seq 0 $((changed - 1))); do
      original=${candidates[$(( (index * 7919 + change * 104729) % ${#candidates[@]} ))]}
      copy="$tree${original#"$source"}"
      cp --remove-destination "$original" "$copy"
      size=$(stat -c %s "$copy")
      offset=$(( (index * 4096 + change * 12288) % size ))
      head -c 4096 /dev/urandom | dd of="$copy" bs=1 seek="$offset" conv=notrunc status=none
    done
  fi
  truncate -s "${mib}M" "$image"
  mkfs.ext4 -q -F -E root_owner=0:0 -d "$tree" "$image"
  echo "dedup-corpora: image $index ($(du -sh "$image" | cut -f1) used) -> $directory/image-$index" >&2
  cat "$image" >"$directory/image-$index"
  rm -f "$directory/image-$index"
done
