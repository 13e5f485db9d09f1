"""Scripts that drive the whole pipeline (labels -> training -> export -> evaluation):
``python -m scripts.smoke``."""
