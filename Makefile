# Set-up and everyday commands, in the style of diffusers/transformers.
#   make test   create .venv if missing, install gors with its test extra, run the tests
#   make demo   same environment, then GORS in the toy world on the packaged toy model (CPU, offline)
#   make quality  ruff's lint and import order over the package, tests, recipes and speed scripts
#   make bench  every speed script against its reference procedure, one markdown table (CPU, < 15 min)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch is pinned here only for set-up: these wheels lie on the development machines' disk.
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1
DEMO_DIR ?= toy_output
# The tests run with one torch thread each (tests/conftest.py), so one pytest worker per core; a module's
# tests stay on one worker, so that its shared runs are made once, and the longest modules start first
# (tests/conftest.py's LONGEST_MODULES, kept in that order by --no-loadscope-reorder).
TEST_WORKERS ?= 2

.PHONY: install test demo quality bench clean

# A new .venv takes about 6.5 GB (torch's CUDA wheels): said before pip fills the disk halfway.
VENV_GB ?= 7
NO_ROOM := a new $(VENV) needs about $(VENV_GB) GB (torch and its CUDA libraries): free some space, or pass VENV= an existing one
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -c "import shutil, sys; free = shutil.disk_usage('.').free / 2**30; \
		sys.exit(0 if free >= $(VENV_GB) else f'make: {free:.1f} GB free here; $(NO_ROOM)')"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_PINS)
	$(PIP) install --quiet -e ".[test]"
	@touch $@

install: $(VENV)/.installed

# The tests write about 1.5 GB of tiny models and run folders under the temporary folder while they run
# (kept afterwards only for failed tests): said before a full disk fails a hundred tests at once.
TEST_GB ?= 2
test: install
	@$(PY) -c "import shutil, sys, tempfile; where = tempfile.gettempdir(); free = shutil.disk_usage(where).free / 2**30; \
		sys.exit(0 if free >= $(TEST_GB) else f'make: {free:.1f} GB free in {where}; the tests write about 1.5 GB there: ' \
		'free some space, or set TMPDIR to a folder on a disk with room')"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder tests

demo: install
	HF_HUB_OFFLINE=1 $(VENV)/bin/accelerate launch --config_file accelerate_configs/cpu.yaml \
		--main_process_port 0 recipes/gors_toy.py --output_dir $(DEMO_DIR)

bench: install
	$(PY) -m benchmarks --output benchmarks/results.md

quality: install
	$(PIP) install --quiet ruff
	$(VENV)/bin/ruff check gors rewards evaluators tests recipes benchmarks

clean:
	rm -rf $(DEMO_DIR) .pytest_cache
