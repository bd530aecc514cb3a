#!/usr/bin/env bash
# Builds deploy/docker/Dockerfile with buildah (Debian's daemonless builder)
# and runs the image: the server must start, answer the gRPC health check on
# loopback and exit 0 on SIGTERM. From the repository root:
#
#   deploy/docker/build-and-run.sh            # needs root, buildah, network
#   DEPOT_IMAGE_REUSE=1 deploy/docker/build-and-run.sh   # run the built image
#
# Where no registry can be reached (as on the project's build machines), the
# Debian base images the Dockerfile names are made locally first, with
# debootstrap from deb.debian.org, and imported under the names the
# Dockerfile uses (debian:bookworm, debian:bookworm-slim).
#
# Containers run with buildah's chroot isolation and the host's network: a
# machine that is itself a container often cannot create the namespaces and
# limits an OCI runtime needs (podman run failed here on setrlimit), while
# chroot isolation runs. The image is the same one `docker build` makes.
#
# Takes about as long as a build of the server (the build stage compiles it)
# plus the packages' download. Prints one line per stage and "image ok".
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
image="${DEPOT_IMAGE:-localhost/depot-server:test}"
# The health check runs the client library of a build tree.
client_library="${DEPOT_CLIENT_LIBRARY:-${repo}/build/client/libdepot_client.so}"
work="$(mktemp -d /tmp/depot-image.XXXXXX)"
container=""
server_pid=""
cleanup() {
  if [[ -n "${server_pid}" ]] && kill -0 "${server_pid}" 2>/dev/null; then
    kill -KILL "${server_pid}" || true
  fi
  if [[ -n "${container}" ]]; then buildah rm "${container}" >/dev/null || true; fi
  rm -rf "${work}"
}
trap cleanup EXIT
say() { echo "build-and-run: $*"; }

for tool in buildah podman; do
  command -v "${tool}" >/dev/null || {
    say "${tool} is not installed (apt-get install buildah podman)"
    exit 2
  }
done

# -- Base images ----------------------------------------------------------
if ! podman image exists docker.io/library/debian:bookworm; then
  if timeout 30 podman pull -q docker.io/library/debian:bookworm >/dev/null 2>&1 &&
     timeout 30 podman pull -q docker.io/library/debian:bookworm-slim >/dev/null 2>&1; then
    say "base images pulled"
  else
    command -v debootstrap >/dev/null || {
      say "no registry and no debootstrap (apt-get install debootstrap)"
      exit 2
    }
    say "no registry: making debian:bookworm with debootstrap"
    debootstrap --variant=minbase bookworm "${work}/rootfs" \
      http://deb.debian.org/debian >"${work}/debootstrap.log" 2>&1 || {
      tail -5 "${work}/debootstrap.log"
      exit 1
    }
    tar -C "${work}/rootfs" -c . |
      podman import - docker.io/library/debian:bookworm >/dev/null
    podman tag docker.io/library/debian:bookworm \
      docker.io/library/debian:bookworm-slim
    rm -rf "${work}/rootfs"
  fi
fi
say "base images: $(podman images --format '{{.Repository}}:{{.Tag}}' | grep -c debian) debian image(s)"

[[ -e "${client_library}" ]] || {
  say "no client library at ${client_library} (build first, or set DEPOT_CLIENT_LIBRARY)"
  exit 2
}

# -- The image -------------------------------------------------------------
if [[ "${DEPOT_IMAGE_REUSE:-0}" == 1 ]] && podman image exists "${image}"; then
  say "reusing ${image} (DEPOT_IMAGE_REUSE=1)"
else
  say "building ${image} from deploy/docker/Dockerfile"
  buildah bud --isolation=chroot --network=host --layers=false \
    -f "${repo}/deploy/docker/Dockerfile" \
    --ignorefile "${repo}/deploy/docker/Dockerfile.dockerignore" \
    -t "${image}" "${repo}" >"${work}/build.log" 2>&1 || {
    tail -20 "${work}/build.log"
    exit 1
  }
fi
say "image: $(podman image inspect --format '{{.Size}}' "${image}") bytes"

# -- Run it ----------------------------------------------------------------
container="$(buildah from "${image}")"
port_file="/tmp/depot-port"
buildah run --isolation=chroot --network=host "${container}" -- \
  /usr/local/bin/depot-server --listen=127.0.0.1:0 --metrics_listen= \
  --port_file="${port_file}" >"${work}/server.log" 2>&1 &
server_pid=$!
mount="$(buildah mount "${container}")"
for _ in $(seq 100); do
  [[ -s "${mount}${port_file}" ]] && break
  kill -0 "${server_pid}" 2>/dev/null || break
  sleep 0.1
done
if [[ ! -s "${mount}${port_file}" ]]; then
  say "the server in the image did not start:"
  cat "${work}/server.log"
  exit 1
fi
address="$(head -1 "${mount}${port_file}")"
say "server in the image listening on ${address}"
# The gRPC health check, from outside the container, through the client
# library (its wait_for_servers asks grpc.health.v1 for SERVING).
PYTHONPATH="${repo}/client/python" DEPOT_CLIENT_LIBRARY="${client_library}" \
  /usr/bin/python3 - "${address}" <<'EOF'
import sys
import depot
with depot.Client([sys.argv[1]]) as client:
    client.wait_for_servers(30)
print("build-and-run: health check: SERVING")
EOF
# SIGTERM to the server itself: buildah run does not pass signals on (it
# kills its child), while docker stop and Kubernetes signal the process.
inside="$(pgrep -f -n "^/usr/local/bin/depot-server --listen=127.0.0.1:0")"
kill -TERM "${inside}"
status=0
wait "${server_pid}" || status=$?
server_pid=""
if ((status != 0)); then
  say "the server exited ${status} on SIGTERM:"
  cat "${work}/server.log"
  exit 1
fi
say "the server exited 0 on SIGTERM"
say "image ok"
