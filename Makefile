# The two commands a newcomer runs: `make selftest` (the main job) and `make test`.
# Everything downloaded or built outside Cargo (llama-server, the model) is cached under
# $(BOXMAKER_CACHE), never in the checkout.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
export BOXMAKER_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/boxmaker
NOSTD_CRATES := -p sse-nostd -p http-nostd -p llama-proto
DEVICE_TARGET := thumbv7em-none-eabihf
FUZZ_SECONDS ?= 60

.PHONY: test selftest ask verify-device verify-local fuzz bench socat serve fixtures llama fmt-check clippy unit no-std

## test: format, lints, every test (the end-to-end ones against a real llama-server), the no_std
## build, and verify-device against the local router
test: fmt-check clippy llama unit no-std verify-local

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit: llama
	$(CARGO) test --workspace

## no-std: the proof that the core needs neither std nor alloc
no-std:
	rustup target list --installed | grep -qx $(DEVICE_TARGET) || rustup target add $(DEVICE_TARGET)
	$(CARGO) build $(NOSTD_CRATES) --target $(DEVICE_TARGET)

## llama: fetch, verify, build and cache llama-server and the test model (a no-op once cached)
llama:
	scripts/llama-server.sh all >/dev/null

## serve: run the local llama-server router in the foreground
serve: llama
	scripts/serve.sh

## fixtures: record the fixtures again from the local llama-server
fixtures: llama
	scripts/record-fixtures.sh

## selftest: the main job: local llama-server under llama-worker, inferproxy, `loopd selftest`
selftest:
	scripts/local-stack.sh selftest

## ask: one request through the same stack, shown as it runs (PROMPT="...", THINKING=1)
ask:
	scripts/local-stack.sh ask $(if $(THINKING),--thinking) "$(or $(PROMPT),Why is the sky blue?)"

## verify-device: selftest and the device tests against UPSTREAM (default straylight:11434);
## needs MODEL EXPECT_SHA256 N_CTX SLOTS, or LOOPD_CONFIG (see scripts/verify-device.sh)
verify-device:
	scripts/verify-device.sh

## verify-local: verify-device against the local router (part of make test)
verify-local: llama
	scripts/local-stack.sh verify

## fuzz: every cargo-fuzz target for FUZZ_SECONDS each (installs cargo-fuzz when missing)
fuzz:
	command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	cd fuzz && for t in $$($(CARGO) +nightly fuzz list); do \
	  $(CARGO) +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

## bench: every benchmark, each against its peer in the same run (figures go into docs/benchmarks.md)
bench: socat
	$(CARGO) bench --workspace

## socat: install socat with apt when missing (the peer of inferproxy's benchmark)
socat:
	command -v socat >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq socat; }
