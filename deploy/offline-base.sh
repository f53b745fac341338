#!/usr/bin/env bash
# A base image for deploy/Dockerfile on a machine that reaches Debian's and PyPI's package mirrors but
# no image registry (so `FROM python:3.12-slim` cannot be pulled). Writes a root file system tarball:
# Debian 12 (python3 3.11, venv) from debootstrap, plus a wheel folder /wheels holding CPU torch and
# every dependency of pyproject.toml at the lock's versions (constraints.txt), and an /etc/pip.conf that
# makes pip install from /wheels only.
# Import it and build against it:
#
#   deploy/offline-base.sh /var/cache/dfl-node/offline-base.tar          # root; ~1-2 min, cached
#   docker import /var/cache/dfl-node/offline-base.tar dfl-base:offline
#   BASE_IMAGE=dfl-base:offline docker compose up --build
#
# The image build itself then needs no network at all (tests/test_compose.py builds with none).
# Re-running is a no-op while the tarball was made from the same dependencies and the same script: their
# sha256 is kept beside it (OUT.tar.inputs), so a fresh clone, whose files are all new, does not rebuild it.
set -euo pipefail

out=${1:?usage: deploy/offline-base.sh OUT.tar}
here=$(cd "$(dirname "$0")/.." && pwd)
requirements=$(python3 - "$here/pyproject.toml" <<'EOF'
import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))
EOF
)
inputs=$(printf '%s\n' "$requirements" | cat - "$0" "$here/constraints.txt" | sha256sum | cut -d' ' -f1)
if [[ -s $out && "$(cat "$out.inputs" 2>/dev/null)" == "$inputs" ]]; then
  echo "$out is up to date"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
mirror=${mirror:-http://deb.debian.org/debian}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/rootfs" "$mirror" \
  >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }

# Wheels for the image's Python (3.11 on bookworm): torch's CPU build first, as everywhere in this project.
printf '%s\n' "$requirements" >"$work/requirements.txt"
pip=(python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all:
     --python-version 3.11 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64
     --dest "$work/rootfs/wheels")
download() {  # pip, without the noise of package-index folders that this machine's pip.conf names but lacks
  "${pip[@]}" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
download torch==2.13.0
download -r "$work/requirements.txt" -c "$here/constraints.txt" 'setuptools>=68' wheel   # the lock's versions
printf '[global]\nno-index = true\nfind-links = /wheels\n' >"$work/rootfs/etc/pip.conf"

mkdir -p "$(dirname "$out")"
tar -C "$work/rootfs" -cf "$out.tmp" .
mv "$out.tmp" "$out"
echo "$inputs" >"$out.inputs"
echo "wrote $out ($(du -h "$out" | cut -f1))"
