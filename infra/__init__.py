"""The run's services: loading models, run folders and checkpoints, the command line's mechanics,
resuming, metrics a run keeps of itself, trackers and several processes. They import nothing of the
method (tests/test_layers.py holds that) and take plain values, or a run's config: the fields its
config.json records, which infra/checkpoint.py reads and checks. A reader of the method can skip them."""
