"""The training spine: a trainer, its Hogwild worker processes, and the run report."""
