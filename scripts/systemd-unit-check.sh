#!/usr/bin/env bash
# Start stripelog@.service for real under systemd, on a machine whose PID 1 is not
# systemd (a container, a CI VM): systemd boots as PID 1 in new mount, PID and cgroup
# namespaces, on an overlay of / whose changes live in a tmpfs and vanish with it. The
# unit is installed there by scripts/install.sh, on a volume of three file members, and:
#   - `systemctl start` returns once serve sent READY=1, the status reads "serving";
#   - SIGKILL of the server: systemd restarts it (Restart=on-failure), volume recovered;
#   - `systemctl stop`: the volume is closed cleanly (info: holder not open);
#   - a member absent at start: the status says what it waits for, the start completes
#     when the member appears;
#   - a member that never appears: each start fails after --wait-for-members, and after
#     3 starts (StartLimitBurst) systemd stops trying.
#   scripts/systemd-unit-check.sh [BINARY]     (root; default target/debug/stripelog)
# Needs root, unshare(1), nsenter(1), systemd and overlayfs. Prints PASS or the failure.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
binary=$(realpath "${1:-$here/target/debug/stripelog}")

if [[ ${STRIPELOG_IN_NAMESPACE:-} != 1 ]]; then
  work=$(mktemp -d /tmp/stripelog-systemd-XXXXXX)
  mkdir -p "$work/layers" "$work/root"
  # Re-run this script as the first process of new namespaces; it execs systemd.
  STRIPELOG_IN_NAMESPACE=1 WORK=$work BINARY=$binary HERE=$here \
    unshare --mount --pid --fork --cgroup --uts --ipc "$0" >"$work/boot.log" 2>&1 &
  namespace=$!
  # systemd as PID 1 takes SIGTERM as "re-execute": SIGKILL ends it and its namespace.
  init=
  # Its mount points in $work are busy until the kernel has torn the namespace down.
  trap 'set +e; [[ -n $init ]] && kill -KILL "$init" 2>/dev/null; wait "$namespace" 2>/dev/null
        while kill -0 "$namespace" 2>/dev/null; do sleep 0.1; done
        for _ in $(seq 100); do rm -rf "$work" 2>/dev/null && break; sleep 0.1; done' EXIT
  for _ in $(seq 100); do
    init=$(pgrep -P "$namespace" || true)
    [[ -n $init ]] && [[ $(cat "/proc/$init/comm" 2>/dev/null) == systemd ]] && break
    sleep 0.1
  done
  [[ -n ${init:-} ]] || { cat "$work/boot.log"; echo "FAIL: systemd did not start"; exit 1; }
  inside() { timeout 150 nsenter -t "$init" -m -p -r -w "$@"; }
  for _ in $(seq 100); do
    state=$(inside systemctl is-system-running 2>/dev/null || true)
    [[ $state == running || $state == degraded ]] && break
    sleep 0.2
  done
  show() { inside systemctl show stripelog@vol -p "$1" --value; }
  fail() { echo "FAIL: $*"; inside journalctl -u stripelog@vol --no-pager -o cat | tail -20; exit 1; }
  members="/var/lib/sltest/m0 /var/lib/sltest/m1 /var/lib/sltest/m2"
  holder_open() {
    # shellcheck disable=SC2086
    inside /usr/local/bin/stripelog info --json $members | python3 -c 'import json,sys; print(json.load(sys.stdin)["holder"]["open"])'
  }

  inside systemctl start stripelog@vol || fail "start"
  [[ $(show StatusText) == "serving 1 export(s) on /run/stripelog/vol.sock" ]] || fail "status: $(show StatusText)"
  echo "start: returned once ready; status: $(show StatusText)"

  inside systemctl kill -s SIGKILL stripelog@vol
  for _ in $(seq 100); do [[ $(show NRestarts) == 1 && $(show SubState) == running ]] && break; sleep 0.2; done
  [[ $(show NRestarts) == 1 && $(show SubState) == running ]] || fail "no restart after SIGKILL"
  echo "SIGKILL: restarted (NRestarts=1), serving again"

  inside systemctl stop stripelog@vol
  [[ $(holder_open) == False ]] || fail "stop did not close the volume cleanly"
  echo "stop: the volume is closed cleanly"

  inside mv /var/lib/sltest/m2 /var/lib/sltest/m2.away
  inside systemctl start --no-block stripelog@vol
  sleep 1.5
  [[ $(show StatusText) == "waiting up to 1m 30s for members to appear: /var/lib/sltest/m2" ]] ||
    fail "status while waiting: $(show StatusText)"
  [[ $(show ActiveState) == activating ]] || fail "not activating while waiting: $(show ActiveState)"
  inside mv /var/lib/sltest/m2.away /var/lib/sltest/m2
  for _ in $(seq 50); do [[ $(show ActiveState) == active ]] && break; sleep 0.2; done
  [[ $(show ActiveState) == active ]] || fail "not active once the member appeared"
  echo "wait: activating while m2 is absent, active once it appears"
  inside systemctl stop stripelog@vol

  inside systemctl reset-failed stripelog@vol 2>/dev/null || true
  inside sh -c "printf 'MEMBERS=$members\nSERVE_OPTIONS=--wait-for-members 1s\n' >/etc/stripelog/vol.conf"
  inside mv /var/lib/sltest/m2 /var/lib/sltest/m2.away
  inside systemctl start stripelog@vol 2>/dev/null && fail "started without member 2"
  for _ in $(seq 150); do [[ $(show SubState) == failed ]] && break; sleep 0.2; done
  [[ $(show SubState) == failed ]] || fail "still restarting: $(show SubState)"
  starts=$(inside journalctl -u stripelog@vol --no-pager -o cat | grep -c "members still absent after waiting 1s")
  [[ $starts == 3 ]] || fail "$starts failed starts, not 3 (StartLimitBurst)"
  echo "absent member: each start fails naming it; systemd gave up after $starts starts"
  inside systemctl poweroff 2>/dev/null || true
  echo PASS
  exit 0
fi

# In the new namespaces: build the overlay root, install, and become systemd.
mount --make-rprivate /
mount -t tmpfs tmpfs "$WORK/layers"
mkdir -p "$WORK/layers/upper" "$WORK/layers/work"
root=$WORK/root
mount -t overlay overlay -o "lowerdir=/,upperdir=$WORK/layers/upper,workdir=$WORK/layers/work" "$root"
mount -t proc proc "$root/proc"
mount -t sysfs -o ro sysfs "$root/sys" # read-only: udev and hardware units stay off
mount -t cgroup2 none "$root/sys/fs/cgroup"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
mount -t tmpfs tmpfs "$root/tmp"
PREFIX=/usr/local SYSCONFDIR=/etc DESTDIR=$root "$HERE/scripts/install.sh" "$BINARY" >/dev/null
mkdir -p "$root/var/lib/sltest"
chroot "$root" /usr/local/bin/stripelog create --raid 5 --chunk 64KiB --member-size 64MiB \
  /var/lib/sltest/m0 /var/lib/sltest/m1 /var/lib/sltest/m2 >/dev/null
printf 'MEMBERS=/var/lib/sltest/m0 /var/lib/sltest/m1 /var/lib/sltest/m2\nSERVE_OPTIONS=\n' >"$root/etc/stripelog/vol.conf"
# Only what the check needs starts: no udev, gettys or network services of the host.
for unit in systemd-udevd.service systemd-udev-trigger.service systemd-udevd-control.socket \
  systemd-udevd-kernel.socket getty@tty1.service serial-getty@ttyS0.service console-getty.service \
  systemd-networkd.service cron.service ssh.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit"
done
rm -f "$root"/etc/systemd/system/multi-user.target.wants/*
exec chroot "$root" env container=stripelog-check /lib/systemd/systemd --system --unit=multi-user.target \
  --log-target=journal
