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

.PHONY: help check layers hermetic test units-check tunnel-check install-check up-check selftest ask run up fleet-up bench-fleet bench-fleet-loopd verify-device verify-local fuzz fuzz-cmin fuzz-tools bench bench-e2e bench-rpc bench-slot-files bench-sessions socat tmux serve fixtures soak chaos llama fmt-check clippy unit no-std embedded

## help: this list of targets
help:
	@awk '/^## [a-z0-9-]+:/ { sub(/^## /, ""); n = index($$0, ":"); printf "make %-14s%s\n", substr($$0, 1, n - 1), substr($$0, n + 1); next } \
	     /^## / { sub(/^## /, ""); printf "%20s%s\n", "", $$0 }' $(MAKEFILE_LIST)

## check: the fast lane: format, lints, the layering, the hermetic tests (no llama.cpp build, no
## apt) and the no_std build, in about a minute once compiled
check: fmt-check clippy layers hermetic no-std

## test: format, lints, every test (the end-to-end ones against a real llama-server), the no_std
## build, the firmware image under QEMU, verify-device against the local router, the systemd units and the install,
## the SSH tunnel to an inference host, and make up stopped by a Ctrl-C in a terminal
test: fmt-check clippy layers llama unit no-std embedded verify-local units-check tunnel-check install-check up-check

## units-check: the systemd units, sysusers and tmpfiles files in docs/: `systemd-analyze verify`
## clean, `security --offline` below 4 and as docs/production.md states (scripts/units-check.sh)
units-check:
	scripts/units-check.sh

## tunnel-check: docs/loopd-tunnel@.service's ssh line against a user-mode sshd on loopback that
## runs docs/loopd-tunnel.sshd.conf: exact bytes both ways on both sockets, their modes, what
## sshd refuses, a partition, a black hole, rejoining (scripts/tunnel-check.sh; installs openssh-server)
tunnel-check:
	scripts/tunnel-check.sh

## install-check: docs/production.md's install in a temporary root, the three daemons started
## with the units' exact ExecStart= lines, one agent request completed through them
install-check: llama
	scripts/install-check.sh

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

## layers: the loopd crates' files import in one direction (no circle of `use` between files,
## scripts/module-cycles.py), and the client takes neither SQLite nor clap (`cargo tree`)
LAYERED_CRATES := crates/loopd-client crates/loopd-agent crates/loopd
layers:
	scripts/module-cycles.py $(LAYERED_CRATES)
	! $(CARGO) tree -p loopd-client | grep -E 'rusqlite|clap'

## hermetic: every test that needs no real llama-server (what a plain `cargo test` runs), the
## replay of every committed fuzz input (fuzz/corpus-min, fuzz/seeds, fuzz/regressions) included
hermetic:
	$(CARGO) test --workspace

## unit: every test, the real-server ones (the `real-server` cargo feature) included
unit: llama socat tmux
	$(CARGO) test --workspace --all-features

## no-std: the proof that the core needs neither std nor alloc
no-std:
	rustup target list --installed | grep -qx $(DEVICE_TARGET) || rustup target add $(DEVICE_TARGET)
	$(CARGO) build $(NOSTD_CRATES) --target $(DEVICE_TARGET)

## embedded: the no_std path on an emulated Cortex-M3 (embedded/, QEMU lm3s6965evb): the recorded
## tool-call response, SHA-256 and every cap checked on the device, peak stack reported, then
## each image's flash (embedded/sizes.py; docs/benchmarks/embedded.md); installs the target,
## the llvm-tools component and qemu-system-arm (apt) when missing
EMBEDDED_TARGET := thumbv7m-none-eabi
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
embedded:
	rustup target list --installed | grep -qx $(EMBEDDED_TARGET) || rustup target add $(EMBEDDED_TARGET)
	command -v qemu-system-arm >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-arm; }
	cd embedded && $(CARGO) build --release --bins
	cd embedded && timeout 120 $(CARGO) run -q --release --bin check
	rustup component list --installed | grep -q '^llvm-tools' || rustup component add llvm-tools
	cd embedded && ./sizes.py

## llama: fetch, verify, build and cache llama-server and the test model (a no-op once cached)
llama:
	scripts/llama-server.sh all >/dev/null

## up: the whole local stack in the foreground: llama-worker, inferproxy and `loopd serve`
## (FOLDER=dir for read_file); prints the client commands; Ctrl-C stops all three
up:
	scripts/local-stack.sh up $(if $(FOLDER),--folder $(FOLDER))

## fleet-up: HOSTS=2 inference hosts on this box (each llama-worker + router on a core of its own,
## inferproxy, socat forwarders standing in for the SSH tunnel) and a [[host]] loopd config, in
## the foreground; Ctrl-C stops them (scripts/fleet-stack.sh; issue 33's real-process stack)
fleet-up: llama socat
	HOSTS=$(or $(HOSTS),2) scripts/fleet-stack.sh up

## up-check: make up in a real terminal (tmux, an interactive shell), one Ctrl-C once it is up:
## exit 0, a clean-stop line, nothing left, logs removed (scripts/up-check.sh; installs tmux)
up-check: llama
	scripts/up-check.sh

## serve: run the local llama-server router in the foreground
serve: llama
	scripts/serve.sh

## fixtures: record the fixtures again from the local llama-server
fixtures: llama
	scripts/record-fixtures.py

## soak: every test that runs real processes, and make selftest, N times each (N=5; the wedged
## server on unscaled timers once); prints
## the pass count of each (ONLY=<suite> runs one; see scripts/soak.sh)
soak: llama socat tmux
	scripts/soak.sh

## chaos: N agent requests (N=50) of mixed tool use through the real stack while faults are
## injected at random times (SIGKILL/SIGSTOP of the model instance, inferproxy killed and
## restarted, a cancel, a hanging tool, loopd serve killed and started again); SEED= replays a run, LOAD=2 runs two CPU-bound
## processes beside the stack, HOSTS=2 puts a second host behind forwarders and partitions and
## black-holes it too (docs/chaos.md)
chaos: llama socat
	$(if $(N),CHAOS_N=$(N)) $(if $(SEED),CHAOS_SEED=$(SEED)) $(if $(LOAD),CHAOS_LOAD=$(LOAD)) \
	  $(if $(HOSTS),CHAOS_HOSTS=$(HOSTS)) \
	  $(CARGO) test -p loopd --features real-server --test chaos -- --ignored --nocapture

## selftest: the main job: local llama-server under llama-worker, inferproxy, `loopd selftest`
selftest:
	scripts/local-stack.sh selftest

## ask: one request through the same stack, shown as it runs (PROMPT="...", THINKING=1)
ask:
	scripts/local-stack.sh ask $(if $(THINKING),--thinking) "$(or $(PROMPT),Why is the sky blue?)"

## run: one agent request with the built-in tools, submitted through `loopd serve` on the same
## stack and shown live (PROMPT="...", BUDGET=N, THINKING=1, FOLDER=dir for read_file)
run:
	scripts/local-stack.sh run $(if $(BUDGET),--budget $(BUDGET)) $(if $(THINKING),--thinking) \
	  $(if $(FOLDER),--folder $(FOLDER)) "$(or $(PROMPT),What is 17 times 23? Use a tool.)"

## verify-device: selftest and the device tests against UPSTREAM (default straylight:11434);
## needs MODEL EXPECT_SHA256 N_CTX SLOTS, or LOOPD_CONFIG (see scripts/verify-device.sh)
verify-device:
	scripts/verify-device.sh

## verify-local: verify-device against the local router (part of make test)
verify-local: llama
	scripts/local-stack.sh verify

## fuzz: every cargo-fuzz target for FUZZ_SECONDS each, from its working corpus (fuzz/corpus,
## not committed), the committed minimized corpus fuzz/corpus-min/<target> and the seeds in
## fuzz/seeds/<target>; a crash input is also copied to fuzz/regressions/<target>, where the
## replay test in `cargo test` keeps failing on it until it is fixed (commit it with the fix).
## Then `make fuzz-cmin` to refresh the committed corpus (fuzz/README.md)
fuzz: fuzz-tools
	cd fuzz && for t in $$($(CARGO) +nightly fuzz list); do \
	  mkdir -p corpus/$$t seeds/$$t corpus-min/$$t; \
	  $(CARGO) +nightly fuzz run $$t corpus/$$t corpus-min/$$t seeds/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) || { \
	    mkdir -p regressions/$$t; cp artifacts/$$t/* regressions/$$t/; exit 1; }; \
	done

## fuzz-cmin: minimize each target's working corpus (fuzz/corpus/<target>, with the committed
## fuzz/corpus-min/<target> merged in) to the smallest inputs that keep its edge coverage and
## write it back to fuzz/corpus-min/<target>, the corpus every test run replays; run after
## `make fuzz`, then commit fuzz/corpus-min
fuzz-cmin: fuzz-tools
	cd fuzz && for t in $$($(CARGO) +nightly fuzz list); do \
	  mkdir -p corpus/$$t corpus-min/$$t; \
	  cp -n corpus-min/$$t/* corpus/$$t/ 2>/dev/null || true; \
	  $(CARGO) +nightly fuzz cmin $$t corpus/$$t -- -use_counters=0; \
	  rm -rf corpus-min/$$t; cp -r corpus/$$t corpus-min/$$t; \
	done
	du -sh fuzz/corpus-min; find fuzz/corpus-min -type f | wc -l

fuzz-tools:
	command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal

## bench: every benchmark, each against its peer in the same run (figures go into docs/benchmarks.md)
bench: socat
	$(CARGO) bench --workspace

## bench-rpc: the test model local vs through 1 and 2 loopback ggml-rpc-servers, same run
## (llama-bench; P N T R override sizes, threads, repetitions; docs/benchmarks/rpc.md)
bench-rpc: llama
	scripts/bench-rpc.sh

## bench-fleet: aggregate generated tokens/s, 4 concurrent requests, 2 one-core hosts against 1,
## straight to the hosts' inferproxy sockets (the baseline for loopd serve over [[host]]; ROUNDS=7
## MAX_TOKENS=64; scripts/fleet-bench.sh, docs/benchmarks/fleet.md)
bench-fleet: llama socat
	$(if $(ROUNDS),ROUNDS=$(ROUNDS)) $(if $(MAX_TOKENS),MAX_TOKENS=$(MAX_TOKENS)) scripts/fleet-bench.sh

## bench-fleet-loopd: the same through loopd serve over [[host]]: 4 requests at once on a daemon
## of 2 hosts against one of 1, and the prompt-cache hit ratio of 8 sessions x 4 follow-ups,
## affinity against round robin, default --cache-ram and 0 (PART=throughput|cache;
## scripts/fleet-figures.py, docs/benchmarks/fleet.md)
bench-fleet-loopd: llama socat
	scripts/fleet-figures.py $(or $(PART),all)

## bench-e2e: one request direct to llama-server, through inferproxy and through `loopd serve`,
## interleaved (ROUNDS=30 a series, PAIR_ROUNDS= pairs of two clients at once), the server's
## compute subtracted; release builds; prints a table and issue 31's goals (docs/benchmarks/e2e.md)
bench-e2e: llama
	$(CARGO) build --release -p loopd -p inferproxy -p llama-worker -p e2e-bench
	LOOPD_BIN=$(RELEASE)/loopd INFERPROXY_BIN=$(RELEASE)/inferproxy LLAMA_WORKER_BIN=$(RELEASE)/llama-worker \
	  $(if $(ROUNDS),ROUNDS=$(ROUNDS)) $(if $(PAIR_ROUNDS),PAIR_ROUNDS=$(PAIR_ROUNDS)) $(RELEASE)/e2e-bench

RELEASE = $(or $(CARGO_TARGET_DIR),target)/release

## bench-slot-files: a slot's KV saved to a file and restored on the real server, for three
## conversations (about 850, 1,700 and 3,500 tokens): MB/s of each, and a returning
## conversation's request after a restore against its prompt evaluated again (docs/benchmarks.md)
bench-slot-files: llama
	SLOT_FILE_FACTS=30,60,120 $(CARGO) test -p loopd-client --features real-server --test slot_files_real -- --nocapture

## bench-sessions: 8 sessions x 5 turns (a 1,000-token document each) through `loopd serve` on
## 1 host of 2 slots, then 2 hosts: no cache, --cache-ram, sessions' KV saved and restored;
## hit ratio, tokens evaluated, a returning turn's first token (scripts/sessions-bench.py,
## docs/benchmarks.md; SESSIONS TURNS DOC_WORDS MODES TOPOLOGIES override)
bench-sessions: llama socat
	$(CARGO) build --release -p loopd
	LOOPD_BIN=$(RELEASE)/loopd scripts/sessions-bench.py

## tmux: install tmux with apt when missing (loopd chat's terminal test drives it in tmux)
tmux:
	command -v tmux >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux; }

## socat: install socat with apt when missing (the peer of inferproxy's benchmark)
socat:
	command -v socat >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq socat; }
