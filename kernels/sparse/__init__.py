"""Sparse attention over per-query key lists: each query names the pool slots it reads
(-1 for none) instead of a contiguous, paged sequence. The MQA attention with a sink that reads
those lists (`sparse_mqa`), the torch helpers that build them from positions and picked
entries (`index_lists`), the indexer's scores that pick entries (`indexer_scores`), and the
pooling of compression windows into entries (`window_pool`)."""
