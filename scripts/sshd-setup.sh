#!/usr/bin/env bash
# Install openssh-server if it is missing (idempotent). The test fixtures then start their
# own sshd on 127.0.0.1 with a free port and generated keys (tests/deploy_fixtures.py);
# this script never starts a system-wide sshd.
set -euo pipefail
if command -v sshd >/dev/null 2>&1 || [ -x /usr/sbin/sshd ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# policy-rc.d keeps the package's postinst from starting a system sshd on port 22.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
# iproute2 (ip netns: multi-host tests) and util-linux (unshare, setpriv: Vast instances).
$SUDO apt-get install -y -qq --no-install-recommends openssh-server iproute2 util-linux >/dev/null
test -x /usr/sbin/sshd
