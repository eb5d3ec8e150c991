#!/usr/bin/env bash
# Builds the muonps OCI images from Debian bookworm packages and the
# Bazel-built binaries, with no base image pulled from anywhere:
#
#   deploy/container/build.sh [--out DIR] [--version V] [--no-bazel] [--podman]
#
#   muonps-coordinator  /usr/local/bin/muonps-coordinator (entrypoint) and the
#                       operator CLI /usr/local/bin/muonps (helm test uses it)
#   muonps-worker       /usr/local/bin/muonps-worker (entrypoint), the
#                       autotuner /usr/local/bin/muonps-autotune (the chart's
#                       workers.costTable.autotune initContainer runs it) and
#                       the CUDA runtime libraries they link (cuBLAS, cuBLASLt,
#                       NCCL, cudart) from /usr/local/cuda/lib64; the same
#                       image runs CPU workers. The GPU driver (libcuda) comes
#                       from the node through the NVIDIA container toolkit.
#
# Each image is two layers: the Debian runtime libraries (shared by both,
# made by `mmdebstrap --variant=extract`: no shell, no package manager, no
# dpkg scripts run) and the role's files. User 65532 (muonps), labels
# org.opencontainers.image.{version,revision,created,source}. Written as OCI
# image layouts DIR/muonps-coordinator and DIR/muonps-worker (reference =
# version) by umoci; push with skopeo:
#   skopeo copy oci:DIR/muonps-worker:V docker://REGISTRY/muonps-worker:V
# --podman also loads them into podman's local storage (podman images).
# Needs root (mmdebstrap, umoci) and Debian's archive. Default DIR:
# deploy/container/out; default version: the chart's appVersion.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
start=$SECONDS

out="$root/deploy/container/out"
version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/muonps/Chart.yaml)"
run_bazel=1
load_podman=0
while (($#)); do
  case "$1" in
    --out) out="$(realpath -m "$2")"; shift 2 ;;
    --version) version="$2"; shift 2 ;;
    --no-bazel) run_bazel=0; shift ;;
    --podman) load_podman=1; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "build.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "build.sh: run as root (mmdebstrap and umoci keep file owners)" >&2; exit 1; }
for tool in mmdebstrap umoci ldconfig; do
  command -v "$tool" >/dev/null || {
    echo "build.sh: $tool is missing: apt-get install mmdebstrap umoci skopeo" >&2; exit 1; }
done

step() { printf '== [%3ds] %s\n' $((SECONDS - start)) "$*"; }

bin="$root/bazel-bin"
if ((run_bazel)); then
  step "bazel build (coordinator, worker, operator CLI, autotuner)"
  bazel build //server/coordinator:muonps-coordinator //server/worker:muonps-worker \
    //tools/muonps //tools/autotune:muonps-autotune >/tmp/muonps-image-bazel.log 2>&1 \
    || { tail -20 /tmp/muonps-image-bazel.log; echo "build.sh: bazel build failed" >&2; exit 1; }
  bin="$(bazel info bazel-bin 2>/dev/null)"
fi
binaries=("$bin/server/coordinator/muonps-coordinator" "$bin/server/worker/muonps-worker"
          "$bin/tools/muonps/muonps" "$bin/tools/autotune/muonps-autotune")
for b in "${binaries[@]}"; do
  [[ -x "$b" ]] || { echo "build.sh: $b is missing; run without --no-bazel" >&2; exit 1; }
done

# Debian packages that hold the libraries the binaries load (ldd on this
# bookworm build host), and the CUDA libraries that come from /usr/local/cuda.
step "mapping shared libraries to Debian packages"
packages=()
cuda_libs=()
host_libs=()
while read -r lib; do
  real="$(readlink -f "$lib")"
  if [[ "$real" == /usr/local/cuda* ]]; then cuda_libs+=("$lib"); continue; fi
  host_libs+=("$lib")
  pkg="$(dpkg -S "$real" 2>/dev/null || dpkg -S "/usr$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || true)"
  pkg="${pkg%%:*}"
  [[ -n "$pkg" ]] || { echo "build.sh: no Debian package holds $lib" >&2; exit 1; }
  packages+=("$pkg")
done < <(for b in "${binaries[@]}"; do
           ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
           if ldd "$b" | grep -q 'not found'; then
             ldd "$b" | grep 'not found' >&2
             echo "build.sh: $b has libraries not found here (CUDA toolkit at /usr/local/cuda?)" >&2
             exit 1
           fi
         done | sort -u)
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
mapfile -t cuda_libs < <(printf '%s\n' ${cuda_libs[@]+"${cuda_libs[@]}"} | sed '/^$/d' | sort -u)
echo "   Debian: ${packages[*]}"
echo "   CUDA:   ${cuda_libs[*]:-none (a CPU-only worker build)}"

work="$(mktemp -d /tmp/muonps-image-XXXXXX)"
trap 'rm -rf "$work"' EXIT

step "mmdebstrap: bookworm runtime libraries (variant extract)"
mmdebstrap --quiet --variant=extract --include="$(IFS=,; echo "${packages[*]}")" \
  --customize-hook='mkdir -p "$1/usr/share/muonps"; ls "$1/var/cache/apt/archives" | sed -n "s/\.deb$//p" > "$1/usr/share/muonps/debian-packages.txt"' \
  --format=directory bookworm "$work/base" ${MUONPS_DEBIAN_MIRROR:-} >"$work/mmdebstrap.log" 2>&1 \
  || { tail -20 "$work/mmdebstrap.log"; echo "build.sh: mmdebstrap failed; is Debian's archive reachable (or set MUONPS_DEBIAN_MIRROR)?" >&2; exit 1; }
base="$work/base"
rm -rf "$base/var/cache/apt" "$base/var/lib/apt/lists" "$base/var/log"/* "$base/dev"/*
mkdir -p "$base/tmp" "$base/var/lib/muonps" "$base/var/run/muonps" "$base/proc" "$base/sys" "$base/dev"
chmod 1777 "$base/tmp"
chown 65532:65532 "$base/var/lib/muonps" "$base/var/run/muonps"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nmuonps:x:65532:65532:muonps:/var/lib/muonps:/usr/sbin/nologin\n' >"$base/etc/passwd"
printf 'root:x:0:\nmuonps:x:65532:\n' >"$base/etc/group"
printf 'hosts: files dns\n' >"$base/etc/nsswitch.conf"
# Debian points some sonames at their implementation through alternatives
# (libopenblas.so.0 -> openblas-pthread/), made by maintainer scripts that the
# extract variant does not run: link every library the binaries load to the
# file the build host resolves it to.
for lib in "${host_libs[@]}"; do
  name="$(basename "$lib")"
  [[ -e "$base/usr/lib/x86_64-linux-gnu/$name" || -e "$base/lib/x86_64-linux-gnu/$name" ]] && continue
  real="$(readlink -f "$lib")"
  # The host has a merged /usr, the extracted tree may not.
  found=""
  for candidate in "$real" "${real#/usr}" "/usr$real"; do
    [[ -e "$base$candidate" ]] && { found="$candidate"; break; }
  done
  [[ -n "$found" ]] || { echo "build.sh: $real (for $lib) is not in the image's packages" >&2; exit 1; }
  ln -s "$found" "$base/usr/lib/x86_64-linux-gnu/$name"
done
ldconfig -r "$base"

# role_overlay ROLE: the role's own files, plus an ld.so.cache for the whole
# image (made on a hard-linked merged copy).
role_overlay() {
  local role="$1" dir="$work/$role"
  mkdir -p "$dir/usr/local/bin" "$dir/etc"
  case "$role" in
    muonps-coordinator)
      install -m 0755 "${binaries[0]}" "${binaries[2]}" "$dir/usr/local/bin/" ;;
    muonps-worker)
      install -m 0755 "${binaries[1]}" "${binaries[3]}" "$dir/usr/local/bin/"
      if ((${#cuda_libs[@]})); then
        mkdir -p "$dir/usr/local/cuda/lib64" "$dir/etc/ld.so.conf.d"
        for lib in "${cuda_libs[@]}"; do cp -L "$lib" "$dir/usr/local/cuda/lib64/"; done
        echo /usr/local/cuda/lib64 >"$dir/etc/ld.so.conf.d/muonps-cuda.conf"
      fi ;;
  esac
  cp -al "$base" "$work/merged-$role"
  cp -a "$dir/." "$work/merged-$role/"
  ldconfig -r "$work/merged-$role"
  cp "$work/merged-$role/etc/ld.so.cache" "$dir/etc/ld.so.cache"
  du -sb "$work/merged-$role" | cut -f1 >"$work/$role.unpacked"
  rm -rf "$work/merged-$role"
}

revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD -- server transport kernels scheduler common proto tools 2>/dev/null \
  || revision="$revision-dirty"
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
mkdir -p "$out"
for role in muonps-coordinator muonps-worker; do
  step "$role: layers and config (umoci)"
  role_overlay "$role"
  layout="$out/$role"
  rm -rf "$layout"
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  umoci insert --image "$layout:$version" --history.created_by "mmdebstrap bookworm (runtime libraries)" "$base" /
  umoci insert --image "$layout:$version" --history.created_by "muonps $role files" "$work/$role" /
  config=(--config.user 65532:65532 --config.workingdir /var/lib/muonps
          --config.entrypoint "/usr/local/bin/$role"
          --config.env PATH=/usr/local/bin:/usr/bin:/bin
          --config.label "org.opencontainers.image.title=$role"
          --config.label "org.opencontainers.image.version=$version"
          --config.label "org.opencontainers.image.revision=$revision"
          --config.label "org.opencontainers.image.created=$created"
          --config.label "org.opencontainers.image.base.name=debian:bookworm (mmdebstrap --variant=extract)"
          --config.label "org.opencontainers.image.description=muonps $role")
  if [[ $role == muonps-coordinator ]]; then
    config+=(--config.exposedports 7070/tcp --config.exposedports 9090/tcp)
  else
    config+=(--config.env NVIDIA_VISIBLE_DEVICES=all
             --config.env NVIDIA_DRIVER_CAPABILITIES=compute,utility
             --config.env NCCL_NVLS_ENABLE=0
             --config.exposedports 7071/tcp --config.exposedports 9091/tcp)
  fi
  umoci config --image "$layout:$version" --history.created_by "muonps build.sh" "${config[@]}"
  umoci gc --layout "$layout"
done

step "sizes"
for role in muonps-coordinator muonps-worker; do
  layout="$out/$role"
  packed="$(du -sb "$layout/blobs" | cut -f1)"
  unpacked="$(cat "$work/$role.unpacked")"
  printf '   %-20s %s  packed (gzip layers) %4d MiB  unpacked %4d MiB\n' "$role" "$version" \
    $((packed >> 20)) $((unpacked >> 20))
done

if ((load_podman)); then
  command -v skopeo >/dev/null || { echo "build.sh: --podman needs skopeo" >&2; exit 1; }
  for role in muonps-coordinator muonps-worker; do
    step "loading $role:$version into podman's storage"
    skopeo copy --quiet "oci:$out/$role:$version" "containers-storage:localhost/$role:$version"
  done
  podman images --filter reference='localhost/muonps-*'
fi
step "done: OCI layouts in $out (push: skopeo copy oci:$out/muonps-worker:$version docker://REGISTRY/muonps-worker:$version)"
