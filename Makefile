# stripelog: `make run` and `make test` are the two commands of the quick start.
CARGO ?= cargo
DATA_DIR ?= stripelog-data
MEMBER_SIZE ?= 4GiB
MEMBERS = $(DATA_DIR)/member-0 $(DATA_DIR)/member-1 $(DATA_DIR)/member-2 $(DATA_DIR)/member-3 $(DATA_DIR)/member-4
STRIPELOG = ./target/release/stripelog

.PHONY: run test deps build lint bench clean-data install

deps:
	./scripts/install-deps.sh

build:
	$(CARGO) build --release --workspace

# Create the default volume on first run (five sparse files, RAID-5), then serve it over
# NBD on ./stripelog.sock until Ctrl-C (which flushes and closes it).
SOCKET ?= stripelog.sock
run: deps build
	@if [ ! -e $(DATA_DIR)/member-0 ]; then \
		echo "creating the default volume: RAID-5 on 5 sparse $(MEMBER_SIZE) files in $(DATA_DIR)/"; \
		$(STRIPELOG) create --raid 5 --chunk 1MiB --spare 20% --member-size $(MEMBER_SIZE) $(MEMBERS) >/dev/null; \
	fi
	$(STRIPELOG) serve --socket $(SOCKET) $(MEMBERS)

# rustfmt and clippy come with the toolchain (scripts/install-deps.sh adds them with rustup
# when the toolchain's profile left them out); without them lint fails, it never skips.
lint:
	@$(CARGO) fmt --version >/dev/null 2>&1 || { echo "lint: rustfmt is not installed (rustup component add rustfmt)" >&2; exit 1; }
	@$(CARGO) clippy --version >/dev/null 2>&1 || { echo "lint: clippy is not installed (rustup component add clippy)" >&2; exit 1; }
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Every test: unit, property, the deterministic simulation (500 seeds), integration.
test: deps lint
	$(CARGO) test --workspace

# The engine benchmark of BENCHMARKS.md (writes ~30 GB to $(BENCH_DIR); takes ~1 minute).
BENCH_DIR ?= stripelog-bench
bench: build
	$(STRIPELOG) bench engine --dir $(BENCH_DIR) --members 5 --member-size 8GiB --threads 1,4 --read-threads 1,8 --duration 10s

# The binary, man pages, shell completions, the systemd unit stripelog@.service and an
# example volume configuration (docs/operations.md). PREFIX=/usr/local, SYSCONFDIR=/etc
# and DESTDIR (staging) as usual.
install: build
	./scripts/install.sh $(STRIPELOG)

clean-data:
	rm -rf $(DATA_DIR)
