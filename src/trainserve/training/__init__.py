"""Training stage (the train-gpu image): data -> devices -> model -> fit -> export -> CPU gate -> publish."""
