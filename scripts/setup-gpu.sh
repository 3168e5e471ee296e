#!/usr/bin/env bash
# Make sure wgpu finds an adapter: when no Vulkan driver is installed on Linux, install Mesa's
# software Vulkan driver (lavapipe). Needs root (or sudo) and Debian/Ubuntu's apt.
set -euo pipefail
[ "$(uname -s)" = Linux ] || exit 0
have_icd() {
  local f found=""
  for f in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json /usr/local/share/vulkan/icd.d/*.json; do
    [ -e "$f" ] && found=1
  done
  [ -n "$found" ] && ldconfig -p 2>/dev/null | grep -q libvulkan.so.1
}
if have_icd; then
  exit 0
fi
echo "no Vulkan driver found: installing lavapipe (mesa-vulkan-drivers)..."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
have_icd || { echo "setup-gpu: still no Vulkan driver after installing lavapipe" >&2; exit 1; }
