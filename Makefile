# The two commands of the README: `make book` and `make test`.
# Both create .venv with the system's python3 and install the project into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test lint notebooks bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq -e ".[book,test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

## book: build the Jupyter Book into _build/html (warnings are errors)
book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going

## test: lint, unit tests, notebooks (nbval) and the browser test of the built book
test: $(STAMP)
	$(BIN)/ruff check xenith_edu tests benchmarks
	$(BIN)/python -m pytest --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/sanitize.cfg tests notebooks

lint: $(STAMP)
	$(BIN)/ruff check xenith_edu tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/step.py

clean:
	rm -rf _build .pytest_cache
