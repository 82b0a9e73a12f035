# broca: the two commands a newcomer runs are `make demo` (once it exists) and `make test`.
CARGO ?= cargo

.PHONY: build test bench fmt lint check

build:
	$(CARGO) build --release --locked

# The whole suite: unit, property, crash-cut (real SIGKILLs) and integration tests.
test:
	$(CARGO) test --locked

# Prints `BENCH <name> <value> <unit>` lines; see README "Benchmarks".
bench:
	$(CARGO) run --release --locked --bin broca-bench

fmt:
	$(CARGO) fmt --all

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

check: lint test
