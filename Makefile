# broca: the two commands a newcomer runs are `make demo` (once it exists) and `make test`.
CARGO ?= cargo

.PHONY: build demo test bench-smoke soak fuzz bench bench-capacity e2e mcp-check live conformance conformance-classifier fmt lint check mock-bin

build:
	$(CARGO) build --release --locked

# One scripted turn end to end: a built-in mock provider on loopback, a temp state root.
demo:
	$(CARGO) run --quiet --locked --bin broca-run -- --demo

# The whole suite: unit, property, crash-cut (real SIGKILLs) and integration tests, every
# target even after a failure (--no-fail-fast), then every bench program once in quick mode
# (`bench-smoke`). Cargo's output streams as usual (and is kept in target/tmp/make-test.log);
# then one line of its own, `TESTS passed=<n> failed=<n> ignored=<n> targets=<n>` (every
# `test result:` line summed, bench-smoke one target; scripts/test-summary). A test that cannot
# run here (no nats-server, no root for a tmpfs, no live provider) reports `SKIP <test>: <why>`
# (tests/skip/); they are printed again at the end with their count, `SKIPS <n>`. Exits non-zero
# when anything failed.
SKIPS_LOG = $${CARGO_TARGET_DIR:-target}/tmp/skips.log
TEST_LOG = $${CARGO_TARGET_DIR:-target}/tmp/make-test.log
# Every model request broca-mock receives in the run, checked against its provider's rules
# (mock/wire/src/rules.rs): one line each, summed by scripts/provider-rules-summary.
RULES_LOG = $${CARGO_TARGET_DIR:-target}/tmp/provider-rules.jsonl
test: mock-bin
	@log=$(TEST_LOG); mkdir -p "$$(dirname "$$log")"; rm -f $(SKIPS_LOG) "$$log" $(RULES_LOG) "$$(dirname $(SKIPS_LOG))/reports.log"; \
	rules=$$(cd "$$(dirname $(RULES_LOG))" && pwd)/$$(basename $(RULES_LOG)); export BROCA_MOCK_RULES_LOG="$$rules"; \
	{ $(CARGO) test --locked --no-fail-fast 2>&1; echo $$? >"$$log.cargo"; } | tee "$$log"; \
	{ $(MAKE) --no-print-directory bench-smoke 2>&1; echo $$? >"$$log.bench"; } | tee -a "$$log"; \
	{ scripts/provider-rules-summary "$$rules" 2>&1; echo $$? >"$$log.rules"; } | tee -a "$$log"; \
	scripts/test-summary "$$log" $(SKIPS_LOG) "$$(cat "$$log.cargo")" "$$(cat "$$log.bench")" "$$(cat "$$log.rules")"

# The programs `make bench` runs, in order.
BENCHES = broca-bench fanout-bench send-bench tool-bench refs-bench classify-bench fed-bench archive-bench depth-bench

# Every bench program once, in the dev profile and quick mode (BROCA_BENCH_QUICK=1: a handful of
# rounds; the figures are not judged), so `make bench` cannot break unnoticed (scripts/bench-smoke;
# `make test` runs it), then scripts/bench-targets over their output in its quick mode (every
# target evaluated, none judged). Bounded by BROCA_BENCH_SMOKE_SECS per program (default 300).
bench-smoke: mock-bin
	@CARGO="$(CARGO)" BENCHES="$(BENCHES)" scripts/bench-smoke

# The broca-mock binary the tests run as a process (`broca_mock::exe()`): a package of its own,
# so `cargo test` builds only its library for broca's tests.
mock-bin:
	@$(CARGO) build --locked --quiet -p broca-mock --bin broca-mock

# The crash campaign at full size (`make test` runs 60 kills of it): broca under the real daemon,
# SIGKILLed BROCA_SOAK_KILLS times at random moments and at every named fail point while sessions
# run tool loops with queued, steered and interrupting sends, retracts and cancels; then no call
# ran twice (broca-mock's call log), every intent without a durable result is unknown and its run
# interrupted, every run is terminal, every accepted send is in its transcript once (a retracted
# one never), finished sessions read as they did, cursors are continuous, and every session
# rebuilds from its WAL alone. Bounded by BROCA_SOAK_SECS (default 3 s per kill + 60 s). The
# last line is `SOAK kills=<n> violations=<n> sends=<n> calls=<n>`; the exit status is the test's.
# Then the held-call kill campaign at BROCA_HELD_KILLS rounds (`make test` runs 10): SIGKILLs at
# every held fail point and at random moments while late results are released at random times;
# its line is `HELD-KILLS rounds=<n> ... violations=<n>`.
BROCA_SOAK_KILLS ?= 1000
BROCA_HELD_KILLS ?= 200
# Then the federation move campaign at BROCA_FED_MOVES rounds (`make test` runs 8): sessions moved
# between two daemons under load with SIGKILLs at every export/import step; its line is
# `FED-MOVES rounds=<n> ... violations=<n>`.
BROCA_FED_MOVES ?= 60
# Then the fold crash campaign at BROCA_FOLD_KILLS rounds (`make test` runs 2): a `broca fold`
# or `broca unfold` SIGKILLed at each of its four fail points while sessions are read and sent
# to; its line is `FOLD-KILLS rounds=<n> kills=<n> sends=<n> violations=0`.
BROCA_FOLD_KILLS ?= 25
soak: mock-bin
	@out=$$(mktemp); status=0; \
	BROCA_SOAK_KILLS=$(BROCA_SOAK_KILLS) RUST_LOG=$${RUST_LOG:-error} $(CARGO) test --locked --test crash_tools \
		-- --nocapture --test-threads=1 tool_calls_are_at_most_once_under_real_kills >"$$out" 2>&1 || status=$$?; \
	BROCA_HELD_KILLS=$(BROCA_HELD_KILLS) RUST_LOG=$${RUST_LOG:-error} $(CARGO) test --locked --test e2e_held \
		-- --nocapture >>"$$out" 2>&1 || status=$$?; \
	BROCA_FED_MOVES=$(BROCA_FED_MOVES) $(CARGO) test --locked --test federation -- moves_under_load \
		>>"$$out" 2>&1 || status=$$?; \
	BROCA_FOLD_KILLS=$(BROCA_FOLD_KILLS) $(CARGO) test --locked --test fold -- --nocapture a_fold_killed \
		>>"$$out" 2>&1 || status=$$?; \
	grep -v '^SOAK \|^HELD-KILLS \|^FED-MOVES \|^FOLD-KILLS ' "$$out"; grep '^HELD-KILLS ' "$$out" | tail -n 1; \
	grep '^FED-MOVES ' "$$out" | tail -n 1; grep '^FOLD-KILLS ' "$$out" | tail -n 1; \
	grep '^SOAK ' "$$out" | tail -n 1; rm -f "$$out"; exit $$status

# The structure-aware fuzz targets (tests/fuzz/: frame decoder, connection file, handshake, WAL
# reader, the SSE and event-stream decoders, session.send and the strict ops' params, the move
# ops' params and the archive decoder, the catalog) for
# BROCA_FUZZ_SECS seconds each (`make test` runs them for 2 s), every byte and every cut of the
# golden WALs included. One line per target: `FUZZ <target> ... cases=<n> panics=0 ...`; a
# failing case prints how to replay it (BROCA_FUZZ_SEED, BROCA_FUZZ_CASE).
BROCA_FUZZ_SECS ?= 60
fuzz:
	BROCA_FUZZ_SECS=$(BROCA_FUZZ_SECS) BROCA_FUZZ_SWEEP=full $(CARGO) test --locked --test fuzz -- --nocapture fuzz_

# A real subc daemon supervising broca, with broca-mock as its provider (scripts/rig up), the
# scripted scenario against it through the consumer SDK, and the rig stopped whatever happened
# (scripts/rig down). Exits with the scenario's status; on success the last line is
# `E2E OK <n> checks`.
e2e:
	@set -e; rig=$$(CARGO="$(CARGO)" scripts/rig up); \
	SUBC_CONNECTION_FILE=$$(printf '%s\n' "$$rig" | sed -n 's/^SUBC_CONNECTION_FILE=//p'); \
	BROCA_STATE_ROOT=$$(printf '%s\n' "$$rig" | sed -n 's/^BROCA_STATE_ROOT=//p'); \
	BROCA_MOCK_MODEL=$$(printf '%s\n' "$$rig" | sed -n 's/^BROCA_MOCK_MODEL=//p'); \
	export SUBC_CONNECTION_FILE BROCA_STATE_ROOT BROCA_MOCK_MODEL; \
	trap 'scripts/rig down "$$SUBC_CONNECTION_FILE"' EXIT; trap 'exit 130' INT TERM HUP; \
	set +e; result=$$($(CARGO) run --quiet --locked --example subc-rig-check); status=$$?; \
	trap - EXIT; scripts/rig down "$$SUBC_CONNECTION_FILE"; \
	if [ -n "$$result" ]; then printf '%s\n' "$$result"; fi; exit $$status

# The published llm-runner/v1 conformance suite (cortexkit-role-llm-runner-conformance) against
# the real broca binary under the real subc daemon, broca-mock as scripted model and tool
# provider, kills by real SIGKILLs at broca's fail points (tests/conformance.rs). Failed cases
# with their messages and skipped cases with the capabilities they need go to stderr; the whole
# report to target/tmp/conformance-report.txt. The last line is the suite's own count:
# `CONFORMANCE passed=<n> failed=<n> skipped=<n> not_applicable=<n> real_kills=<n> held_calls=<n> verdict=<v>`,
# after a `DEVIATIONS ...` line sorting the failures against the listed deviations
# (tests/conformance/report.rs). The exit status is the verdict's; with
# BROCA_CONFORMANCE_ACCEPT_DEVIATIONS=1 (CI) a failure of listed deviations alone exits 0.
conformance: mock-bin
	@out=$$(mktemp); status=0; \
	BROCA_CONFORMANCE=1 RUST_LOG=$${RUST_LOG:-error} $(CARGO) test --locked --test conformance >"$$out" || status=$$?; \
	grep -v '^CONFORMANCE ' "$$out"; grep '^CONFORMANCE ' "$$out" | tail -n 1; rm -f "$$out"; exit $$status

# The published classifier/v1 conformance suite (cortexkit-role-classifier-conformance) against
# the real broca binary under the real subc daemon, with broca-mock as the vault and the scope
# authority and its classifier stand-in (in the test process) as both providers, which checks
# the vault's credentials on every call (tests/conformance_classifier.rs). Two passes: a
# catalog with Workers AI's clef alone, then with TypeSafe's Jev too. Failed and not-applicable
# checks with their reasons go to stderr; the whole report to
# target/tmp/conformance-classifier-report.txt. The last line is the suite's own count for the
# full catalog, `CONFORMANCE-CLASSIFIER passed=<n> failed=<n> not_applicable=<n> verdict=<v>`,
# after the clef-only pass's `CONFORMANCE-CLASSIFIER-WORKERS-AI ...`. Non-zero exit on any failure.
conformance-classifier: mock-bin
	@out=$$(mktemp); status=0; \
	BROCA_CONFORMANCE_CLASSIFIER=1 RUST_LOG=$${RUST_LOG:-error} $(CARGO) test --locked --test conformance_classifier >"$$out" || status=$$?; \
	grep -v '^CONFORMANCE-CLASSIFIER' "$$out"; grep '^CONFORMANCE-CLASSIFIER-' "$$out"; \
	grep '^CONFORMANCE-CLASSIFIER ' "$$out" | tail -n 1; rm -f "$$out"; exit $$status

# broca-mcp through the official MCP Python SDK's stdio client (installed into a venv under the
# target directory on first use) against a rig like `e2e`'s. On success the last line is
# `MCP OK <n> checks`; when the SDK cannot be installed, `MCP SKIPPED: <why>` (exit 0).
mcp-check:
	@CARGO="$(CARGO)" scripts/mcp-check

# A two-step tool loop on a real provider in every wire family you have a credential for, through
# your running subc daemon with dev-tools handles (README "Real providers"; `broca doctor` checks
# the credentials first). Skipped (passes, saying so) unless BROCA_LIVE_TESTS=1.
live:
	$(CARGO) test --locked --test live -- --nocapture

# Prints `BENCH <name> <value> <unit>` lines, each program's after a `bench: <program>` line (kept
# in target/tmp/bench.log); see docs/benchmarks.md. Every program runs even when one before it
# failed. Then scripts/bench-targets judges the run against the targets (kept there as data): a
# `BENCH-MISSED <target>: <why>` line per missed target (`absent` when a figure is not in the
# run), and last `BENCH-TARGETS met=<n> missed=<n>`. Exits non-zero when a program failed; a
# missed target is named, not fatal (BROCA_BENCH_TARGETS_STRICT=1 makes it so).
BENCH_LOG = $${CARGO_TARGET_DIR:-target}/tmp/bench.log
bench:
	$(CARGO) build --release --locked --bins
	$(CARGO) build --release --locked -p broca-mock --bin broca-mock
	@log=$(BENCH_LOG); mkdir -p "$$(dirname "$$log")"; : >"$$log"; failed=""; \
	for b in $(BENCHES); do \
		echo "bench: $$b" | tee -a "$$log"; \
		{ $(CARGO) run --release --locked --example $$b; echo $$? >"$$log.status"; } | tee -a "$$log"; \
		[ "$$(cat "$$log.status")" = 0 ] || failed="$$failed $$b"; \
	done; \
	if [ -n "$$failed" ]; then echo "bench: failed:$$failed" >&2; fi; \
	scripts/bench-targets --programs "$(BENCHES)" "$$log"; targets=$$?; \
	if [ -n "$$failed" ]; then exit 1; fi; exit $$targets

# A thousand sessions with runs active at once (one observer each) and a boot over ten thousand
# sessions, through the real daemon (about two minutes; not part of `make bench`).
# Ends with the capacity targets judged as `make bench` judges its own (scripts/bench-targets).
bench-capacity:
	$(CARGO) build --release --locked --bins
	@log=$${CARGO_TARGET_DIR:-target}/tmp/bench-capacity.log; mkdir -p "$$(dirname "$$log")"; \
	echo "bench: capacity-bench" >"$$log"; \
	{ $(CARGO) run --release --locked --example capacity-bench; echo $$? >"$$log.status"; } | tee -a "$$log"; \
	scripts/bench-targets --programs capacity-bench "$$log"; targets=$$?; \
	[ "$$(cat "$$log.status")" = 0 ] || exit 1; exit $$targets

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

check: lint test
