"""``specdec bench``: speculative vs plain decoding (and transformers' peer), interleaved, same model."""
