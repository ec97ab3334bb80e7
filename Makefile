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

.PHONY: test selftest verify-device fuzz bench serve fixtures llama fmt-check clippy unit no-std

## test: format, lints, every test (the end-to-end ones against a real llama-server), the no_std build
test: fmt-check clippy llama unit no-std

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

## selftest: the main job (filled in by the selftest issue)
selftest:
	@echo "make selftest will start the local llama-server and inferproxy and run 'loopd selftest'; not built yet" >&2
	@exit 1

## verify-device: selftest and the device tests against UPSTREAM (filled in by the selftest issue)
verify-device:
	@echo "make verify-device is not built yet" >&2
	@exit 1

## fuzz: every cargo-fuzz target for FUZZ_SECONDS each (installs cargo-fuzz when missing)
fuzz:
	command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	cd fuzz && for t in $$($(CARGO) +nightly fuzz list); do \
	  $(CARGO) +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

## bench: every criterion benchmark (figures go into docs/benchmarks.md)
bench:
	$(CARGO) bench --workspace
