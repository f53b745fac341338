#!/bin/sh
# A multi-site testbed: SITES network "sites" (a bridge each, mDNS confined to it) routed to each other by a
# router namespace, NODES daemons spread over them, every node given one --join address in the next site.
#   sudo deploy/netns/multisite.sh                  # 3 sites x 4 nodes, round mode, digits
#   sudo SITES=3 NODES=6 deploy/netns/multisite.sh --rounds 10 --out runs/ms.json   (dfl-node testbed's options)
#   sudo NAT_SITES=2 deploy/netns/multisite.sh      # the last 2 sites behind NAT (dial out only), joining via site 1
# It prints when every node knew every other, which sources each site's mDNS came from (its own nodes only),
# and the results; the daemons and every namespace are removed however it ends (Ctrl-C and SIGTERM too).
set -eu
[ "$(id -u)" = 0 ] || { echo "multisite.sh: needs root (network namespaces) and iproute2: sudo $0 $*" >&2; exit 1; }
cd "$(dirname "$0")/../.."
exec "${PYTHON:-python3}" -m dfl_node testbed --netns --sites "${SITES:-3}" --nat-sites "${NAT_SITES:-0}" \
  --nodes "${NODES:-12}" "$@"
