#!/usr/bin/env bash
# Install stripelog: the binary, its man pages and shell completions (generated from the
# CLI's own definition), the systemd unit and an example volume configuration.
#   scripts/install.sh BINARY       (make install runs it with target/release/stripelog)
# Honours DESTDIR (staging, for packages), PREFIX (default /usr/local), SYSCONFDIR
# (default /etc) and UNITDIR (default PREFIX/lib/systemd/system). Only the example
# configuration is written: a NAME.conf an operator wrote is never touched.
set -euo pipefail

binary=${1:?usage: scripts/install.sh BINARY}
prefix=${PREFIX:-/usr/local}
sysconfdir=${SYSCONFDIR:-/etc}
destination=${DESTDIR:-}
here=$(cd "$(dirname "$0")/.." && pwd)

bindir=$prefix/bin
mandir=$prefix/share/man/man1
unitdir=${UNITDIR:-$prefix/lib/systemd/system}

install -d "$destination$bindir" "$destination$mandir" "$destination$unitdir" \
  "$destination$prefix/share/bash-completion/completions" \
  "$destination$prefix/share/zsh/site-functions" \
  "$destination$prefix/share/fish/vendor_completions.d" \
  "$destination$sysconfdir/stripelog"
install -m 0755 "$binary" "$destination$bindir/stripelog"
installed=$destination$bindir/stripelog

"$installed" manpages "$destination$mandir"
"$installed" completions bash >"$destination$prefix/share/bash-completion/completions/stripelog"
"$installed" completions zsh >"$destination$prefix/share/zsh/site-functions/_stripelog"
"$installed" completions fish >"$destination$prefix/share/fish/vendor_completions.d/stripelog.fish"

substitute() { sed -e "s|@BINDIR@|$bindir|g" -e "s|@SYSCONFDIR@|$sysconfdir|g" "$1"; }
substitute "$here/contrib/systemd/stripelog@.service.in" >"$destination$unitdir/stripelog@.service"
chmod 0644 "$destination$unitdir/stripelog@.service"
substitute "$here/contrib/systemd/stripelog.conf.example" >"$destination$sysconfdir/stripelog/stripelog.conf.example"

echo "installed stripelog in $destination$prefix (unit $unitdir/stripelog@.service, example $sysconfdir/stripelog/stripelog.conf.example)"
