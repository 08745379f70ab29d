#!/usr/bin/env bash
# apt-get with a private configuration under DIR: a deb-src entry for
# Debian's archive (the one /etc/apt names, or deb.debian.org), its own
# lists and cache. /etc/apt is never changed.
#
# Usage: private_apt.sh DIR source PACKAGE DEST   (apt-get source into DEST)
set -euo pipefail
dir="$1"; shift
mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
mirror="$(sed -n 's/^URIs:[[:space:]]*\(\S*debian\)\/\?[[:space:]]*$/\1/p' \
  /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n1)"
mirror="${mirror:-http://deb.debian.org/debian}"
echo "deb-src $mirror bookworm main" >"$dir/sources.list"
opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
      -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache"
      -o "APT::Sandbox::User=root")
apt-get "${opts[@]}" update -qq
case "$1" in
  source)
    mkdir -p "$3"
    (cd "$3" && apt-get "${opts[@]}" source -qq "$2")
    ;;
  *) echo "private_apt: unknown command $1" >&2; exit 2 ;;
esac
