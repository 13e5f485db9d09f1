"""What every stage shares: label math, sampling, models and their adapter, prompts, shards, registries, errors.

Imports no stage (``data_gen``, ``heads``, ``pipeline``, ``evaluation``); every stage imports from here.
"""
