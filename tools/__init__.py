"""Tools run beside the training loop: credit (does the credit land?), compare (algorithms x seeds),
plots (a run folder as pictures), bench (stage timings), warmstart (the CPU demo's behaviour cloning).
Run each from the repository root as a module: python -m tools.credit --help"""
