#!/bin/sh
# The multi-host testbed without Docker: N network namespaces on a bridge, one dfl-node in each.
#   sudo deploy/netns/testbed.sh 4 [--dataset digits --partition iid ...]   (--help for all options)
#   sudo DFL_ALGORITHM=combo PYTHON=$(command -v python) deploy/netns/testbed.sh 4
# Shared settings: deploy/node.env (DFL_* variables in the environment override it), which says
# DFL_INSECURE=true: the nodes serve a bridge inside this machine that only the testbed's namespaces reach.
# Ctrl-C (or SIGTERM) stops the nodes and removes every namespace it created.
set -eu
if [ "$(id -u)" != 0 ]; then
    echo "testbed.sh: needs root (network namespaces): sudo $0 $*" >&2
    exit 1
fi
command -v ip >/dev/null || { echo "testbed.sh: needs iproute2 (ip)" >&2; exit 1; }
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m dfl_node.testbed.netns "$@"
