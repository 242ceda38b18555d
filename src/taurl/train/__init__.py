"""Training: objectives (pure losses, `taurl.train.objectives`), the learner, SFT, checkpoints.

Import the submodules you need; this package imports nothing on its own so that the
learner's modules and the objectives load independently.
"""
