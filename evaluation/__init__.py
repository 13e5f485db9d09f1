"""The experiment harness: runs every decoding policy of ``decoding`` over a prompt set (``specheads eval``),
simulates them over label traces, times the pair, and writes the report."""
