"""The replay math of speculative decoding over acceptance traces, without models or output folders.

``decoding.traces`` reads the traces a label folder holds; ``decoding.replay`` turns a stop rule into round lengths,
round lengths into exact expected counts, and finds the oracle (the best round lengths that knowledge of the
acceptance draws allows under a cost model). ``pipeline`` uses it to choose the threshold a stop head is exported
with; ``evaluation.simulate`` replays every policy with the same functions.
"""
