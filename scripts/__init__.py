"""The repository's scripts: `python scripts/demo.py` (`make demo`), the documentation's mkdocs hook
(docs_reference.py) and the shell helpers; a package so that the tests import them as modules."""
