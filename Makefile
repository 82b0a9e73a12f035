# broca: the two commands a newcomer runs are `make demo` (once it exists) and `make test`.
CARGO ?= cargo

.PHONY: build demo test bench fmt lint check

build:
	$(CARGO) build --release --locked

# One scripted turn end to end: a built-in mock provider on loopback, a temp state root.
demo:
	$(CARGO) run --quiet --locked --bin broca-run -- --demo

# The whole suite: unit, property, crash-cut (real SIGKILLs) and integration tests.
test:
	$(CARGO) test --locked

# Prints `BENCH <name> <value> <unit>` lines; see README "Benchmarks".
bench:
	$(CARGO) build --release --locked --bins
	$(CARGO) run --release --locked --bin broca-bench

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

check: lint test
