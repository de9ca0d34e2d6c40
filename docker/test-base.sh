#!/usr/bin/env bash
# The stand-in for debian:bookworm-slim that CI builds the Dockerfile from (docker/test_images.py): no registry
# serves base images on CI's machines, only Debian's package mirror. mmdebstrap builds a minbase root with slim's
# path excludes; this machine's CA bundle goes in beside it for pip (its PyPI goes through a TLS-intercepting
# proxy), named by PIP_CERT in the image's environment, so the Dockerfile itself knows nothing of this machine.
# Usage: docker/test-base.sh NAME   (prints nothing but errors; exits non-zero on failure)
set -euo pipefail
name="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=minbase \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  bookworm "$work/root.tar" http://deb.debian.org/debian
tar --append -f "$work/root.tar" -C / --transform 's,^etc/ssl/certs/ca-certificates.crt$,etc/ssl/host-ca.pem,' \
  etc/ssl/certs/ca-certificates.crt
podman import --quiet --change "ENV PIP_CERT=/etc/ssl/host-ca.pem" "$work/root.tar" "$name" > /dev/null
