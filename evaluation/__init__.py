"""The experiment harness: runs every decoding policy of ``decoding`` over a prompt set (``python -m evaluation``),
simulates them over label traces, times the pair, and writes the report."""
