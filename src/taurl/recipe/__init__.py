"""The recipe: the training loop, its state, its config, batch mixing and schedules."""
