# patchgym: `make demo` runs the main job, `make test` the whole suite; both set up everything they need.
VENV := .venv
BIN := $(VENV)/bin
export OMP_NUM_THREADS ?= 1

.PHONY: host install image k8s demo test test-fast lint docs bench learn clean

host:
	bash scripts/setup-host.sh

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[test,lora,vllm,wandb,docs]'
	# vLLM pulls in the PyPI (CUDA) builds of these; they break `import vllm` on the CPU torch and are not needed.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $@

image: host install
	$(BIN)/patchgym image build

demo: image
	$(BIN)/patchgym doctor
	$(BIN)/patchgym smoke --backend docker --backend local
	$(BIN)/patchgym tasks build --packages isodate,toolz --per-package 3 --out runs/demo-tasks
	$(BIN)/patchgym eval --tasks runs/demo-tasks/tasks.jsonl --policy oracle --out runs/demo-oracle
	$(BIN)/patchgym eval --tasks runs/demo-tasks/tasks.jsonl --policy null --out runs/demo-null
	$(BIN)/patchgym demos --tasks runs/demo-tasks/tasks.jsonl --out runs/demo-demos --per-task 2 -c configs/demo.yaml
	$(BIN)/patchgym train -c configs/demo.yaml --out runs/demo-train --resume
	$(BIN)/patchgym report runs/demo-train

# The kubernetes backend's tests start a real single-node cluster; its binaries are built once and cached.
k8s: host
	bash scripts/k8s-cluster.sh build

# The whole suite: the fast tier in two worker processes (it shares nothing between tests), then the sandbox tier
# in one process (its tests count containers, servers and clusters); it fails if either does.
test: image k8s
	$(BIN)/pytest -m "not sandbox" -n 2; fast=$$?; $(BIN)/pytest -m sandbox; sandbox=$$?; \
	test $$fast -eq 0 -a $$sandbox -eq 0

# The fast tier, for your own loop: no sandbox, no server, in two worker processes.
test-fast: install
	$(BIN)/pytest -m "not sandbox" -n 2

# ruff check: the rules in ruff.toml (pyflakes, pycodestyle at 120 columns, import order), across the repository.
lint: install
	$(BIN)/ruff check .

# The documentation site in site/, offline: the CLI and config reference pages are generated first, and --strict
# fails the build on a broken link, a missing page or an API docstring mkdocstrings cannot render.
docs: install
	$(BIN)/python scripts/gen_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: image k8s
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/generation.py
	$(BIN)/python bench/rollout.py
	$(BIN)/python bench/vllm.py
	$(BIN)/python bench/rollout_throughput.py
	$(BIN)/python bench/kube_exec.py
	$(BIN)/python bench/async.py
	$(BIN)/python bench/grading.py --imported
	$(BIN)/python bench/grading.py --pull
	$(BIN)/python bench/attacks.py
	$(BIN)/python bench/learning_game.py

# Does RL make SmolLM2 better at the real SWE tasks it trains on? Warm start, learnable-band filter, GRPO++ epochs
# and a flipped control, measured as paired per-task gains (bench/learning.py). Runs under runs/learn, which a rerun
# resumes; LEARN_ARGS=--quick runs it small, end to end.
learn: image
	$(BIN)/python bench/learning.py --json $(LEARN_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache site docs/reference/cli.md docs/reference/config.md
