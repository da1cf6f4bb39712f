# `make mutants`: plant each bug of scripts/mutants.py (a curated list at the
# decision points of infra/ and trainer/) in a temporary copy of the tree, run
# the tests that claim that behaviour, and print caught/survived and a score;
# fails below 90 %. Slow (minutes): not part of `make test`.
.PHONY: mutants

mutants: $(STAMP)
	$(PY) scripts/mutants.py $(MUTANTS_ARGS)
