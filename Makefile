# The first two targets are the README's first two commands; each sets up what it needs.
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit setup clean

demo: $(STAMP)
	$(VENV)/bin/stagewise serve

test: $(STAMP)
	bash scripts/setup_browser.sh
	$(VENV)/bin/ruff check stagewise tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup_venv.sh
	bash scripts/setup_venv.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
