# The two commands of the README: `make book` and `make test`.
# Both create .venv with the system's python3 and install the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test test-fast typecheck lint notebooks bench mutants lab clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq -e ".[book,test,notebooks,torch,mpi,hf]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

## book: build the Jupyter Book into _build/html (warnings are errors)
book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going

## test: lint, types, unit tests, notebooks and the browser test of the built book. Each chapter
## runs twice: in full under nbval (every output compared, notebooks/sanitize.cfg) from a folder
## of its own with the built wheel, and as its student version; tests/chapter_runs.py.
## The tests run in JOBS processes (pytest-xdist); tests/conftest.py keeps together the tests
## that share a fixture, so that each such fixture is made once per run
JOBS ?= 2
test: $(STAMP)
	$(BIN)/ruff check xenith_edu tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(JOBS) tests

## test-fast: the components, the model, the exercise checks and the floors, in well under a
## minute: the areas are tests/conftest.py's FAST (the GitHub workflow runs the same command)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --fast tests

## typecheck: mypy on the files listed in pyproject.toml's [tool.mypy]
typecheck: $(STAMP)
	$(BIN)/mypy

lint: $(STAMP)
	$(BIN)/ruff check xenith_edu tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/step.py

## mutants: mutation testing with mutmut, not part of `test` (README, "Mutation testing").
## MODULES="gradcheck data" measures those afresh; MUTANTS_BUDGET is in seconds.
MUTANTS_BUDGET ?= 1800
MODULES ?=
$(VENV)/.mutmut: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install -qq -e ".[dev]"
	touch $@

mutants: $(VENV)/.mutmut
	$(BIN)/python tests/mutants.py --budget $(MUTANTS_BUDGET) $(MODULES)

## lab: JupyterLab on the student notebooks (solutions replaced by stubs) in student/.
## Copies already there are the learner's work and are kept; missing chapters are added.
$(VENV)/.lab: pyproject.toml $(STAMP)
	$(BIN)/python -m pip install -qq -e ".[lab]"
	touch $@

lab: $(VENV)/.lab
	$(BIN)/xenith-edu lab --out student $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _build .pytest_cache
