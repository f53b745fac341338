#!/usr/bin/env bash
# The wheels benchmarks/gpu_session.sh installs on the lent GPU machine, which has Python 3.12 and torch but no
# package registry at all: what `python3 -m dfl_node simulate` imports that its image lacks (pydantic and its
# parts; grpcio-health-checking, grpcio-reflection, zeroconf, ifaddr, blake3, which the node imports), and, pinned
# to this project's lock (constraints.txt) so that our generated protobuf code and the CLI load as here, grpcio,
# protobuf, click, rich and what rich needs, typing_extensions, prometheus_client. Numpy, safetensors, PyYAML,
# matplotlib and torch are the image's own.
#
#   bash benchmarks/gpu_wheels.sh [DIR]     # default: .whl in the repository root (git-ignored: see below)
#
# Run it where pip reaches a registry, in the checkout the device tool sends; ignore the folder there first
# (`echo /.whl/ >> .git/info/exclude`) and name it in the call's carry. About 15 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
pin() { grep -i -m1 "^$1==" constraints.txt || { echo "error: $1 is not in constraints.txt" >&2; exit 2; }; }
wheels=(
  "$(pin pydantic)" "$(pin pydantic_core)" "$(pin annotated-types)" "$(pin typing-inspection)"
  "$(pin typing_extensions)" "$(pin grpcio)" "$(pin grpcio-health-checking)" "$(pin grpcio-reflection)"
  "$(pin protobuf)" "$(pin zeroconf)" "$(pin ifaddr)" "$(pin blake3)" "$(pin prometheus_client)" "$(pin click)"
  "$(pin rich)" "$(pin markdown-it-py)" "$(pin mdurl)" "$(pin Pygments)"
)
rm -rf "$dest"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" "${wheels[@]}"
ls -l "$dest"
du -sh "$dest"
