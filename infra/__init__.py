"""Run infrastructure beside the training loop: the command line, configuration, run folders
and checkpoints, metrics, and the multi-process helper. A reader of the method can skip it."""
