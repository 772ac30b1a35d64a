# Where this machine gets its Debian packages, for the harness's downloads (debootstrap, the
# kubernetes source package): taken from the machine's own apt configuration, so a user
# behind a mirror or proxy needs nothing more than apt already has. Sourced by build-k8s.sh,
# images.sh and standins.sh. TRAINYARD_DEBIAN_MIRROR, when set, overrides the Debian archive.

# debian_mirror LABEL: the base URI (no trailing slash) of the apt source whose Release file
# says Origin "Debian" and Label LABEL ("Debian" for the archive, "Debian-Security" for the
# security archive). apt's lists are read once more after an `apt-get update` when no such
# source is known yet (a fresh machine).
debian_mirror() {
  local label=$1 uri
  if [[ $label == Debian && -n ${TRAINYARD_DEBIAN_MIRROR:-} ]]; then
    echo "${TRAINYARD_DEBIAN_MIRROR%/}"
    return
  fi
  uri=$(apt_source_uri "$label")
  if [[ -z $uri ]]; then
    apt-get update -qq >/dev/null 2>&1 || true
    uri=$(apt_source_uri "$label")
  fi
  if [[ -z $uri ]]; then
    echo "apt-mirror: no apt source of this machine has Origin Debian, Label $label" \
      "(apt-get indextargets); add one, or set TRAINYARD_DEBIAN_MIRROR" >&2
    return 1
  fi
  echo "${uri%/}"
}

apt_source_uri() { # apt_source_uri LABEL: the first binary source with that Debian label
  # shellcheck disable=SC2016 # apt's own $(FIELD) placeholders, not shell expansions
  apt-get indextargets --format '$(REPO_URI)|$(ORIGIN)|$(LABEL)|$(TARGET_OF)' 2>/dev/null |
    awk -F'|' -v label="$1" '$2 == "Debian" && $3 == label && $4 == "deb" { print $1; exit }'
}
