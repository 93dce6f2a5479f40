#!/usr/bin/python3
"""Write the images of scripts/dedup-corpora.sh through NBD, side by side, and count what
exact deduplication would keep (issue 23; used by scripts/bench-dedup.sh).

Usage: dedup-images.py IMAGE_BYTES CONTROL_SOCKET URI [URI_FIRST_ONLY] IMAGE...

Image k is written at k x IMAGE_BYTES of URI (1 MiB requests, one at a time, in
order; chunks of zeros are skipped: the volume is fresh); the first image is also written
to URI_FIRST_ONLY when given ("-": none). After each image: a flush, then the served
volume's counters through CONTROL_SOCKET (`{"command":"status"}`), and one JSON line on
standard output: the non-zero blocks so far, the distinct ones among them (exact
deduplication, by BLAKE2b-128 name), and the server's own figures.

For runs across server restarts (scripts/bench-dedup.sh, part "restarts"), three
environment variables: STATE_FILE keeps the exact count (names and non-zero blocks)
between calls; FIRST_INDEX is the index of the first image given (its place in URI);
PARTIAL=F writes only the first fraction F of the first image given, counting nothing and
printing nothing (a write cut short by a crash: the next call writes that image whole).

Needs the libnbd Python binding (Debian python3-libnbd, as for nbdsh), hence
/usr/bin/python3.
"""

import hashlib
import json
import os
import pickle
import socket
import sys
import time

import nbd

CHUNK_BYTES = 1 << 20
BLOCK_BYTES = 4096
ZERO_CHUNK = bytes(CHUNK_BYTES)
ZERO_BLOCK = bytes(BLOCK_BYTES)


def status(control):
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(control)
        connection.sendall(b'{"command":"status"}\n')
        reply = b""
        while not reply.endswith(b"\n"):
            part = connection.recv(1 << 16)
            if not part:
                break
            reply += part
    message = json.loads(reply)
    if "report" not in message:
        raise SystemExit(f"dedup-images: the server said {message}")
    return message["report"]


def connect(uri):
    handle = nbd.NBD()
    handle.connect_uri(uri)
    return handle


def main():
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    image_bytes = int(sys.argv[1])
    control, uri, first_only = sys.argv[2], sys.argv[3], sys.argv[4]
    images = sys.argv[5:]
    handle = connect(uri)
    first_handle = connect(first_only) if first_only != "-" else None
    state_file = os.environ.get("STATE_FILE")
    names, non_zero = set(), 0
    if state_file and os.path.exists(state_file):
        with open(state_file, "rb") as state:
            names, non_zero = pickle.load(state)
    first_index = int(os.environ.get("FIRST_INDEX", "0"))
    partial = float(os.environ["PARTIAL"]) if os.environ.get("PARTIAL") else None
    started = time.time()
    for index, path in enumerate(images, start=first_index):
        limit = int(image_bytes * partial) if partial is not None else image_bytes
        targets = [handle] + ([first_handle] if index == 0 and first_handle else [])
        offset = 0
        with open(path, "rb", buffering=0) as image:
            while True:
                chunk = image.read(CHUNK_BYTES)
                while chunk and len(chunk) < CHUNK_BYTES:
                    more = image.read(CHUNK_BYTES - len(chunk))
                    if not more:
                        break
                    chunk += more
                if not chunk or offset >= limit:
                    break
                if offset + len(chunk) > image_bytes:
                    raise SystemExit(f"dedup-images: {path} is larger than {image_bytes} bytes")
                if chunk != ZERO_CHUNK[: len(chunk)]:
                    for start in range(0, len(chunk), BLOCK_BYTES) if partial is None else ():
                        block = chunk[start : start + BLOCK_BYTES]
                        if block != ZERO_BLOCK[: len(block)]:
                            non_zero += 1
                            names.add(hashlib.blake2b(block, digest_size=16).digest())
                    for target, base in zip(targets, [index * image_bytes, 0]):
                        # One request at a time: the Python binding's asynchronous writes
                        # kept every buffer (12 GB after two images).
                        target.pwrite(chunk, base + offset)
                offset += len(chunk)
        if partial is not None:
            break  # (no flush: the crash comes before one)
        for target in targets:
            target.flush()
        report = status(control)
        print(
            json.dumps(
                {
                    "image": index,
                    "seconds": round(time.time() - started, 1),
                    "non_zero_blocks": non_zero,
                    "exact_kept_blocks": len(names),
                    "held_blocks": (report.get("stored_data_bytes") or report["thin_provisioning"]["held_data_bytes"])
                    // BLOCK_BYTES,
                    "deduplication": report.get("deduplication"),
                }
            ),
            flush=True,
        )
    if state_file and partial is None:
        with open(state_file, "wb") as state:
            pickle.dump((names, non_zero), state)
    handle.shutdown()
    if first_handle:
        first_handle.shutdown()


main()
