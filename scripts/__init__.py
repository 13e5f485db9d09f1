"""Scripts that drive the whole pipeline (labels -> training -> export -> evaluation):
``specheads smoke``."""
