#!/usr/bin/env bash
# Builds the images (deploy/container/build.sh) into a temporary folder and
# runs them (image_run_test.sh): about 45 s on 2 cores. Installs mmdebstrap,
# umoci and skopeo from Debian first if missing. Needs root and Debian's
# archive. Ends with "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
missing=()
for pkg in mmdebstrap umoci skopeo; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${missing[@]}" >/dev/null
fi
out="$(mktemp -d /tmp/muonps-images-XXXXXX)"
trap 'rm -rf "$out"' EXIT
start=$SECONDS
if bash deploy/container/build.sh --no-bazel --out "$out"; then
  echo "PASS images built in $((SECONDS - start)) s"
  bash tests/deploy/image_run_test.sh --images "$out" | sed '$d' >"$out/run.log" || true
  cat "$out/run.log"
  p="$(grep -c '^PASS ' "$out/run.log" || true)"
  f="$(grep -c '^FAIL ' "$out/run.log" || true)"
  ((p + f > 0)) || f=1
  echo "$((p + 1)) passed, ${f} failed"
  [[ $f -eq 0 ]]
else
  echo "FAIL deploy/container/build.sh"
  echo "0 passed, 1 failed"
  exit 1
fi
